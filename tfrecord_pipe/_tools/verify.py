"""Proof that a conversion lost and changed nothing: every source is in exactly one record or
in rejected/, and every record is the one the converter writes for its source.

Used by `tfrecord-pipe verify SRC OUT`. It lists the sources as the converter does (the same
functions, with the configuration the manifest recorded) and re-derives each one's outcome:
the record the converter writes for it, or the reason it is rejected. Each record must be
that record, in the right split's shard; each rejection line must give the reason the
converter would give now; shards must hold the counts the manifest gives. The two sides are
joined on the source's relative path, then the sources with the same bytes on their content
hash.

The rules live in `verify_rules` and the dataset's files are read by `verify_reading`; two
drivers run them. This one runs on this machine, as the conversion's local engine does: a
worker process per core reads the shards and re-derives the sources' outcomes, and the rows
go through sorts on disk (`beam_jobs.spill`) for the joins, so memory stays flat however
large the dataset, and TensorFlow is never loaded; the paths are judged a part a process,
once every row is in (`verify_join`). `verify_job` runs the same rules as a
Beam pipeline (`--runner DataflowRunner`), its joins as GroupByKeys.
"""

from __future__ import annotations

import collections
import itertools
import operator
import os
import tempfile
import time
from collections.abc import Iterable, Iterator

from beam_jobs import csv_lists, finalise, load, sources, spill, work_folder, worker_pool
from beam_jobs.source_file import SourceFile
from tfrecord_pipe._core import array_records, manifest, messages, progress
from tfrecord_pipe._tools import verify_beside
from tfrecord_pipe._tools import verify_join as join
from tfrecord_pipe._tools import verify_reading as reading
from tfrecord_pipe._tools import verify_rules as rules
from tfrecord_pipe._tools import verify_workers as workers
from tfrecord_pipe._tools.verify_rules import (
    COUNT,
    FILES,
    LABEL_COUNT,
    PLANNED,
    PROBLEM,
    RECORD,
    REJECTED,
    REPORTED,
    SOURCE,
    SPAN,
    VerifyReport,
)

__all__ = ["VerifyReport", "verify"]

PROGRESS_EVERY_S = 0.5  # a terminal's progress line, at most this often
# Sources a task: their rows come back as a run of each part's sort (`verify_join.Parts`),
# as a shard's do; past spill.FAN_IN runs a part (at 64 shards a split, from two splits of
# 500,000 inputs or one of a million) a merge first rewrites the few runs it must.
SOURCES_A_TASK = 8192
TASKS_AHEAD = 2  # a worker (each a shard or many sources): enough that none waits
LISTED, PAIR, _ORDER = join.LISTED, join.PAIR, join.ORDER
WORK_PREFIX = "tfrecord-pipe-verify-"  # its sorts' folder, in TMPDIR or /tmp
# The sorts' files at their largest, per input, for messages: 0.47 measured at 50,000 small
# images named like "label_042/image_01234.jpg", rounded up; longer names take more.
SORTS_KB_AN_INPUT = 0.5


def verify(source: str, dataset: str, processes: int | None = None, show_progress: bool = False,
           decode: bool = False, beside: bool | None = None) -> VerifyReport:  # fmt: skip
    """Checks dataset `dataset` against the inputs at `source` (as given to the converter), on
    this machine, with `processes` worker processes (default: one per core). `decode`: every
    record's image is also decoded as the reader decodes it (TensorFlow, loaded in each
    worker: some 700 MB each). `beside`: whether sources are checked beside their records,
    where they can be (default: where that pays, `verify_beside.chosen`); the report is the
    same either way.

    Raises:
      FileNotFoundError: `dataset` is not a finished dataset, or `source` lists nothing.
      ValueError: the manifest does not record how the dataset was converted.
      worker_pool.WorkerError: a worker failed (a bug: the rules never raise for a record).
    """
    found = reading.read_conversion(dataset, source)
    array_records.require(found.file_formats)  # shards read here
    config = reading.source_config(source, dataset, found)
    problems = join.Problems()
    problems.extend(reading.check_descriptions(dataset, found), FILES)
    problems.extend(reading.check_rejection_files(dataset, found), FILES)
    problems.extend(reading.check_rejection_reasons(dataset, found), FILES)
    problems.extend(finalise.stray_files(dataset, found), FILES)
    problems.extend(reading.check_shard_sizes(dataset, found), FILES)
    problems.extend(reading.check_manifest(found), FILES)
    processes = processes or worker_pool.processes()
    listed_count = sum(info.listed for info in found.splits.values())  # as the manifest says
    labels: set[str] = set()  # of the sources listed, as the converter collects them
    line = _Progress(listed_count, show_progress)
    with work_folder.work_folder(WORK_PREFIX, _work_parent()) as work:
        job = _Join(work, problems, min(processes, join.MOST_PARTS))
        for split, expected in reading.rejection_files(found):
            job.add(reading.read_rejected(dataset, split, expected), REJECTED)
        if beside is None:
            beside = verify_beside.chosen(config, found)
        beside = beside and verify_beside.possible(config)
        worker_args = (dataset, found, config, work, decode, beside, *job.sizes)
        with worker_pool.pool(processes, workers.start, worker_args) as pool:
            window = processes * TASKS_AHEAD
            shards = reading.shards_of(found)
            if beside:
                # Sources are checked beside their records; the listing, between the shards'
                # tasks, says which were; those left are checked after, on their own.
                listed = _Listing(_listed(config, work, labels, found), job, len(shards),
                                  listed_count)  # fmt: skip
                tasks = ((workers.SHARD, listed.after(shard)) for shard in shards)
            else:
                listed_sources = _batches(_listed(config, work, labels, found), SOURCES_A_TASK)
                tasks = itertools.chain(
                    ((workers.SHARD, shard) for shard in shards),
                    ((workers.SOURCES, batch) for batch in listed_sources),
                )
            for future in load.in_order(pool, workers.task, tasks, window):
                kind, result = future.result()
                if kind == workers.SHARD:
                    job.add_shard(*result)
                else:
                    job.add_sources(*result)
                line.update(job.checked)
            if beside:
                listed.rest()
            dedupe = bool(found.conversion.get("dedupe"))
            left = ((workers.LATER, batch) for batch in _batches(job.match(pool, dedupe)))
            for future in load.in_order(pool, workers.task, left, window):
                job.add_checked(future.result()[1])
                line.update(job.checked)
        problems.extend(rules.count_problems(found, source, job.per_split), FILES)
        problems.extend(rules.label_problems(found, config, labels), FILES)
        job.add(reading.read_reported(dataset, found), None)
        job.check(found, config)
    line.finish(sum(job.per_split.values()))
    return VerifyReport(
        sources=sum(job.per_split.values()),
        records=job.totals[RECORD],
        rejected=job.totals[REJECTED],
        problems=tuple(problems.kept),
        num_problems=problems.count,
        decoded=decode,
        converted_from=rules.converted_from(found, source),
    )


def disk_full() -> str:
    """What to do when verify filled a disk: its sorts lie in TMPDIR."""
    folder = _work_parent() or tempfile.gettempdir()
    return (f"A disk is full: {folder}, where verify's sorts lie while it runs (some "
            f"{SORTS_KB_AN_INPUT} kB an input), has {messages.space_left(folder)} with them "
            "removed. Set TMPDIR to a folder with room.")  # fmt: skip


def _work_parent() -> str | None:
    """TMPDIR, where verify's sorts spill (SORTS_KB_AN_INPUT), if it is set: Python
    would fall back to /tmp silently when it is not a writable folder.

    Raises:
      ValueError: TMPDIR is set to what is not a writable folder.
    """
    chosen = os.environ.get("TMPDIR")
    if chosen and not (os.path.isdir(chosen) and os.access(chosen, os.W_OK | os.X_OK)):
        raise ValueError(
            f"TMPDIR={chosen} is not a writable folder; verify's sorts spill there (about "
            f"{SORTS_KB_AN_INPUT} kB per input). Create it, or set TMPDIR to a folder with room."
        )
    return chosen or None


class _Join:
    """The rows of both sides, sorted on disk by relative path and then by content hash.

    Sources come as SOURCE rows (checked on their own), or as the listing's LISTED sources
    and the FOUND rows of those checked beside their records (`verify_beside`; PAIR items
    hold a record's row and its source's). A path's rows go to one of `parts` sorts
    (`verify_join.part_of`), judged here and by the workers at once (`match`), which gives
    the listed sources left unchecked; their rows then come to `add_checked`.
    """

    def __init__(self, work: str, problems: join.Problems, parts: int = 1):
        # As many rows held in memory in all as in one sort, whatever the number of parts;
        # and by a worker, in each of its sorts (its rows; `match`).
        self._run_items = max(1, spill.RUN_ITEMS // parts)
        self._by_path = join.Parts(work, parts, self._run_items)
        self._later = spill.SortedSpill(work, key=join.BY_PATH)  # `match`'s left
        self._by_content = spill.SortedSpill(work, key=join.BY_CONTENT)
        self._judge = join.PathJudge(problems, self._by_content, self._later)
        self._work = work
        self._problems = problems
        self.totals: collections.Counter = collections.Counter()
        self.per_split: collections.Counter = collections.Counter()
        self.checked = 0  # sources checked so far
        self._spans: list[tuple[str, str, str, str]] = []  # one per shard
        self._labels: collections.Counter = collections.Counter()  # (split, label) -> records
        self._planned: collections.Counter = collections.Counter()  # split -> bytes (PLANNED)

    @property
    def sizes(self) -> tuple[int, int]:
        """(parts, rows a sort holds), for the workers' sorts of the rows they make."""
        return len(self._by_path.sorts), self._run_items

    def add(self, read: Iterable[tuple[str, object]], total: str | None) -> None:
        """The (kind, value) pairs of `verify_reading`: rows joined, problems, counts."""
        for kind, value in read:
            if kind == PROBLEM:
                self._problems.add(value, FILES)
            elif kind == COUNT:
                self.totals[total] += value
            elif kind == REPORTED:
                self._by_content.add((value[0], _ORDER[REPORTED], value[1]))
            elif kind == SPAN:
                self._spans.append(value)
            elif kind == LABEL_COUNT:
                split, label, n = value
                self._labels[split, label] += n
            elif kind == PLANNED:
                split, n = value
                self._planned[split] += n
            else:
                key, row = value
                self._by_path.add(key, kind, row)
                self.checked += kind == PAIR  # a source checked beside its record

    def add_shard(self, runs: list[list[str]], others: list, pairs: int) -> None:
        """A shard read by a worker (`verify_workers.task`): its path rows' runs a part, its
        other (kind, value) pairs, its sources checked beside their records."""
        self._by_path.adopt(runs)
        self.add(others, RECORD)
        self.checked += pairs

    def add_listed(self, source: SourceFile) -> None:
        self.per_split[source.split] += 1
        # A tuple: a dataclass costs more to spill.
        listed = (source.path, source.label, source.split, source.problem)
        self._by_path.add(source.relpath, LISTED, listed)

    def add_sources(self, runs: list[list[str]], per_split: dict[str, int]) -> None:
        """Sources checked by a worker: their rows' runs a part, their count per split."""
        self._by_path.adopt(runs)
        self.per_split.update(per_split)
        self.checked += sum(per_split.values())

    def match(self, pool, dedupe: bool) -> Iterator[SourceFile]:
        """Judges each relative path whose sources are all checked: the first part of the
        paths here, each other part on a worker of `pool` meanwhile (`verify_join.judge_part`:
        its rows handed over in files, and so its answers); gives the listed sources no FOUND
        row speaks for (their path's rows wait for `add_checked`)."""
        own, *others = self._by_path.sorts
        judged = [pool.submit(workers.task, (workers.JUDGE,
                                             (part.handed_over(), dedupe, self._run_items)))
                  for part in others]  # fmt: skip
        left = spill.Sequence(self._work)
        for source in self._judge.match(own.sorted(), dedupe):
            left.add(source)
        lefts = []
        for future in judged:
            problems, content, later, part_left = future.result()[1]
            self._problems.take(problems)
            self._by_content.adopt(content)
            self._later.adopt(later)
            lefts.append(part_left)
        yield from left
        for part_left in lefts:
            yield from spill.read_items(part_left)

    def add_checked(self, rows: list[tuple[str, str, dict]]) -> None:
        """Rows of sources `match` gave."""
        for relpath, _, row in rows:
            self._later.add((relpath, _ORDER[SOURCE], SOURCE, row))
        self.checked += len(rows)

    def check(self, found: manifest.Manifest, config) -> None:
        """The rules for the paths `match` left, then per content hash; `config`: the
        conversion's."""
        self._problems.extend(rules.span_problems(found, self._spans), FILES)
        self._problems.extend(rules.label_count_problems(found, self._labels), FILES)
        self._problems.extend(rules.shard_count_problems(found, config, self._planned), FILES)
        dedupe = bool(found.conversion.get("dedupe"))
        for relpath, same in itertools.groupby(self._later.sorted(), key=operator.itemgetter(0)):
            rows = {SOURCE: [], RECORD: [], REJECTED: []}
            for _, _, kind, row in same:
                rows[kind].append(row)
            self._judge.judge(relpath, rows, dedupe)
        counts = collections.Counter()
        for _, same in itertools.groupby(self._by_content.sorted(), key=operator.itemgetter(0)):
            rows, reported = [], []
            for _, order, row in same:
                (rows if order == _ORDER[SOURCE] else reported).append(row)
            found_problems, added = rules.check_content(rows, reported, found)
            self._problems.extend(found_problems)
            counts.update(added)
        self._problems.extend(rules.group_count_problems(found, counts), FILES)


class _Listing:
    """The sources listed into the join a part at a time, between the shards' tasks: the
    workers read shards while the launcher lists, and memory holds no whole listing."""

    def __init__(self, listed: Iterable[SourceFile], job: _Join, shards: int, expected: int):
        self._listed = iter(listed)
        self._job = job
        self._shards, self._expected = max(1, shards), expected  # the manifest's count
        self._given = 0

    def after(self, shard):
        """`shard`, once the listing has gone on by that shard's part of it."""
        self._given += 1
        self._list(self._expected * self._given // self._shards - self._job_listed())
        return shard

    def rest(self) -> None:
        self._list(None)

    def _job_listed(self) -> int:
        return sum(self._job.per_split.values())

    def _list(self, count: int | None) -> None:
        if count is None or count > 0:
            for source in itertools.islice(self._listed, count):
                self._job.add_listed(source)


def _listed(config, work: str, labels: set[str], found: manifest.Manifest
            ) -> Iterator[SourceFile]:  # fmt: skip
    """The inputs as the converter listed them; a CSV's files named twice kept once (the
    others marked, and expected among the rejections, as the converter of `found` did).
    Their labels go into `labels` (`SourceFile.class_label`)."""
    listed = sources.list_sources(config)
    if config.layout == "csv":
        if not csv_lists.names_outside_whole(found):
            listed = map(csv_lists.named_as_before_0_5, listed)
        listed = csv_lists.kept_once(listed, work, csv_lists.labelled_first(found),
                                     csv_lists.labels_ranked_by(found, config))
    for source in listed:
        if source.class_label is not None:
            labels.add(source.class_label)
        yield source


def _batches(sources: Iterable[SourceFile], size: int = load.BATCH) -> Iterator[list[tuple]]:
    """Tasks' batches of sources, each as `SourceFile.as_tuple` (cheaper to send)."""
    sources = iter(sources)
    while batch := [source.as_tuple() for source in itertools.islice(sources, size)]:
        yield batch


class _Progress:
    """A progress line of sources checked, on a terminal (`show_progress`)."""

    def __init__(self, listed: int, show: bool):
        self._line = progress.StatusLine() if show else None
        self._listed, self._shown = listed, 0.0

    def update(self, checked: int) -> None:
        if self._line is None or time.monotonic() - self._shown < PROGRESS_EVERY_S:
            return
        self._shown = time.monotonic()
        # A record written twice has its source checked twice beside it: at most the listing.
        checked = min(checked, self._listed)
        self._line.update(f"  verify: {checked}/{self._listed} sources checked")

    def finish(self, checked: int) -> None:
        if self._line is not None:
            self._line.finish(f"  verify: {messages.counted(checked, 'source')} checked")
