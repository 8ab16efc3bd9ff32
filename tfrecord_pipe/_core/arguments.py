"""The public API's arguments checked for their type, so that a wrong one is refused in words:
`is_training="no"` was taken as True (a non-empty string is true), `batch_size="4"` or `4.0`
failed deep inside TensorFlow or Grain, and a `pathlib.Path` as the data failed at a string
method. Each check returns the value as stored (a numpy int as an int: settings are saved as
JSON) or raises ValueError naming the argument."""

from __future__ import annotations

import numbers
import os

import numpy as np


def count(name: str, value, optional: bool = False) -> int | None:
    """An int or a numpy int (not a bool, a float or a str); None only where `optional`."""
    if value is None and optional:
        return None
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        return _refused(name, "an int", value, optional)
    return int(value)


def number(name: str, value, optional: bool = False) -> float | None:
    """A real number (an int too; not a bool or a str); None only where `optional`."""
    if value is None and optional:
        return None
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        return _refused(name, "a number", value, optional)
    return float(value)


def flag(name: str, value, optional: bool = False) -> bool | None:
    """True or False (a numpy bool too); None only where `optional`."""
    if value is None and optional:
        return None
    if not isinstance(value, (bool, np.bool_)):
        return _refused(name, "True or False", value, optional)
    return bool(value)


def text(name: str, value, optional: bool = False) -> str | None:
    """A str; None only where `optional`."""
    if value is None and optional:
        return None
    if not isinstance(value, str):
        return _refused(name, "a str", value, optional)
    return value


def path(name: str, value) -> str:
    """A path: a str or an os.PathLike (`pathlib.Path`), as a str."""
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str):  # (a PathLike of bytes too)
        return _refused(name, "a path (a str or a pathlib.Path)", value, False)
    return value


def _refused(name: str, wanted: str, value, optional: bool):
    wanted += " or None" if optional else ""
    raise ValueError(f"{name} must be {wanted}, got {value!r} ({type(value).__name__})")
