"""Files in and out: reading user files (UTF-8 text, JSON and JSON lines, with one clear error for each way
they go wrong) and writing outputs atomically (a temporary file or folder renamed into place, so that a
crash, even a power loss, never leaves a half-written file or directory under the final name)."""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

from .errors import UserError, require_file


def decode_utf8(data: bytes, path: str) -> str:
    """``data`` as UTF-8 text (a byte-order mark dropped); invalid UTF-8 names the byte offset and line."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise UserError(f"{path}: invalid UTF-8 at byte {e.start} (line {line}); convert the file to UTF-8 first") from None


def read_text(path: str, what: str = "file") -> str:
    """A whole text file (``.gz`` decompressed) as UTF-8."""
    require_file(path, what)
    try:
        if path.endswith(".gz"):
            with gzip.open(path, "rb") as f:
                data = f.read()
        else:
            with open(path, "rb") as f:
                data = f.read()
    except (OSError, EOFError) as e:
        raise UserError(f"cannot read {path}: {e}") from None
    return decode_utf8(data, path)


def json_lines(text: str, path: str) -> Iterator[tuple[int, dict]]:
    """(line number, object) for each non-blank line; a line that is not a JSON object names the file and line."""
    for lineno, line in enumerate(io.StringIO(text), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise UserError(f"{path}:{lineno}: not valid JSON ({e.msg})") from None
        if not isinstance(obj, dict):
            raise UserError(f"{path}:{lineno}: expected a JSON object")
        yield lineno, obj


def read_json(path: str, what: str = "JSON file") -> Any:
    """A JSON file; malformed JSON names the line and column."""
    text = read_text(path, what)
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise UserError(f"{path}: malformed JSON at line {e.lineno} column {e.colno} ({e.msg})") from None


def read_json_object(path: str, what: str = "JSON file") -> dict:
    """A JSON file that must hold an object (a config, a tokenizer's settings)."""
    d = read_json(path, what)
    if not isinstance(d, dict):
        raise UserError(f"{path} is not a JSON object")
    return d


# ------------------------------------------------------------------------------------------------ atomic writes
def current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def follow_umask(path: str) -> None:
    """Give a file the mode the umask asks for (some writers, safetensors' among them, make them private)."""
    if os.path.isfile(path) and not os.path.islink(path):
        os.chmod(path, 0o666 & ~current_umask())


def fsync(path: str) -> None:
    """Flush a file or a folder (its entries) to disk; best effort."""
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def atomic_write_text(path: str, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same folder, then rename."""
    d = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=d)
    os.fchmod(fd, 0o666 & ~current_umask())  # mkstemp makes it private; outputs follow the umask
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        fault_point("write")
        os.replace(tmp, path)
        fault_point("rename")
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def atomic_write_json(path: str, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


@contextlib.contextmanager
def atomic_dir(path: str, replace: bool = True) -> Iterator[str]:
    """Yield a temporary folder beside ``path``; on success it replaces ``path`` whole.

    If ``path`` exists (and ``replace``) it is moved aside first and removed after the rename, so at every
    instant a complete directory exists (under the final name, or under its ``.old`` name during the swap).
    Without ``replace``, a non-empty ``path`` that appeared meanwhile is left alone and the write fails.
    """
    path = os.path.abspath(path)
    parent = os.path.dirname(path)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(path)}.tmp-", dir=parent)
    os.chmod(tmp, 0o777 & ~current_umask())  # mkdtemp makes it private; outputs follow the umask
    try:
        yield tmp
        for name in os.listdir(tmp):
            follow_umask(os.path.join(tmp, name))
            fsync(os.path.join(tmp, name))
        fsync(tmp)
        old = None
        if os.path.exists(path) and not replace and (not os.path.isdir(path) or os.listdir(path)):
            raise UserError(f"{path} appeared while this run was writing it; the new output is not written")
        if os.path.exists(path):
            old = tempfile.mkdtemp(prefix=f".{os.path.basename(path)}.old-", dir=parent)
            os.rmdir(old)
            os.rename(path, old)
            fault_point("rename")
        os.rename(tmp, path)
        fsync(parent)
        fault_point("rename")
        if old:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


# ------------------------------------------------------------------------------------------------ outputs
# Every command that writes a folder writes this marker into it: it is how ``--overwrite`` recognises a folder
# that bertforge wrote (and may replace) from anything else (which it never removes).
MARKER = ".bertforge"


def write_marker(folder: str, kind: str) -> None:
    with open(os.path.join(folder, MARKER), "w", encoding="utf-8") as f:
        json.dump({"kind": kind}, f)
        f.write("\n")


# outputs written before the marker existed, recognised by their own files
_EARLIER_OUTPUTS = {"pretrain_config.json": "pretrain", "finetune_config.json": "finetune", ".bertforge-demo": "demo"}


def marker_kind(folder: str) -> str | None:
    """The kind of output bertforge wrote in ``folder`` (None when it is not one of ours)."""
    try:
        with open(os.path.join(folder, MARKER), encoding="utf-8") as f:
            return str(json.load(f).get("kind"))
    except (OSError, ValueError, AttributeError):
        pass
    for name, kind in _EARLIER_OUTPUTS.items():
        if os.path.isfile(os.path.join(folder, name)):
            return kind
    return None


def fault_point(event: str) -> None:
    """Test hook: ``BERTFORGE_FAULT=EVENT:N`` kills this process (SIGKILL, as a power loss would) at the N-th
    ``write`` or ``rename`` of a save, so that tests can check that every instant of a save is recoverable."""
    spec = os.environ.get("BERTFORGE_FAULT")
    if not spec:
        return
    kind, _, n = spec.partition(":")
    if kind != event:
        return
    _FAULT_COUNTS[event] = _FAULT_COUNTS.get(event, 0) + 1
    if _FAULT_COUNTS[event] == int(n):
        import signal

        os.kill(os.getpid(), signal.SIGKILL)


_FAULT_COUNTS: dict[str, int] = {}


# what each kind of output holds: ``--overwrite`` removes a folder only when it holds nothing else
_MODEL_FILES = {"config.json", "model.safetensors", "vocab.txt", "tokenizer.json", "tokenizer_config.json",
                "special_tokens_map.json", MARKER}
OUTPUT_ENTRIES = {
    "tokenizer": _MODEL_FILES - {"config.json", "model.safetensors"},
    "pretrain": _MODEL_FILES | {"pretrain_config.json", "metrics.jsonl", "metrics.json", "train.log", "plots", "checkpoints",
                                "tensorboard", "generator", "README.md"},
    "finetune": _MODEL_FILES | {"finetune_config.json", "metrics.jsonl", "metrics.json", "train.log", "plots", "tensorboard",
                                "predictions.json", "predictions.jsonl", "README.md", "checkpoints"},
    "demo": {MARKER, ".bertforge-demo", "data", "cache", "pretrained", "scratch-init", "sentiment-pretrained",
             "sentiment-scratch", "pretrained-mlm", "summary.json", "metrics.json", "samples.json", "report.md", "report.html", "results.png"},
}


def _ours(name: str, kind: str) -> bool:
    return name in OUTPUT_ENTRIES[kind] or (name.startswith(".") and any(t in name for t in (".tmp-", ".old-", ".damaged-")))


def check_inputs_outside(out: str, inputs: list, flag: str = "--out") -> None:
    """Refuse an output folder that holds one of the run's inputs (replacing it would delete them)."""
    root = os.path.realpath(out)
    for p in inputs:
        if p and not str(p).startswith("hf:"):
            real = os.path.realpath(p)
            if real == root or real.startswith(root + os.sep):
                raise UserError(f"{flag} {out} holds the input {p}; write the output somewhere else")


def check_output(path: str, kind: str, overwrite: bool = False, resume: bool = False, flag: str = "--out") -> bool:
    """The one rule for outputs, applied before anything is read or written.

    A new or empty ``path`` is fine.  An existing non-empty one is refused, unless ``resume`` (a run
    continuing in its own folder) or ``overwrite`` and it is a folder bertforge wrote as ``kind`` (its
    marker says so); nothing else is ever replaced or removed.  Returns True when an existing output of ours
    is to be replaced.
    """
    if not path or not path.strip():
        raise UserError(f"{flag} must name a folder")
    if not os.path.lexists(path):
        return False
    if not os.path.isdir(path) or os.path.islink(path):
        raise UserError(f"{flag} {path} exists and is not a folder; bertforge never replaces it")
    if not os.listdir(path):
        return False
    found = marker_kind(path)
    if resume:
        if found not in (kind, None):
            raise UserError(f"{flag} {path} holds a bertforge {found} output, not a {kind} run to resume")
        return False
    if not overwrite:
        what = f"an earlier bertforge {found} output" if found else "files"
        hint = "pass --overwrite to replace it, or choose" if found == kind else "choose"
        raise UserError(f"{flag} {path} already exists and holds {what}; {hint} another {flag}")
    if found != kind:
        what = f"a bertforge {found} output" if found else "not a folder that bertforge wrote"
        raise UserError(f"--overwrite replaces only a {kind} output that bertforge wrote; {path} is {what}")
    others = sorted(n for n in os.listdir(path) if not _ours(n, kind))
    if others:
        more = f" and {len(others) - 3} more" if len(others) > 3 else ""
        raise UserError(f"{path} also holds files bertforge did not write ({', '.join(others[:3])}{more}); "
                        "--overwrite would delete them: move them out first")
    return True


def check_output_file(path: str, overwrite: bool, flag: str, inputs: tuple = ()) -> None:
    """A predictions file: refused when it exists, unless ``overwrite`` and it is a predictions file (a JSON
    object of strings, as bertforge writes them); never one of the run's ``inputs``."""
    if not path or not path.strip():
        raise UserError(f"{flag} must name a file")
    if os.path.isdir(path):
        raise UserError(f"{flag} {path} is a folder; name a file")
    if os.path.exists(path) and any(p and os.path.exists(p) and os.path.samefile(p, path) for p in inputs):
        raise UserError(f"{flag} {path} is one of the inputs; write the predictions somewhere else")
    if os.path.lexists(path) and not overwrite:
        raise UserError(f"{flag} {path} already exists; pass --overwrite to replace it, or choose another file")
    if os.path.lexists(path):
        try:
            with open(path, encoding="utf-8") as f:
                earlier = json.load(f)
            ours = isinstance(earlier, dict) and all(isinstance(v, str) for v in earlier.values())
        except (OSError, ValueError):
            ours = False
        if not ours or os.path.islink(path):
            raise UserError(f"--overwrite replaces only a predictions file; {path} is not one")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise UserError(f"{flag} {path}: its folder {parent} does not exist")


def remove_output(path: str, kind: str) -> None:
    """Remove an earlier output of ours (checked again here: never anything else)."""
    if marker_kind(path) != kind:
        raise UserError(f"refusing to remove {path}: it is not a {kind} output that bertforge wrote")
    shutil.rmtree(path)


class OutputLock:
    """An advisory lock on an output folder, so that a second run writing there is refused at once.  The
    lock file lies beside the folder (``.NAME.lock``, removed at the end); the operating system releases the
    lock when the process ends, however it ends (a killed run leaves the file, unlocked, for the next)."""

    def __init__(self, path: str, enabled: bool = True):
        path = os.path.abspath(path)
        self.file = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.lock")
        self.path, self.enabled, self.fd = path, enabled, None

    def __enter__(self):
        if not self.enabled:
            return self
        import fcntl

        os.makedirs(os.path.dirname(self.file), exist_ok=True)
        self.fd = os.open(self.file, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(self.fd)
            self.fd = None
            raise UserError(f"another bertforge run is writing {self.path}; wait for it to end, or choose another --out") from None
        return self

    def __exit__(self, *exc):
        if self.fd is not None:
            import fcntl

            with contextlib.suppress(OSError):  # removed while still held: no lock file is left behind
                os.unlink(self.file)
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None
        return False


def recover_beside(path: str) -> None:
    """What an interrupted :func:`atomic_dir` left beside ``path``: a half-written ``.NAME.tmp-*`` folder is
    removed; a ``.NAME.old-*`` folder (the previous output, moved aside during the swap) is put back when
    ``path`` is missing, else removed.  Call only while holding the output's lock."""
    path = os.path.abspath(path)
    parent, name = os.path.dirname(path), os.path.basename(path)
    if not os.path.isdir(parent):
        return
    for entry in sorted(os.listdir(parent)):
        p = os.path.join(parent, entry)
        if entry.startswith(f".{name}.old-") and os.path.isdir(p):
            if not os.path.exists(path):
                os.rename(p, path)
            else:
                shutil.rmtree(p, ignore_errors=True)
        elif entry.startswith(f".{name}.tmp-") and os.path.isdir(p):
            shutil.rmtree(p, ignore_errors=True)


def remove_stale_temporaries(folder: str) -> list[str]:
    """Remove what an interrupted atomic write left in ``folder`` (``.tmp-*`` files, ``.*.tmp-*`` and
    ``.*.old-*`` folders, ``.save-tmp-*``); call only while holding the folder's lock."""
    removed = []
    if not os.path.isdir(folder):
        return removed
    for name in os.listdir(folder):
        if name.startswith((".tmp-", ".save-tmp-")) or (name.startswith(".") and (".tmp-" in name or ".old-" in name)):
            p = os.path.join(folder, name)
            if os.path.isdir(p) and not os.path.islink(p):
                shutil.rmtree(p, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    os.unlink(p)
            removed.append(p)
    return removed
