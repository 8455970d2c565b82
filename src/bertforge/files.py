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
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def atomic_write_json(path: str, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


@contextlib.contextmanager
def atomic_dir(path: str) -> Iterator[str]:
    """Yield a temporary folder beside ``path``; on success it replaces ``path`` whole.

    If ``path`` exists it is moved aside first and removed after the rename, so at every instant a complete
    directory exists (under the final name, or under its ``.old`` name during the swap).
    """
    path = os.path.abspath(path)
    parent = os.path.dirname(path)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(path)}.tmp-", dir=parent)
    try:
        yield tmp
        for name in os.listdir(tmp):
            fsync(os.path.join(tmp, name))
        fsync(tmp)
        old = None
        if os.path.exists(path):
            old = tempfile.mkdtemp(prefix=f".{os.path.basename(path)}.old-", dir=parent)
            os.rmdir(old)
            os.rename(path, old)
        os.rename(tmp, path)
        fsync(parent)
        if old:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
