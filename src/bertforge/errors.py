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


_NAMES = {str: ("a string", "strings"), int: ("an integer", "integers"), float: ("a number", "numbers"),
          bool: ("True or False", "True or False"), dict: ("a dict", "dicts"), os.PathLike: ("a path", "paths"),
          type(None): ("None", "None")}


def type_parts(hint) -> tuple:
    """The alternatives of a type hint (``str | None``, or a tuple of types)."""
    import types
    import typing

    if isinstance(hint, tuple):
        return hint
    return typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)


def _fits(value, hint) -> bool:
    import typing

    for h in type_parts(hint):
        origin, args = typing.get_origin(h), typing.get_args(h)
        if h is typing.Any or h is None and value is None:
            return True
        if origin in (list, tuple):
            if isinstance(value, (list, tuple)) and all(_fits(v, args[0]) for v in value):
                return True
        elif h in (int, float):  # a bool is neither, an int is also a float
            if isinstance(value, (int, float) if h is float else int) and not isinstance(value, bool):
                return True
        elif isinstance(origin or h, type) and isinstance(value, origin or h):
            return True
    return False


def _described(hint, plural: bool = False) -> str:
    import typing

    said = []
    for h in type_parts(hint):
        if typing.get_origin(h) in (list, tuple):
            said.append(f"{'lists' if plural else 'a list'} of {_described(typing.get_args(h)[0], plural=True)}")
        else:
            h = type(None) if h is None else h
            said.append(_NAMES[h][plural] if h in _NAMES else getattr(h, "__name__", str(h)))
    return " or ".join(said)


def require_type(value, hint, name: str, at_least: int | None = None):
    """``value`` when it fits type hint ``hint`` (a type, a tuple of types, ``str | list[str]``; an int fits a
    float, a bool neither) and, a number with ``at_least``, is no smaller; else a UserError naming ``name``,
    what it takes and what it got."""
    ok = _fits(value, hint)
    small = ok and at_least is not None and isinstance(value, (int, float)) and value < at_least
    if not ok or small:
        expected = _described(hint) + (f" of at least {at_least}" if at_least is not None else "")
        got = "None" if value is None else f"{type(value).__name__} {shown(value)}"
        raise UserError(f"{name} must be {expected}, not {got}")
    return value


def checked(fn=None, **at_least: int):
    """Decorate an API entry point so that each argument is checked against its annotation (and, for those
    named in ``at_least``, its smallest value) before the function runs: a wrong type is one message naming
    the argument, not a TypeError deep inside.  ``Any``, ``*args`` and ``**kwargs`` are left to the function."""
    if fn is None:
        return lambda f: checked(f, **at_least)
    import functools
    import inspect
    import typing

    signature, hints = inspect.signature(fn), {}

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if not hints:  # resolved at the first call, when every name the annotations use exists
            hints.update(typing.get_type_hints(fn))
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError as e:
            raise UserError(f"{fn.__name__}: {e}") from None
        for name, value in bound.arguments.items():
            if signature.parameters[name].kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
                continue
            if name in hints and name != "self":
                require_type(value, hints[name], name, at_least.get(name))
        return fn(*args, **kwargs)

    return wrapper
