"""Atomic writes: a temporary file or folder renamed into place, so that a crash, even a power loss, never
leaves a half-written file or directory under the final name; and the test hook that kills a save at each
of its steps."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

from .errors import UserError


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
