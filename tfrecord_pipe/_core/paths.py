"""Paths, local or remote (gs://, s3://, any scheme Beam's and TensorFlow's filesystems take):
the rules in one place, as plain string functions.

A remote path is one with a scheme, as Beam's `FileSystems.get_scheme` decides. Object stores
have no folders to create, so the only I/O here is making a local folder.
"""

from __future__ import annotations

import os
import posixpath
import re

_SCHEME = re.compile(r"^[a-zA-Z][-+.a-zA-Z0-9]*://")  # the pattern Beam's FileSystems uses


# A scheme this tool reads, mistyped: `gs:/bucket/x`, `gs:bucket/x` and `gs//bucket/x` are
# local paths (a folder named "gs:" or "gs"), and a conversion wrote its dataset there.
_MISTYPED = re.compile(r"^(gs|s3|gcs|hdfs|https?):(?!//)/?|^(gs|s3)//", re.IGNORECASE)


def mistyped_url(path: str) -> str | None:
    """The URL `path` was meant to be, where it begins with a mistyped scheme (`gs:/b/x`,
    `gs:b/x`, `gs//b/x`); None otherwise."""
    typo = _MISTYPED.match(path)
    if typo is None:
        return None
    return f"{(typo.group(1) or typo.group(2)).lower()}://{path[typo.end():].lstrip('/')}"


def mistyped_said(what: str, path: str, meant: str) -> str:
    """The refusal of a path with a mistyped scheme (`mistyped_url`)."""
    return (f"{what} {path!r} is not a URL (did you mean {meant}?): as given it is a local "
            f"path, under a folder named {path.split('/')[0]!r}.")  # fmt: skip


def has_wildcard(path: str) -> bool:
    """Whether `path` holds a glob pattern's characters (`*`, `?`, `[`): read as a pattern
    where nothing is at it literally."""
    return any(char in path for char in "*?[")


def is_remote(path: str) -> bool:
    """Whether `path` names a filesystem by scheme (gs://bucket/x) rather than local disk."""
    return bool(_SCHEME.match(path))


def folder(path: str) -> str:
    """`path` without trailing slashes; a root ("/", "gs://") keeps its own."""
    stripped = path.rstrip("/")
    scheme = _SCHEME.match(path)
    if scheme and len(stripped) < len(scheme.group(0)):
        return scheme.group(0)
    return stripped or path[:1]


def join(base: str, *names: str) -> str:
    """`base/name/...`, with one slash between parts whatever `base` ends with."""
    return posixpath.join(folder(base), *names)


def parent(path: str) -> str:
    """The folder holding `path` ("" for a bare name in the working folder)."""
    return posixpath.dirname(folder(path))


def basename(path: str) -> str:
    """The last part of `path`: a file's or folder's own name."""
    return posixpath.basename(folder(path))


def is_inside(path: str, parent: str) -> bool:
    """Whether `path` is `parent` or below it: as written, or with links followed (local
    paths). A folder reached through a link inside `parent` is inside it: a listing of
    `parent` follows the link to it."""
    if is_remote(path) or is_remote(parent):
        return _below(path, parent)
    return _below(os.path.abspath(path), os.path.abspath(parent)) or _below(
        os.path.realpath(path), os.path.realpath(parent)
    )


def same_file(a: str, b: str) -> bool:
    """Whether two paths name one file: as written, or with links followed (local paths)."""
    if is_remote(a) or is_remote(b):
        return folder(a) == folder(b)
    return os.path.abspath(a) == os.path.abspath(b) or os.path.realpath(a) == os.path.realpath(b)


def _below(path: str, parent: str) -> bool:
    path, parent = folder(path), folder(parent)
    return path == parent or path.startswith(parent.rstrip("/") + "/")


def make_local_folder(path: str) -> None:
    """Creates the local folder `path` (and its parents); remote paths need none."""
    if not is_remote(path):
        os.makedirs(path, exist_ok=True)
