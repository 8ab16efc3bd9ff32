"""The public API's arguments checked for their type, so that a wrong one is refused in words:
`is_training="no"` was taken as True (a non-empty string is true), `batch_size="4"` or `4.0`
failed deep inside TensorFlow or Grain, and a `pathlib.Path` as the data failed at a string
method. Each check returns the value as stored (a numpy int as an int: settings are saved as
JSON) or raises ValueError naming the argument; None passes only where `optional`."""

from __future__ import annotations

import dataclasses
import functools
import numbers
import os
import sys

from tfrecord_pipe._core import paths as _paths


def _is_bool(value) -> bool:
    """True or False, numpy's too. The core needs Pillow alone (`pip install tfrecord-pipe`
    installs no numpy), and a numpy value exists only where numpy has been imported."""
    numpy = sys.modules.get("numpy")
    return isinstance(value, bool) or (numpy is not None and isinstance(value, numpy.bool_))


def count(name: str, value, optional: bool = False) -> int | None:
    """An int or a numpy int (not a bool, a float or a str)."""
    is_count = isinstance(value, numbers.Integral) and not _is_bool(value)
    return _typed(name, value, optional, is_count, "an int", int)


def number(name: str, value, optional: bool = False) -> float | None:
    """A real number (an int too; not a bool or a str)."""
    is_number = isinstance(value, numbers.Real) and not _is_bool(value)
    return _typed(name, value, optional, is_number, "a number", float)


def flag(name: str, value, optional: bool = False) -> bool | None:
    """True or False (a numpy bool too)."""
    return _typed(name, value, optional, _is_bool(value), "True or False", bool)


def text(name: str, value, optional: bool = False) -> str | None:
    return _typed(name, value, optional, isinstance(value, str), "a str", str)


def path(name: str, value) -> str:
    """A path: a str or an os.PathLike (`pathlib.Path`), as a str, with `~` expanded (the
    shell expands it on a command line; `"~/data"` read "matched no files"). A mistyped URL
    (`gs:/bucket/x`) is refused."""
    if isinstance(value, os.PathLike):
        value = os.fspath(value)  # (a PathLike of bytes gives bytes: refused)
    value = _typed(name, value, False, isinstance(value, str), "a path (a str or a pathlib.Path)",
                   str)  # fmt: skip
    if meant := _paths.mistyped_url(value):
        raise ValueError(_paths.mistyped_said(name, value, meant))
    return home_expanded(value)


def home_expanded(value: str) -> str:
    """A path with a leading `~` expanded, as the shell would have (it does not after `=`, as
    in `--output=~/data`, nor in quotes): every command and function takes `~` as home; the
    conversion wrote a folder named `~` in the current one, which inspect then did not find."""
    return os.path.expanduser(value) if value.startswith("~") else value


def _typed(name: str, value, optional: bool, right: bool, wanted: str, stored: type):
    if value is None and optional:
        return None
    if not right:
        wanted += " or None" if optional else ""
        raise ValueError(f"{name} must be {wanted}, got {value!r} ({type(value).__name__})")
    return stored(value)


def field_checks(cls, paths: tuple[str, ...] = (), skip: tuple[str, ...] = ()) -> tuple:
    """(name, check) for each field of the dataclass `cls`, from its annotation ("int",
    "bool", "str", "float", each "| None" too; the fields in `paths` are paths). The fields
    in `skip` the class checks itself; any other annotation is a KeyError, so that no field
    goes unchecked."""
    kinds = {"int": count, "bool": flag, "str": text, "float": number}
    checks = []
    for field in dataclasses.fields(cls):
        if field.name in skip:
            continue
        if field.name in paths:
            checks.append((field.name, path))
            continue
        optional = field.type.endswith(" | None")
        check = kinds[field.type.removesuffix(" | None")]
        checks.append((field.name, functools.partial(check, optional=optional)))
    return tuple(checks)


def check_fields(instance, checks: tuple, title: str) -> None:
    """Each field of the frozen dataclass `instance` checked and stored as checked (a numpy
    int as an int); every wrong one said at once (`refuse`)."""
    wrong = []
    for name, check in checks:
        try:
            object.__setattr__(instance, name, check(name, getattr(instance, name)))
        except ValueError as err:
            wrong.append(str(err))
    refuse(title, wrong)


class Invalid(ValueError):
    """A configuration refused, every problem said at once: "Invalid TITLE: first; second".
    `problems` keeps them apart, each beginning with its field's name, for a caller that says
    them in its own words (the converter's flags, a config that holds another)."""

    def __init__(self, title: str, problems):
        self.title, self.problems = title, tuple(problems)
        super().__init__(f"Invalid {title}: " + "; ".join(self.problems))

    def __reduce__(self):  # raised in a worker process, it comes back whole
        return type(self), (self.title, self.problems)


def json_values(value):
    """A state a program saved and gave back, with the types JSON gives: saved another way
    (orbax, msgpack, YAML), its numbers and lists come back as numpy or JAX values or tuples,
    which compare unequal to the same numbers and lists (and JSON cannot write)."""
    if isinstance(value, dict):
        return {key: json_values(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_values(item) for item in value]
    if hasattr(value, "dtype") and hasattr(value, "tolist"):  # numpy's and JAX's numbers, arrays
        return json_values(value.tolist())
    return value


def refuse(title: str, problems) -> None:
    """Raises Invalid(title, problems) where there is any problem."""
    if problems:
        raise Invalid(title, problems)
