"""The extras of pyproject.toml, and the one way to say how to install one: a command run
without a package it needs says what to install in one line instead of Python's traceback
(`pip install tfrecord-pipe` alone installs Pillow and google-crc32c: enough for a local
`convert` and `verify`)."""

from __future__ import annotations

import importlib.util

# A package's import name: (its name, the extra of pyproject.toml that installs it).
EXTRA_OF = {
    "tensorflow": ("TensorFlow", "reader"),
    "apache_beam": ("Apache Beam", "beam"),
}


def how_to_install(extra: str) -> str:
    """The commands that install `extra`, from PyPI and in a clone (the pinned versions)."""
    return (f"pip install 'tfrecord-pipe[{extra}]' (in a clone: pip install -c constraints.txt "
            f"'.[{extra}]'; make install installs every extra)")  # fmt: skip


def missing(module: str | None) -> str | None:
    """What to install where importing `module` failed as not installed, or None where
    `module` is none of ours to name (a module inside a package, which is a broken install,
    not a missing one)."""
    if module not in EXTRA_OF:
        return None
    name, extra = EXTRA_OF[module]
    return f"this command needs {name}, which is not installed here: {how_to_install(extra)}."


def require(module: str) -> None:
    """Raises ModuleNotFoundError for `module` (which `missing` says in words) where it is not
    installed: for what needs it only later, in worker processes."""
    if importlib.util.find_spec(module) is None:
        raise ModuleNotFoundError(f"No module named {module!r}", name=module)
