"""One progress line for a local run, summed over all worker processes.

Each LoadImages instance writes its running counts to its own small file in a local folder
(replaced atomically); the launcher polls the folder and shows one line for the whole job
(`core.progress`: redrawn on a terminal, plain lines in a log). On remote runners there is no
shared folder: workers log their counts and the runner's UI (Dataflow's job page) shows the
Beam counters.
"""

from __future__ import annotations

import os
import pathlib
import threading
import time

from tfrecord_pipe._core import progress

POLL_S = 1.0  # how often the launcher sums the workers' reports


def report(folder: str, worker: str, seen: int, rejected: int) -> None:
    """Called by a worker: its counts so far (replaces its previous report)."""
    path = pathlib.Path(folder) / worker
    partial = path.with_suffix(".partial")
    partial.write_text(f"{seen} {rejected}")
    os.replace(partial, path)


def totals(folder: str) -> tuple[int, int]:
    """(inputs loaded, rejected), summed over every worker's latest report."""
    seen = rejected = 0
    for path in pathlib.Path(folder).glob("*"):
        if path.suffix == ".partial":
            continue
        try:
            a, b = path.read_text().split()
        except (OSError, ValueError):  # being replaced right now: counted at the next poll
            continue
        seen += int(a)
        rejected += int(b)
    return seen, rejected


class ProgressLine:
    """A background thread showing `converting: N inputs loaded (R rejected), X/s` on stderr."""

    def __init__(self, folder: str, stream=None):
        self._folder = folder
        self._line = progress.StatusLine(stream)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._started = time.monotonic()

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self._line.finish(self._text(*totals(self._folder)))

    def _run(self):
        while not self._stop.wait(POLL_S):
            seen, rejected = totals(self._folder)
            if seen:
                self._line.update(self._text(seen, rejected))

    def _text(self, seen: int, rejected: int) -> str:
        elapsed = max(time.monotonic() - self._started, 1e-9)
        return f"converting: {seen} inputs loaded ({rejected} rejected), {seen / elapsed:.0f}/s"
