"""The rules for outputs: a folder bertforge writes carries a marker of its kind, and is never written over
unless it is an earlier output of the same kind (``--overwrite``) or the run it continues (``--resume``);
a lock keeps a second run out; what an interrupted write left beside it is put right."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
from collections.abc import Iterator

from .atomic import atomic_dir, creating, lock_file, missing_folders, path_shown, remove_folders, unlock_file
from .errors import UserError
from .files import json_object_or_none

# Every command that writes a folder writes this marker into it: it is how ``--overwrite`` recognises a folder
# that bertforge wrote (and may replace) from anything else (which it never removes).
MARKER = ".bertforge"


def write_marker(folder: str, kind: str) -> None:
    with open(os.path.join(folder, MARKER), "w", encoding="utf-8") as f:
        json.dump({"kind": kind}, f)
        f.write("\n")


def marker_kind(folder: str) -> str | None:
    """The kind of output bertforge wrote in ``folder`` (None when it is not one of ours)."""
    marker = json_object_or_none(os.path.join(folder, MARKER))
    return None if marker is None else str(marker.get("kind"))


# What each kind of output holds, declared by the command that writes it (:func:`register_output`):
# ``--overwrite`` removes a folder only when it holds nothing else.
MODEL_FILES = frozenset({"config.json", "model.safetensors", "vocab.txt", "tokenizer.json", "tokenizer_config.json",
                         "special_tokens_map.json", MARKER})
OUTPUT_ENTRIES: dict[str, frozenset[str]] = {}


def register_output(kind: str, entries) -> None:
    """Declare the entries an output folder of ``kind`` may hold (its marker is always one of them)."""
    OUTPUT_ENTRIES[kind] = frozenset(entries) | {MARKER}


def _ours(name: str, kind: str) -> bool:
    leftover = name.startswith(".") and any(t in name for t in (".tmp-", ".old-", ".replaced-", ".damaged-"))
    return name in OUTPUT_ENTRIES[kind] or leftover


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
    if os.path.islink(path):
        raise UserError(f"{flag} {path} is a symbolic link; bertforge never writes through one: name the folder "
                        f"itself ({path_shown(os.path.realpath(path))})")
    if not os.path.lexists(path):
        check_creatable(path, flag)
        return False
    if not os.path.isdir(path):
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


def check_creatable(path: str, flag: str) -> None:
    """A new output can be made: its nearest existing parent is a folder (not a file, nor a broken link)."""
    up = os.path.dirname(os.path.abspath(path))
    while not os.path.lexists(up):
        up = os.path.dirname(up)
    if not os.path.isdir(up):
        raise UserError(f"{flag} {path} cannot be created: {up} is not a folder")


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
        earlier = json_object_or_none(path)
        ours = earlier is not None and all(isinstance(v, str) for v in earlier.values())
        if not ours or os.path.islink(path):
            raise UserError(f"--overwrite replaces only a predictions file; {path} is not one")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise UserError(f"{flag} {path}: its folder {parent} does not exist")


def remove_output(path: str, kind: str) -> None:
    """Remove an earlier output of ours (checked again first: never anything else)."""
    if marker_kind(path) != kind:
        raise UserError(f"refusing to remove {path}: it is not a {kind} output that bertforge wrote")
    shutil.rmtree(path)


class Output:
    """One output folder of one ``kind``, the way every command that writes a folder writes it.

    :meth:`check` applies the rule (:func:`check_output`, and never over the run's ``inputs``) before anything is
    read.  Entering takes an advisory lock, so that a second run writing there is refused at once (or, with a
    ``wait`` message, waited for: several processes that need the same prepared corpus); under it what an
    interrupted write left beside the folder is put right (:func:`recover_beside`) and the rule applied again,
    since another process may have written meanwhile: :attr:`replace` then says whether an earlier output of ours
    is to be replaced.  :meth:`atomic` writes the folder whole or not at all.  ``lock=False`` (a torchrun process
    other than rank 0) takes no lock and checks nothing: rank 0 does both.  The lock file lies beside the folder
    (``.NAME.lock``, removed at the end); the operating system releases the lock when the process ends, however it
    ends (a killed run leaves the file, unlocked, for the next)."""

    def __init__(self, path: str, kind: str | None, overwrite: bool = False, resume: bool = False, inputs=(),
                 flag: str = "--out", lock: bool = True, wait: str | None = None):
        self.path, self.kind, self.overwrite, self.resume, self.flag = path, kind, overwrite, resume, flag
        self.inputs, self.lock, self.wait, self.replace = inputs, lock, wait, False
        self.where = os.path.abspath(path)
        self.file = os.path.join(os.path.dirname(self.where), f".{os.path.basename(self.where)}.lock")
        self.fd: int | None = None
        self.made: list[str] = []

    def check(self) -> bool:
        """The rule, before anything is read or written: whether an earlier output of ours is to be replaced."""
        replace = check_output(self.path, self.kind, self.overwrite, self.resume, self.flag)
        if replace:
            check_inputs_outside(self.path, self.inputs, self.flag)
        return replace

    def recover(self) -> None:
        """What an interrupted write left beside the folder put right, under the lock, before a command reads a
        file of it."""
        self._take()
        try:
            recover_beside(self.path)
        finally:
            self._release()

    def __enter__(self) -> Output:
        if self.lock:
            self._take()
            try:
                recover_beside(self.path)
                self.replace = self.check()
            except BaseException:
                self._release()
                raise
        return self

    def __exit__(self, *exc) -> bool:
        self._release()
        return False

    @contextlib.contextmanager
    def atomic(self) -> Iterator[str]:
        """A temporary folder, marked as this output's, renamed into place at the end (an earlier output replaced
        only then): a write that fails leaves no half-written output."""
        with atomic_dir(self.path, replace=self.replace) as tmp:
            write_marker(tmp, self.kind)
            yield tmp

    def _take(self) -> None:
        path = self.where
        self.made = missing_folders(os.path.dirname(self.file))  # removed again when nothing is written
        try:
            with creating(path):
                os.makedirs(os.path.dirname(self.file), exist_ok=True)
                self.fd = lock_file(self.file)
                if self.fd is None and self.wait:  # (preparing a corpus: waited for, saying so)
                    logging.getLogger("bertforge").info(self.wait, path)
                    self.fd = lock_file(self.file, wait=True)
        except UserError:
            remove_folders(self.made)
            raise
        if self.fd is None:
            raise UserError(f"another bertforge run is writing {path}; wait for it to end, or choose another "
                            f"{self.flag}")

    def _release(self) -> None:
        if self.fd is not None:
            unlock_file(self.file, self.fd)
            self.fd = None
            if not os.path.lexists(self.where):  # a run that wrote nothing leaves no folders it made for it
                remove_folders(self.made)


def recover_beside(path: str) -> None:
    """What an interrupted write left beside ``path``: a half-written ``.NAME.tmp-*`` folder is removed; a
    ``.NAME.old-*`` folder (the previous output, moved aside during :func:`atomic_dir`'s swap) is put back when
    ``path`` is missing, else removed; a ``.NAME.replaced-*`` folder (the output a training run replaces, kept
    aside until its first checkpoint) is put back unless the run in ``path`` got as far as a checkpoint or its
    end.  Call only while holding the output's lock."""
    path = os.path.abspath(path)
    parent, name = os.path.dirname(path), os.path.basename(path)
    if not os.path.isdir(parent):
        return
    for entry in sorted(os.listdir(parent)):
        p = os.path.join(parent, entry)
        if entry.startswith(f".{name}.replaced-") and os.path.isdir(p) and not _went_on(path):
            shutil.rmtree(path, ignore_errors=True)  # a run killed before its first checkpoint: nothing to keep
            if os.path.lexists(path):  # (could not be cleared: the earlier output stays aside, untouched)
                continue
        if entry.startswith((f".{name}.old-", f".{name}.replaced-")) and os.path.isdir(p):
            if not os.path.exists(path):
                os.rename(p, path)
            else:
                shutil.rmtree(p, ignore_errors=True)
        elif entry.startswith(f".{name}.tmp-") and os.path.isdir(p):
            shutil.rmtree(p, ignore_errors=True)


def _went_on(run: str) -> bool:
    """Whether the training run in ``run`` has a checkpoint or has finished (what a replaced output gives way to)."""
    found = os.listdir(os.path.join(run, "checkpoints")) if os.path.isdir(os.path.join(run, "checkpoints")) else []
    return os.path.isfile(os.path.join(run, "metrics.json")) or any(n.startswith("step-") for n in found)
