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
large the dataset, and TensorFlow is never loaded. `verify_job` runs the same rules as a
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

from beam_jobs import csv_lists, load, sources, spill, worker_pool
from beam_jobs.source_file import SourceFile
from tfrecord_pipe._core import manifest, progress
from tfrecord_pipe._tools import verify_beside
from tfrecord_pipe._tools import verify_reading as reading
from tfrecord_pipe._tools import verify_rules as rules
from tfrecord_pipe._tools import verify_workers as workers
from tfrecord_pipe._tools.verify_rules import (
    COUNT,
    FILES,
    INPUTS,
    LABEL_COUNT,
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
LISTED = "listed"  # a source listed, to be paired with one checked beside its record
FOUND, PAIR = verify_beside.FOUND, verify_beside.PAIR
# Within a key, for the joins.
_ORDER = {SOURCE: 0, RECORD: 1, REJECTED: 2, REPORTED: 3, LISTED: 4, FOUND: 5, PAIR: 6}


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
    config = reading.source_config(source, dataset, found)
    problems = _Problems()
    problems.extend(reading.check_descriptions(dataset, found), FILES)
    problems.extend(reading.check_rejection_files(dataset, found), FILES)
    problems.extend(reading.check_stray_shards(dataset, found), FILES)
    problems.extend(reading.check_shard_sizes(dataset, found), FILES)
    problems.extend(reading.check_manifest(found), FILES)
    processes = processes or worker_pool.processes()
    listed_count = sum(info.listed for info in found.splits.values())  # as the manifest says
    labels: set[str] = set()  # of the sources listed, as the converter collects them
    line = _Progress(listed_count, show_progress)
    with tempfile.TemporaryDirectory(prefix="tfrecord-pipe-verify-", dir=_work_parent()) as work:
        job = _Join(work, problems)
        for split, expected in reading.rejection_files(found):
            job.add(reading.read_rejected(dataset, split, expected), REJECTED)
        if beside is None:
            beside = verify_beside.chosen(config, found)
        beside = beside and verify_beside.possible(config)
        worker_args = (dataset, found, config, work, decode, beside)
        with worker_pool.pool(processes, workers.start, worker_args) as pool:
            window = processes * worker_pool.IN_FLIGHT
            shards = reading.shards_of(found)
            if beside:
                # Sources are checked beside their records; the listing, between the shards'
                # tasks, says which were; those left are checked after, on their own.
                listed = _Listing(_listed(config, work, labels, found), job, len(shards),
                                  listed_count)  # fmt: skip
                tasks = ((workers.SHARD, listed.after(shard)) for shard in shards)
            else:
                tasks = itertools.chain(
                    ((workers.SHARD, shard) for shard in shards),
                    ((workers.SOURCES, batch)
                     for batch in _batches(_listed(config, work, labels, found))),
                )
            for future in load.in_order(pool, workers.task, tasks, window):
                kind, result = future.result()
                if kind == workers.SHARD:
                    job.add(spill.read_items(result), RECORD)
                else:
                    job.add_sources(result)
                line.update(job.checked)
            if beside:
                listed.rest()
            dedupe = bool(found.conversion.get("dedupe"))
            left = ((workers.SOURCES, batch) for batch in _batches(job.match(dedupe)))
            for future in load.in_order(pool, workers.task, left, window):
                job.add_checked(future.result()[1])
                line.update(job.checked)
        problems.extend(rules.count_problems(found, source, job.per_split), FILES)
        problems.extend(rules.label_problems(found, config, labels), FILES)
        job.add(reading.read_reported(dataset, found), None)
        job.check(found)
    line.finish(sum(job.per_split.values()))
    return VerifyReport(
        sources=sum(job.per_split.values()),
        records=job.totals[RECORD],
        rejected=job.totals[REJECTED],
        problems=tuple(problems.kept),
        num_problems=problems.count,
        decoded=decode,
    )


def _work_parent() -> str | None:
    """TMPDIR, where verify's sorts spill (about 0.7 kB per input), if it is set: Python
    would fall back to /tmp silently when it is not a writable folder.

    Raises:
      ValueError: TMPDIR is set to what is not a writable folder.
    """
    chosen = os.environ.get("TMPDIR")
    if chosen and not (os.path.isdir(chosen) and os.access(chosen, os.W_OK | os.X_OK)):
        raise ValueError(
            f"TMPDIR={chosen} is not a writable folder; verify's sorts spill there (about "
            "0.7 kB per input). Create it, or set TMPDIR to a folder with room."
        )
    return chosen or None


class _Problems:
    """All problems counted; the first MAX_PROBLEMS_KEPT in order kept, in bounded memory."""

    def __init__(self):
        self._ranked: list[tuple[int, str]] = []
        self.count = 0

    def add(self, text: str, rank: int = INPUTS) -> None:
        self.count += 1
        self._ranked.append((rank, text))
        if len(self._ranked) >= 2 * rules.MAX_PROBLEMS_KEPT:
            self._ranked = sorted(self._ranked)[: rules.MAX_PROBLEMS_KEPT]

    def extend(self, texts: Iterable[str], rank: int = INPUTS) -> None:
        for text in texts:
            self.add(text, rank)

    @property
    def kept(self) -> list[str]:
        return rules.first_problems(self._ranked)


class _Join:
    """The rows of both sides, sorted on disk by relative path and then by content hash.

    Sources come as SOURCE rows (checked on their own), or as the listing's LISTED sources
    and the FOUND rows of those checked beside their records (`verify_beside`; PAIR items
    hold a record's row and its source's): `match` pairs these, and gives the listed sources
    left unchecked, whose rows then come to `add_checked`.
    """

    def __init__(self, work: str, problems: _Problems):
        self._by_path = spill.SortedSpill(work, key=operator.itemgetter(0, 1))
        self._later = spill.SortedSpill(work, key=operator.itemgetter(0, 1))  # `match`'s left
        self._by_content = spill.SortedSpill(work, key=operator.itemgetter(0, 1))
        self._problems = problems
        self.totals: collections.Counter = collections.Counter()
        self.per_split: collections.Counter = collections.Counter()
        self.checked = 0  # sources checked so far
        self._spans: list[tuple[str, str, str, str]] = []  # one per shard
        self._labels: collections.Counter = collections.Counter()  # (split, label) -> records

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
            else:
                key, row = value
                self._by_path.add((key, _ORDER[kind], kind, row))
                self.checked += kind == PAIR  # a source checked beside its record

    def add_listed(self, source: SourceFile) -> None:
        self.per_split[source.split] += 1
        # A tuple: a dataclass costs more to spill.
        listed = (source.path, source.label, source.split, source.problem)
        self._by_path.add((source.relpath, _ORDER[LISTED], LISTED, listed))

    def add_sources(self, rows: list[tuple[str, str, dict]]) -> None:
        for relpath, split, row in rows:
            self.per_split[split] += 1
            self._by_path.add((relpath, _ORDER[SOURCE], SOURCE, row))
        self.checked += len(rows)

    def match(self, dedupe: bool) -> Iterator[SourceFile]:
        """Judges each relative path whose sources are all checked; gives the listed
        sources no FOUND row speaks for (their path's rows wait for `add_checked`)."""
        for relpath, same in itertools.groupby(self._by_path.sorted(), key=operator.itemgetter(0)):
            same = list(same)
            if len(same) == 2:  # the usual: a source and its record, checked apart or beside
                (_, _, first_kind, first), (_, _, second_kind, second) = same
                if first_kind == SOURCE and second_kind == RECORD and "rejected" not in first:
                    self._judge_pair(relpath, first, second)
                    continue
                if first_kind == LISTED and second_kind == PAIR:
                    record, found = second
                    if verify_beside.same_source(first, found):
                        if "rejected" in found:
                            rows = {SOURCE: [found], RECORD: [record], REJECTED: []}
                            self._judge(relpath, rows, dedupe)
                        else:
                            self._judge_pair(relpath, found, record)
                        continue
            rows = {SOURCE: [], RECORD: [], REJECTED: [], LISTED: [], FOUND: [], PAIR: []}
            for _, _, kind, row in same:
                rows[kind].append(row)
            for record, found in rows.pop(PAIR):
                rows[RECORD].append(record)
                rows[FOUND].append(found)
            left = []
            for listed in rows.pop(LISTED):
                at = next((i for i, found in enumerate(rows[FOUND])
                           if verify_beside.same_source(listed, found)), None)  # fmt: skip
                if at is None:
                    left.append(SourceFile(listed[0], relpath, *listed[1:]))
                else:
                    rows[SOURCE].append(rows[FOUND].pop(at))
            del rows[FOUND]  # found beside a record, but not listed so: not a source
            if not left:
                self._judge(relpath, rows, dedupe)
                continue
            for kind, kind_rows in rows.items():
                for row in kind_rows:
                    self._later.add((relpath, _ORDER[kind], kind, row))
            yield from left

    def add_checked(self, rows: list[tuple[str, str, dict]]) -> None:
        """Rows of sources `match` gave."""
        for relpath, _, row in rows:
            self._later.add((relpath, _ORDER[SOURCE], SOURCE, row))
        self.checked += len(rows)

    def _judge_pair(self, relpath: str, source: dict, record: dict) -> None:
        """`_judge` of one source the converter stores and its record (`rules.check_pair`)."""
        problems, (sha256, row) = rules.check_pair(relpath, source, record)
        if problems:
            self._problems.extend(problems)
        self._by_content.add((sha256, _ORDER[SOURCE], row))

    def _judge(self, relpath: str, rows: dict[str, list[dict]], dedupe: bool) -> None:
        self._problems.extend(rules.check_path(relpath, rows, dedupe))
        content = rules.content_row(relpath, rows)
        if content is not None:
            self._by_content.add((content[0], _ORDER[SOURCE], content[1]))

    def check(self, found: manifest.Manifest) -> None:
        """The rules for the paths `match` left, then per content hash."""
        self._problems.extend(rules.span_problems(found, self._spans), FILES)
        self._problems.extend(rules.label_count_problems(found, self._labels), FILES)
        dedupe = bool(found.conversion.get("dedupe"))
        for relpath, same in itertools.groupby(self._later.sorted(), key=operator.itemgetter(0)):
            rows = {SOURCE: [], RECORD: [], REJECTED: []}
            for _, _, kind, row in same:
                rows[kind].append(row)
            self._judge(relpath, rows, dedupe)
        groups = cross_split = 0
        for _, same in itertools.groupby(self._by_content.sorted(), key=operator.itemgetter(0)):
            rows, reported = [], []
            for _, order, row in same:
                (rows if order == _ORDER[SOURCE] else reported).append(row)
            found_problems, group, across = rules.check_content(rows, reported, found)
            self._problems.extend(found_problems)
            groups, cross_split = groups + group, cross_split + across
        self._problems.extend(rules.group_count_problems(found, groups, cross_split), FILES)


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


def _batches(items: Iterable, size: int = load.BATCH) -> Iterator[list]:
    items = iter(items)
    while batch := list(itertools.islice(items, size)):
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
            self._line.finish(f"  verify: {checked} sources checked")
