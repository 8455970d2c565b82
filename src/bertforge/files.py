"""Reading user files: UTF-8 text, JSON and JSON lines, with one clear error for each way they go wrong.
Writing is elsewhere: atomic writes in :mod:`bertforge.atomic`, the rules for output folders in
:mod:`bertforge.outputs`."""

from __future__ import annotations

import gzip
import io
import json
from collections.abc import Iterator
from typing import Any

from .errors import UserError, require_file


def decode_utf8(data: bytes, path: str) -> str:
    """``data`` as UTF-8 text (a byte-order mark dropped); invalid UTF-8 names the byte offset and line."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise UserError(f"{path}: invalid UTF-8 at byte {e.start} (line {line}); convert the file to UTF-8 "
                        "first") from None


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
