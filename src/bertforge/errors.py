"""The two ways a command fails.

Anything a user can get wrong (a missing file, malformed JSON, an unknown label, a vocabulary that does
not fit the model) raises :class:`UserError`; a run that cannot go on (a non-finite loss, an interruption)
raises :class:`TrainingError`.  The command line turns them into one line ``error: ...`` on stderr and exit
status 2 or 1; library users catch them like any other exception.
"""

from __future__ import annotations

import os
import reprlib

_SHORT = reprlib.Repr()
_SHORT.maxlevel, _SHORT.maxstring, _SHORT.maxother = 3, 60, 60
_SHORT.maxdict = _SHORT.maxlist = _SHORT.maxtuple = _SHORT.maxset = 6
SHOWN_CHARS = 120  # the longest value an error message echoes


def shown(value) -> str:
    """``repr(value)`` for an error message, bounded: a value from a user's file may be any size (a YAML
    config's aliases can make a few lines stand for millions of values), and its message is one line."""
    text = _SHORT.repr(value)
    return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 3] + "..."


class UserError(Exception):
    """Bad input from the user: reported as ``error: <message>``, exit status 2, no traceback."""


class TrainingError(Exception):
    """A run that cannot go on (e.g. a non-finite loss): ``error: <message>`` and exit status 1."""


def require_file(path: str | os.PathLike, what: str = "file") -> str:
    """Return ``path`` as a string if it is an existing, non-empty file; raise UserError otherwise."""
    p = os.fspath(path)
    if not os.path.exists(p):
        raise UserError(f"{what} not found: {p}")
    if os.path.isdir(p):
        raise UserError(f"{what} is a directory, expected a file: {p}")
    if os.path.getsize(p) == 0:
        raise UserError(f"{what} is empty: {p}")
    return p


def require_dir(path: str | os.PathLike, what: str = "directory") -> str:
    p = os.fspath(path)
    if not os.path.exists(p):
        raise UserError(f"{what} not found: {p}")
    if not os.path.isdir(p):
        raise UserError(f"{what} is not a directory: {p}")
    return p
