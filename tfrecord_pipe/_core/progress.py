"""A line of progress for long work: redrawn in place on a terminal, plain lines in a log.

Used by the conversion job's launcher and by `bench`. A stream that is not a terminal (a log
file, a CI job's output) gets no carriage returns: a plain line every `log_every_s` seconds,
and the last one.
"""

from __future__ import annotations

import sys
import time

LOG_EVERY_S = 5.0  # a plain line this often when the stream is not a terminal
REDRAW_EVERY_S = 0.1  # on a terminal: fast enough to look live, few enough writes to cost nothing


class StatusLine:
    """Progress on one line of `stream` (default stderr): `update` often, `finish` once."""

    def __init__(self, stream=None, log_every_s: float = LOG_EVERY_S):
        self._stream = stream or sys.stderr
        self._terminal = getattr(self._stream, "isatty", lambda: False)()
        self._every = REDRAW_EVERY_S if self._terminal else log_every_s
        self._last = time.monotonic()  # the first plain line after one interval, not at once

    def update(self, text: str) -> None:
        """Shows `text`, unless a line was shown less than an interval ago."""
        now = time.monotonic()
        if now - self._last >= self._every:
            self._last = now
            self._write(text, end="")

    def finish(self, text: str) -> None:
        """Shows the last `text` and ends the line."""
        self._write(text, end="\n")

    def _write(self, text: str, end: str) -> None:
        if self._terminal:  # back to the line's start, and clear what a longer text left
            self._stream.write(f"\r{text}\x1b[K{end}")
        else:
            self._stream.write(text + "\n")
        self._stream.flush()


def bar(fraction: float, width: int = 24) -> str:
    """`[#########...............]` for a fraction in [0, 1]."""
    filled = int(min(max(fraction, 0.0), 1.0) * width)
    return "[" + "#" * filled + "." * (width - filled) + "]"
