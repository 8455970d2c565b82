"""Reading user files: UTF-8 text (whole, or streamed line by line in blocks), JSON and JSON lines, with one clear
error for each way they go wrong.
Writing is elsewhere: atomic writes in :mod:`bertforge.atomic`, the rules for output folders in
:mod:`bertforge.outputs`."""

from __future__ import annotations

import csv
import gzip
import json
import logging
import re
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from .errors import UserError, require_file

log = logging.getLogger("bertforge")

# a table's field is read whatever its length (a whole review, a chapter): csv's default limit, 131,072
# characters, ended reading such a file with _csv.Error (every table reader of the tasks uses csv)
csv.field_size_limit(2**31 - 1)

READ_BYTES = 1 << 20  # a reader holds one block: its memory stays the same whatever the file's size


def lines_of(text: str) -> list[str]:
    """The lines of a text file's contents, split at line ends only (``\n``, ``\r\n``): ``str.splitlines`` also
    splits at U+2028, U+0085, form feeds and the other separators, which a token or a text may hold."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def read_text(path: str, what: str = "file") -> str:
    """A whole text file (``.gz`` decompressed) as UTF-8."""
    require_file(path, what)
    try:
        if path.lower().endswith(".gz"):
            with gzip.open(path, "rb") as f:
                data = f.read()
        else:
            with open(path, "rb") as f:
                data = f.read()
    except (OSError, EOFError) as e:
        raise UserError(f"cannot read {path}: {e}") from None
    return _decoded(data, path, 0, 0, 0)


_LONE = re.compile("[\ud800-\udfff]")  # (a surrogate alone in a str: a valid pair is decoded to one character)


def _repaired(obj: Any) -> tuple[Any, bool]:
    """``obj`` with every lone surrogate in its strings replaced by U+FFFD, and whether there was one."""
    if isinstance(obj, str):
        fixed = _LONE.sub("\ufffd", obj)
        return fixed, fixed != obj
    if isinstance(obj, list):
        pairs = [_repaired(v) for v in obj]
        return [v for v, _ in pairs], any(c for _, c in pairs)
    if isinstance(obj, dict):
        pairs = {k: _repaired(v) for k, v in obj.items()}
        return {k: v for k, (v, _) in pairs.items()}, any(c for _, c in pairs.values())
    return obj, False


def _loads(text: str, where: Callable[[], str]) -> Any:
    """``json.loads``, with a lone surrogate escape (``"\\ud83d"``: a text cut inside an emoji) read as U+FFFD and
    warned about naming ``where()``: no string that UTF-8 cannot encode reaches the tokenizer."""
    try:
        obj = json.loads(text)
    except RecursionError:  # (arrays nested thousands deep)
        raise json.JSONDecodeError("nested too deeply", text, 0) from None
    except ValueError as e:  # (an integer of more digits than Python converts)
        if isinstance(e, json.JSONDecodeError):
            raise
        raise json.JSONDecodeError(str(e).split(":")[0], text, 0) from None
    if "\\u" not in text:  # (a surrogate only comes from an escape: the text itself is valid UTF-8)
        return obj
    obj, changed = _repaired(obj)
    if changed:
        log.warning("%s: a lone surrogate escape (half of a character, such as an emoji cut in two) was read as "
                    "U+FFFD", where())
    return obj


def command_line_text(value: Any, name: str) -> Any:
    """A text (or texts) given on the command line, with bytes that are not UTF-8 (which Python keeps as lone
    surrogates) read as U+FFFD and warned about; the tokenizer could not encode them."""
    fixed, changed = _repaired(value)
    if changed:
        log.warning("the command line's %s holds bytes that are not UTF-8 (another encoding's?): read as U+FFFD", name)
    return fixed


def json_lines(lines: Iterable[str], path: str, before: Callable[[], int] = lambda: 0) -> Iterator[tuple[int, dict]]:
    """(line number among ``lines``, object) for each non-blank line; a line that is not a JSON object names the
    file and its line there (``before()``: the lines that precede ``lines`` in the file, counted only then)."""
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = _loads(line, lambda: f"{path}:{lineno + before()}")
            problem = None if isinstance(obj, dict) else "expected a JSON object"
        except json.JSONDecodeError as e:
            problem = f"not valid JSON ({e.msg})"
        if problem:
            raise UserError(f"{path}:{lineno + before()}: {problem}")
        yield lineno, obj


def text_lines(path: str, start: int = 0, end: int | None = None, seen=None) -> Iterator[str]:
    """The lines (each with its line feed) of bytes ``[start, end)``, decoded as UTF-8 block by block; a byte-order
    mark at the file's start is dropped; invalid UTF-8 names its byte offset and line in the file."""
    opener = gzip.open if path.lower().endswith(".gz") else open
    offset, newlines, carry = start, 0, b""
    try:
        with opener(path, "rb") as f:
            if start:
                f.seek(start)
            while True:
                size = READ_BYTES if end is None else min(READ_BYTES, end - offset)
                block = f.read(size) if size > 0 else b""
                if seen and block:
                    seen(block)
                data = carry + block
                cut = len(data) if not block else data.rfind(b"\n") + 1
                if cut:
                    text = _decoded(data[:cut], path, offset - len(carry), newlines, start)
                    parts = text.split("\n")  # on line feeds only, as the whole-file readers split
                    yield from (p + "\n" for p in parts[:-1])
                    if parts[-1]:
                        yield parts[-1]
                    newlines += data.count(b"\n", 0, cut)
                carry = data[cut:]
                offset += len(block)
                if not block:
                    return
    except (OSError, EOFError) as e:
        raise UserError(f"cannot read {path}: {e}") from None


def _decoded(data: bytes, path: str, at: int, newlines: int, start: int) -> str:
    try:
        return data.decode("utf-8-sig" if at == 0 else "utf-8")
    except UnicodeDecodeError as e:
        line = newlines + data.count(b"\n", 0, e.start) + 1 + (newlines_before(path, start) if start else 0)
        raise UserError(f"{path}: invalid UTF-8 at byte {at + e.start} (line {line}); convert the file to UTF-8 "
                        "first") from None


def newlines_before(path: str, start: int) -> int:
    """The line breaks in the first ``start`` bytes of a plain file (to name a line in an error)."""
    n, done = 0, 0
    with open(path, "rb") as f:
        while done < start:
            block = f.read(min(READ_BYTES, start - done))
            if not block:
                break
            n, done = n + block.count(b"\n"), done + len(block)
    return n


def read_json(path: str, what: str = "JSON file") -> Any:
    """A JSON file; malformed JSON names the line and column."""
    text = read_text(path, what)
    try:
        return _loads(text, lambda: path)
    except json.JSONDecodeError as e:
        raise UserError(f"{path}: malformed JSON at line {e.lineno} column {e.colno} ({e.msg})") from None


def read_json_object(path: str, what: str = "JSON file") -> dict:
    """A JSON file that must hold an object (a config, a tokenizer's settings)."""
    d = read_json(path, what)
    if not isinstance(d, dict):
        raise UserError(f"{path} is not a JSON object")
    return d


def json_object_or_none(path: str) -> dict | None:
    """The object a JSON file holds; None when it is missing, unreadable, not JSON or not an object (a file that
    only hints: an output's marker, a record of what was written)."""
    try:
        with open(path, encoding="utf-8") as f:
            found = json.load(f)
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None
