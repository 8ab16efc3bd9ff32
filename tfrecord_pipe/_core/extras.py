"""The extra that installs each package a command may need, so that a command run without it
says what to install in one line instead of Python's traceback (`pip install tfrecord-pipe`
alone installs Pillow and google-crc32c: enough for a local `convert` and `verify`)."""

from __future__ import annotations

# The package's import name: (its name, the extra of pyproject.toml that installs it).
EXTRA_OF = {
    "tensorflow": ("TensorFlow", "reader"),
    "apache_beam": ("Apache Beam", "beam"),
}


def missing(module: str | None) -> str | None:
    """What to install where importing `module` failed as not installed, or None where
    `module` is none of ours to name (a module inside a package, which is a broken install,
    not a missing one)."""
    if module not in EXTRA_OF:
        return None
    name, extra = EXTRA_OF[module]
    return (f"this command needs {name}, which is not installed here: pip install "
            f"'tfrecord-pipe[{extra}]' (in a clone: pip install -c constraints.txt '.[{extra}]'; "
            "make install installs every extra).")  # fmt: skip
