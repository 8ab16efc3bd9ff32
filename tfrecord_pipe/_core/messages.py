"""An error as one line: what an `error:` line or a listed problem can say. Cloud clients,
Beam and TensorFlow put pages into their errors (tracebacks, retried requests, the names of
graph functions and ops); a person needs the first line."""

from __future__ import annotations

import errno
import os
import re
import shutil

LIMIT = 500  # characters

# TensorFlow's additions to an op's error: `[[{{node Assert}}]]`, `{{function_node
# __inference_...}}` and `[Op:IteratorGetNext] name: ...`.
_TENSORFLOW_NOISE = re.compile(r"\s*\[\[\{\{[^}]*\}\}\]\]|\{\{[^}]*\}\}\s*|\s*\[Op:[^\]]*\].*$")
_TRACEBACK = "Traceback (most recent call last):"
# A graph function's error starts so; the reason follows the Python lines it was defined at.
_GRAPH_ERROR = "Graph execution error:"
# Where tf.data says a map's error came from (`Error in user-defined function passed to
# MapDataset:11 transformation with iterator: Iterator::Root::Prefetch::...: `), and how a
# failed tf.debugging assertion wraps its message (`assertion failed: [...]`, quotes escaped).
_TF_DATA_WHERE = re.compile(r"^Error in user-defined function passed to \S+ transformation "
                            r"with iterator: \S+: ")  # fmt: skip
_ASSERTION = re.compile(r"^assertion failed: \[(.*?)\](?: \[|\s*$)")  # its first item


def one_line(error: BaseException | str) -> str:
    """The first line of `error` (a TensorFlow error's own message; the exception's line of a
    traceback carried as text, as Beam's workers send them), without TensorFlow's op names,
    at most LIMIT characters."""
    if isinstance(error, str):
        text = error
    elif type(error).__module__.startswith("tensorflow"):
        text = getattr(error, "message", None) or str(error)
    else:  # str(), not .message: a Google API error's has its status code
        text = str(error)
    lines = [line for line in text.strip().splitlines() if line.strip()]
    if not lines:
        return ""
    line = lines[0]
    if _TRACEBACK in line:
        exception_lines = [line for line in lines if not line.startswith((" ", "\t"))]
        line = exception_lines[-1] if exception_lines else line
    elif line.startswith(_GRAPH_ERROR):
        reasons = [line for line in lines[1:] if not line.startswith((" ", "\t", "Detected at"))]
        line = reasons[0] if reasons else line
    line = _TF_DATA_WHERE.sub("", _TENSORFLOW_NOISE.sub("", line).strip())
    if asserted := _ASSERTION.match(line):
        line = asserted.group(1).replace("\\'", "'")
    return line[:LIMIT]


def some(items, shown: int = 5, show=str) -> str:
    """The first `shown` of `items` (a sequence), each as `show` writes it, then how many
    more: a list that fits in one line."""
    more = f" and {len(items) - shown} more" if len(items) > shown else ""
    return ", ".join(map(show, items[:shown])) + more


def counted(n: int, noun: str) -> str:
    """`1 shard`, `2 shards`: a count with its noun."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def quoted(text: str, most: int = 100) -> str:
    """`text` as `repr` writes it, cut after `most` characters (then "..."): a line of a
    user's file, in a message that must stay one readable line."""
    return repr(text) if len(text) <= most else f"{text[:most]!r}..."


def printable(text: str) -> str:
    """`text` as a terminal can show it in one line: itself, or, where a character of it does
    not print (a file name may hold anything: "\\x1b[2J" clears the screen), as `repr` writes
    it."""
    return text if text.isprintable() else repr(text)


# A full disk or quota: the error itself, or a worker's carried back as its text.
_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)
_DISK_FULL_ERRNO = r"\[Errno (?:%s)\]" % "|".join(map(str, _DISK_FULL))
_DISK_FULL_TEXT = re.compile(_DISK_FULL_ERRNO)
_PATH_IN_TEXT = re.compile(_DISK_FULL_ERRNO + r" [^:\n]*: '([^'\n]+)'")  # the file it names


def disk_full(error: BaseException) -> bool:
    """Whether `error` says a disk (or the user's quota on it) is full."""
    if isinstance(error, OSError) and error.errno in _DISK_FULL:
        return True
    return _DISK_FULL_TEXT.search(str(error)) is not None


def path_named(error: BaseException) -> str | None:
    """The file a full disk's `error` names (an OSError's, or in a worker's error's text)."""
    if isinstance(error, OSError) and isinstance(error.filename, str):
        return error.filename
    found = _PATH_IN_TEXT.search(str(error))
    return found[1] if found else None



def space_left(folder: str) -> str:
    """`1.2 GB free`: what the disk of the local `folder` has left, for a message."""
    folder = os.path.abspath(folder)
    while not os.path.exists(folder) and os.path.dirname(folder) != folder:
        folder = os.path.dirname(folder)  # a folder not made yet: the disk it would be on
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        return "an unknown amount free"
    unit = next((unit for unit in ("GB", "MB", "kB") if free >= _UNITS[unit]), "bytes")
    return f"{free / _UNITS[unit]:.1f} {unit} free" if unit != "bytes" else f"{free} bytes free"


_UNITS = {"GB": 1e9, "MB": 1e6, "kB": 1e3, "bytes": 1}
