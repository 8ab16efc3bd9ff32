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

from tfrecord_pipe._core import messages, progress

POLL_S = 1.0  # how often the launcher sums the workers' reports
RATE_AFTER_S = 0.5  # a rate is shown once it is measured over this long
STALLED_AFTER_S = 20.0  # no count moved this long: said on the line


def report(folder: str, worker: str, seen: int, rejected: int, written: int = 0,
           to_write: int = 0, listed: int = 0) -> None:  # fmt: skip
    """Called by a worker: its counts so far (replaces its previous report). The local engine
    adds the records written and to write, once it writes shards (Beam's steps overlap), and
    the inputs listed, where it lists them all before loading any."""
    path = pathlib.Path(folder) / worker
    partial = path.with_suffix(".partial")
    partial.write_text(f"{seen} {rejected} {written} {to_write} {listed}")
    os.replace(partial, path)


def totals(folder: str) -> tuple[int, int, int, int, int]:
    """(inputs loaded, rejected, records written, records to write, inputs listed), summed
    over every worker's latest report."""
    summed = [0, 0, 0, 0, 0]
    for path in pathlib.Path(folder).glob("*"):
        if path.suffix == ".partial":
            continue
        try:
            counts = [int(n) for n in path.read_text().split()]
        except (OSError, ValueError):  # being replaced right now: counted at the next poll
            continue
        for i, n in enumerate(counts[:5]):
            summed[i] += n
    return tuple(summed)


class ProgressLine:
    """A background thread showing `converting: N inputs loaded (R rejected), X/s` on stderr."""

    def __init__(self, folder: str, stream=None):
        self._folder = folder
        self._line = progress.StatusLine(stream)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._started = time.monotonic()
        self._writing_since: float | None = None  # the local engine's second phase
        self._counts, self._moved = None, self._started  # the counts last seen to move

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self._line.finish(self._text(*totals(self._folder)))

    def _run(self):
        while not self._stop.wait(POLL_S):
            counts = totals(self._folder)
            if counts[0] or counts[4]:
                self._line.update(self._shown(counts, time.monotonic()))

    def _shown(self, counts: tuple[int, ...], now: float) -> str:
        """The line, and how long no count has moved once that is STALLED_AFTER_S: a storage
        that stopped answering showed `0/s` for minutes and no more (a helper's trial)."""
        if counts != self._counts:
            self._counts, self._moved = counts, now
        still = now - self._moved
        return self._text(*counts) + (
            f"; nothing moved for {still:.0f} s" if still >= STALLED_AFTER_S else "")  # fmt: skip

    def _text(self, seen: int, rejected: int, written: int = 0, to_write: int = 0,
              listed: int = 0) -> str:  # fmt: skip
        now = time.monotonic()
        if listed and not seen:
            return f"converting: {messages.counted(listed, 'input')} listed"
        text = f"converting: {messages.counted(seen, 'input')} loaded ({rejected} rejected)"
        if not to_write:
            return text + f", {seen / max(now - self._started, 1e-9):.0f}/s"
        if self._writing_since is None:
            self._writing_since = now
        elapsed = now - self._writing_since
        rate = f", {written / elapsed:.0f}/s" if written and elapsed >= RATE_AFTER_S else ""
        return text + f"; {written}/{to_write} records written" + rate
