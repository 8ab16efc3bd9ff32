"""Sorting more items than memory holds: sorted runs on disk, merged (an external sort);
and keeping them in their order (`Sequence`), for entries that come in the order needed.

The local engine (`local_engine.py`) groups and orders every input's small entry three ways
(by content, by record key, and the rejections by path). Held in memory, as Beam's local
runner holds its shuffles, that grows with the input count; here at most RUN_ITEMS items,
plus one chunk per run being merged, are held at a time, whatever the count.
"""

from __future__ import annotations

import heapq
import itertools
import os
import pickle
import resource
import tempfile
from collections.abc import Callable, Iterable, Iterator

RUN_ITEMS = 32_768  # items held before they are sorted and written as a run (~10-30 MB)
CHUNK_ITEMS = 64  # items per pickle in a run file: what a run being merged holds in memory
FAN_IN = 128  # runs merged at once (a chunk each in memory); more are first merged into longer runs
SPARE_FILES = 16  # files left to open beside a merge's runs (its output, other threads')


class SortedSpill:
    """Items added in any order, given back sorted by `key` (items with equal keys in the
    order they were added; None: by the items themselves, which sorts and merges cheapest).
    Runs live in `folder` until read back."""

    def __init__(self, folder: str, key: Callable | None = None, run_items: int | None = None):
        self._folder = folder
        self._key = key
        self._run_items = run_items or RUN_ITEMS  # read now: tests make it small
        self._held: list = []
        self._runs: list[str] = []
        self._added = 0

    def __len__(self) -> int:
        return self._added

    def add(self, item) -> None:
        self._held.append(item)
        self._added += 1
        if len(self._held) >= self._run_items:
            self._write_held()

    def _write_held(self) -> None:
        self._runs.append(write_file(self._folder, sorted(self._held, key=self._key), ".run"))
        self._held = []

    def handed_over(self) -> list[str]:
        """Every item added, as files of sorted runs for another process's `adopt` (the items
        held written as one more run), which then owns them; this spill is then empty."""
        if self._held:
            self._write_held()
        runs, self._runs, self._added = self._runs, [], 0
        return runs

    def adopt(self, runs: list[str]) -> None:
        """Takes files of runs sorted by this spill's key (`handed_over`), as items added
        before any held now (`len` counts only the items added)."""
        self._runs.extend(runs)

    def sorted(self) -> Iterator:
        """Every item added, in key order; once (the runs are deleted as they are read)."""
        held, self._held = sorted(self._held, key=self._key), []
        most = fan_in()
        while len(self._runs) > most:  # keeps the merge's memory bounded at any count
            self._merge_fewest(most)
        # Runs hold earlier items than `held`, and merge keeps its inputs' order on ties.
        return heapq.merge(*map(read_items, self._runs), held, key=self._key)

    def _merge_fewest(self, most: int) -> None:
        """Merges groups of consecutive runs (at most `most` a group), from the first, until
        `most` runs would be left (past about `most`**2 runs, fewer each call): only as many
        items are rewritten as that takes (a few runs past it cost a few runs' rewriting,
        not every item's), and runs stay in the order their items were added."""
        runs, merged, excess = self._runs, [], len(self._runs) - most
        while excess > 0 and len(runs) > 1:
            size = min(most, excess + 1, len(runs))  # a group of `size` is `size - 1` fewer
            group, runs = runs[:size], runs[size:]
            merged.append(write_file(self._folder, heapq.merge(*map(read_items, group), key=self._key),
                                 ".run"))  # fmt: skip
            excess -= size - 1
        self._runs = merged + runs


class Sequence:
    """Items given back in the order they were added, as often as wanted: for entries that
    come in the order they are needed in, where a sort would only cost. At most RUN_ITEMS
    are held; the others wait in files in `folder`, removed with it."""

    def __init__(self, folder: str, run_items: int | None = None):
        self._folder = folder
        self._run_items = run_items or RUN_ITEMS  # read now: tests make it small
        self._held: list = []
        self._runs: list[str] = []

    def add(self, item) -> None:
        self._held.append(item)
        if len(self._held) >= self._run_items:
            self._runs.append(write_file(self._folder, self._held, ".sequence"))
            self._held = []

    def adopt(self, path: str) -> None:
        """A file of items (`write_items`) written elsewhere, as the next items (none may be
        held here): it becomes this sequence's, removed with `folder`."""
        assert not self._held, "adopted items would come after those held"
        self._runs.append(path)

    def __iter__(self) -> Iterator:
        for path in self._runs:
            yield from read_items(path, remove=False)
        yield from self._held


def fan_in() -> int:
    """Runs a merge takes at once: FAN_IN, or fewer where this process may not open that
    many more files (`ulimit -n`, which `worker_pool.allow_files` raises where it can); at
    least 2, for the merge to end."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY:
        return FAN_IN
    try:
        open_now = len(os.listdir("/proc/self/fd"))
    except OSError:  # no /proc: the limit is taken as raised
        return FAN_IN
    return max(2, min(FAN_IN, soft - open_now - SPARE_FILES))


def write_file(folder: str, items: Iterable, suffix: str) -> str:
    """A new file in `folder` of `items` (`write_items`), named with `suffix`; its path."""
    fd, path = tempfile.mkstemp(dir=folder, suffix=suffix)
    with os.fdopen(fd, "wb") as f:
        write_items(f, items)
    return path


def write_items(f, items: Iterable) -> None:
    """Writes `items` to the binary file `f`, CHUNK_ITEMS to a pickle (`read_items` reads)."""
    items = iter(items)
    while chunk := list(itertools.islice(items, CHUNK_ITEMS)):
        pickle.dump(chunk, f, protocol=pickle.HIGHEST_PROTOCOL)


def read_items(path: str, remove: bool = True) -> Iterator:
    """The items `write_items` wrote to `path`, a chunk at a time. The file is removed once
    opened (unless not `remove`): gone once read or dropped, with nothing left to remove later."""
    with open(path, "rb") as f:
        if remove:
            os.remove(path)
        while True:
            try:
                chunk = pickle.load(f)
            except EOFError:
                return
            yield from chunk
