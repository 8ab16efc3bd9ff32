"""An error as one line: what an `error:` line or a listed problem can say. Cloud clients,
Beam and TensorFlow put pages into their errors (tracebacks, retried requests, the names of
graph functions and ops); a person needs the first line."""

from __future__ import annotations

import re

LIMIT = 500  # characters

# TensorFlow's additions to an op's error: `{{function_node __inference_...}}` and
# `[Op:IteratorGetNext] name: ...`.
_TENSORFLOW_NOISE = re.compile(r"\{\{[^}]*\}\}\s*|\s*\[Op:[^\]]*\].*$")


def one_line(error: BaseException | str) -> str:
    """The first line of `error` (a TensorFlow error's own message), without TensorFlow's op
    names, at most LIMIT characters."""
    text = error if isinstance(error, str) else getattr(error, "message", None) or str(error)
    text = text.strip()
    line = text.splitlines()[0] if text else ""
    return _TENSORFLOW_NOISE.sub("", line).strip()[:LIMIT]
