"""Argument types checked before anything runs: a value of the wrong type raises TypeError, never is coerced.

`pause(keep=None)` would otherwise drop every GPU byte (None is falsy) and `keep="no"` keep them (a non-empty
string is truthy); `dump("12")` or `dump(12.7)` would dump another process than the one meant.
"""

from __future__ import annotations

import errno
import os
from typing import Any, Sequence


def _name(value: Any) -> str:
    return f"{type(value).__name__} {value!r}"


def require_bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool (True or False), not {_name(value)}")
    return value


def require_int(name: str, value: Any, *, optional: bool = False) -> Any:
    if value is None and optional:
        return value
    # bool is an int in Python: True is no process id or deadline.
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int{' or None' if optional else ''}, not {_name(value)}")
    return value


def require_path(name: str, value: Any, *, optional: bool = False) -> Any:
    if value is None and optional:
        return value
    if not isinstance(value, (str, os.PathLike)):
        raise TypeError(f"{name} must be a path (str or os.PathLike){' or None' if optional else ''}, "
                        f"not {_name(value)}")
    return value


def require_readable_directory(path: Any) -> None:
    """FileNotFoundError or PermissionError for an image directory this user cannot read: not a defect."""
    if not os.path.exists(path):
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), os.fspath(path))
    if not os.path.isdir(path):
        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), os.fspath(path))
    if not os.access(path, os.R_OK | os.X_OK):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), os.fspath(path))


def require_command(name: str, value: Any) -> Sequence[str]:
    # A string is a sequence of characters: "python train.py" would run "p".
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)) or \
            not all(isinstance(word, str) for word in value):
        raise TypeError(f"{name} must be a list or tuple of str (one word each), not {_name(value)}")
    return value
