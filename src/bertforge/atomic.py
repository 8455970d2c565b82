"""Atomic writes: a temporary file or folder renamed into place, so that a crash, even a power loss, never
leaves a half-written file or directory under the final name; and the test hook that kills a save at each
of its steps."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

from .errors import UserError, shown

# What a failed write reports, whatever was being written: a full disk, a file-size limit (``ulimit -f``, with
# SIGXFSZ ignored), a quota, a read-only file system.  Creating a folder may fail in more ways (see creating()).
WRITE_ERRNOS = frozenset({errno.ENOSPC, errno.EFBIG, errno.EDQUOT, errno.EROFS})


def write_error(path: str, e: OSError | int, what: str = "", hint: str = "") -> UserError:
    """The one message of a failed write: the output it was for (not a temporary name) and the cause."""
    cause = os.strerror(e) if isinstance(e, int) else (e.strerror or str(e))
    return UserError(f"cannot write {what + ' ' if what else ''}{path_shown(path)}: {cause}"
                     f"{'; ' + hint if hint else ''}")


def path_shown(path) -> str:
    """A path for a message: whole, as given (the user must recognise it), unless it would break the line."""
    p = os.fspath(path)
    return p if p.isprintable() and len(p) <= 4096 else shown(p)


def write_failure(e: BaseException) -> int | None:
    """The errno of ``e`` when it is a failed write (:data:`WRITE_ERRNOS`), else None.  Every writer of ours
    writes to a file that Python opened (:func:`write_file`), so a failed write is an OSError with its errno,
    whichever library serialised the data."""
    return e.errno if isinstance(e, OSError) and e.errno in WRITE_ERRNOS else None


def write_file(path: str, save) -> None:
    """``save(f)`` into ``path``, opened here: torch.save and the serialisers written in Rust (safetensors,
    tokenizers) report a failed write of a file they open themselves only in their message.  Here every write
    goes through :class:`_Watched`, and the OSError of one that failed is what is raised, whatever the
    serialiser made of it (torch.save turns it into a RuntimeError)."""
    with open(path, "wb") as f:
        watched = _Watched(f)
        try:
            save(watched)
        except Exception:
            if watched.error is not None:
                raise watched.error from None
            raise


class _Watched:
    """A file's ``write`` and ``flush``, keeping the OSError of a failed one."""

    def __init__(self, f):
        self.f, self.error, self.name = f, None, f.name

    def write(self, data) -> int:
        try:
            return self.f.write(data)
        except OSError as e:
            self.error = e
            raise

    def flush(self) -> None:
        self.f.flush()


@contextlib.contextmanager
def writing(path: str, what: str = "", hint: str = "", creating: bool = False) -> Iterator[None]:
    """A write failure (:func:`write_failure`) inside the block becomes one UserError naming ``path`` (``what`` it
    is, and a ``hint``); what the block had written is cleaned up by the context managers inside it
    (:func:`atomic_dir`, ...).  ``creating``: any OSError (making a folder: a parent that is a file, no
    permission...), not only a failed write."""
    try:
        yield
    except Exception as e:
        code = e.errno if creating and isinstance(e, OSError) else write_failure(e)
        if code is None:
            raise
        raise write_error(path, code, what, hint) from None


def creating(path: str):
    """:func:`writing` for making ``path``'s folder or its parents: any failure is one UserError naming it."""
    return writing(path, creating=True)


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


def atomic_write_text(path: str, text: str, faults: bool = True) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same folder, then rename.  ``faults``: a
    point of :func:`fault_point` (the saves of a training run; not a prepared corpus's files)."""
    d = os.path.dirname(os.path.abspath(path))
    with creating(path):
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=d)
    try:
        os.fchmod(fd, 0o666 & ~current_umask())  # mkstemp makes it private; outputs follow the umask
        with writing(path), os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        if faults:
            fault_point("write", path)
        os.replace(tmp, path)
        if faults:
            fault_point("rename", path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def atomic_write_json(path: str, obj: Any, faults: bool = True) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n", faults)


@contextlib.contextmanager
def atomic_dir(path: str, replace: bool = True) -> Iterator[str]:
    """Yield a temporary folder beside ``path``; on success it replaces ``path`` whole.

    If ``path`` exists (and ``replace``) it is moved aside first and removed after the rename, so at every
    instant a complete directory exists (under the final name, or under its ``.old`` name during the swap).
    Without ``replace``, a non-empty ``path`` that appeared meanwhile is left alone and the write fails.
    """
    given, path = path, os.path.abspath(path)  # errors name the path as the user gave it
    parent = os.path.dirname(path)
    made, tmp, old = missing_folders(parent), None, None
    try:
        with creating(given):
            os.makedirs(parent, exist_ok=True)
            tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(path)}.tmp-", dir=parent)
            os.chmod(tmp, 0o777 & ~current_umask())  # mkdtemp makes it private; outputs follow the umask
        yield tmp
        for name in os.listdir(tmp):
            follow_umask(os.path.join(tmp, name))
            fsync(os.path.join(tmp, name))
        fsync(tmp)
        if os.path.lexists(path) and not replace and (not os.path.isdir(path) or os.listdir(path)):
            raise UserError(f"{path} appeared while this run was writing it; the new output is not written")
        if os.path.lexists(path):  # a dangling link too: it is replaced, not left beside
            old = tempfile.mkdtemp(prefix=f".{os.path.basename(path)}.old-", dir=parent)
            os.rmdir(old)
            os.rename(path, old)
            fault_point("aside", path)
        os.rename(tmp, path)
        fsync(parent)
        fault_point("rename", path)
        if old:
            remove_path(old)
    except BaseException as e:
        code = write_failure(e)
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
        if old and not os.path.lexists(path):  # the swap failed halfway: the earlier output goes back
            with contextlib.suppress(OSError):
                os.rename(old, path)
        remove_folders(made)
        if code is not None:
            raise write_error(given, code) from None
        raise


def lock_file(path: str, wait: bool = False) -> int | None:
    """Open ``path`` (made if missing) and take its exclusive advisory lock; return the descriptor, or None when
    another process holds it and not ``wait``.  The lock is on the file that is at ``path`` now: one that its
    holder removed meanwhile (:func:`unlock_file`) is let go and the new one locked, so two processes never
    both hold it.  The operating system releases the lock of a process that ends, however it ends."""
    import fcntl

    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
            if os.path.samestat(os.fstat(fd), os.stat(path)):
                return fd
        except OSError as e:
            os.close(fd)
            if isinstance(e, FileNotFoundError):  # removed by its holder since it was opened
                continue
            if not wait and e.errno in (errno.EAGAIN, errno.EACCES):
                return None
            raise
        os.close(fd)


def unlock_file(path: str, fd: int) -> None:
    """Remove the lock file ``path`` while still holding it (no lock file is left behind), then let it go."""
    import fcntl

    with contextlib.suppress(OSError):
        os.unlink(path)
    fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)


def remove_path(p: str) -> None:
    """Remove a file, a link (not what it points to) or a folder tree; best effort."""
    if os.path.isdir(p) and not os.path.islink(p):
        shutil.rmtree(p, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            os.unlink(p)


def missing_folders(folder: str) -> list[str]:
    """The folders that creating ``folder`` would make, deepest first (to remove again if the write fails)."""
    made, folder = [], os.path.abspath(folder)
    while not os.path.lexists(folder) and os.path.dirname(folder) != folder:
        made.append(folder)
        folder = os.path.dirname(folder)
    return made


def remove_folders(folders: list[str]) -> None:
    """Remove the folders of :func:`missing_folders` that are still empty, deepest first."""
    for f in folders:
        with contextlib.suppress(OSError):
            os.rmdir(f)


def fault_point(event: str, name: str) -> None:
    """Test hook: ``BERTFORGE_FAULT=EVENT:NAME[:N]`` kills this process (SIGKILL, as a power loss would) at the
    N-th (by default the first) point ``EVENT`` of a save whose ``name`` ends with the path NAME (a glob per
    component), so that tests can check that every instant of a save is recoverable.  The points: ``write``
    once a file is complete in its temporary place (named by its final path; a model folder saved in place is
    one write, named by the folder), ``rename`` once a file or folder is renamed into place, ``aside`` once a
    folder to be replaced is moved aside, ``shard`` once a prepared shard is complete (its folder)."""
    spec = os.environ.get("BERTFORGE_FAULT")
    if not spec:
        return
    kind, _, rest = spec.partition(":")
    pattern, _, n = rest.partition(":")
    if kind != event or not _tail_matches(name, pattern):
        return
    _FAULT_COUNTS[spec] = _FAULT_COUNTS.get(spec, 0) + 1
    if _FAULT_COUNTS[spec] == int(n or 1):
        import signal

        os.kill(os.getpid(), signal.SIGKILL)


def _tail_matches(path: str, pattern: str) -> bool:
    """Whether ``path``'s last components match ``pattern``'s, one glob per component."""
    import fnmatch

    want, have = pattern.strip("/").split("/"), os.path.normpath(path).split(os.sep)
    return len(have) >= len(want) and all(fnmatch.fnmatchcase(h, w) for h, w in zip(have[-len(want):], want))


_FAULT_COUNTS: dict[str, int] = {}


def remove_stale_temporaries(folder: str) -> list[str]:
    """Remove what an interrupted atomic write left in ``folder`` (``.tmp-*`` files, ``.*.tmp-*`` and
    ``.*.old-*`` folders, ``.save-tmp-*``); call only while holding the folder's lock."""
    removed = []
    if not os.path.isdir(folder):
        return removed
    for name in os.listdir(folder):
        if name.startswith((".tmp-", ".save-tmp-")) or (name.startswith(".") and (".tmp-" in name or ".old-" in name)):
            remove_path(os.path.join(folder, name))
            removed.append(os.path.join(folder, name))
    return removed
