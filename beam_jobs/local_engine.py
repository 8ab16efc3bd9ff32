"""The conversion on this machine without Beam's runner: the steps of `pipeline.py`, on a
worker process per core, in memory that does not grow with the number of inputs.

Beam's local runner holds each step's whole output until the next step reads it: about 3 KB
per input, so ten million inputs needed some 30 GB. Here the listing streams to worker
processes (`local_workers`) that check the inputs; the small entries they give back go
through sorts on disk (`spill.py`): by content for the duplicate report, by record key for
the shards, by split and path for the rejection lists; then the workers write the shards,
reading the sources again (`shard_writer.write_shard`), as on Beam. Where the shards are
plain TFRecord on local disk, each input is read once instead: the listing comes first, and
the workers write the records as they check the inputs (`pieces.py`), with their entries
in record order, and their hashes sorted, in files the launcher takes whole: it merges the
hashes to find the inputs with the same bytes, and gives each shard's worker, by counts
alone, the runs of records it takes from the pieces (the launcher's work an input is the
job's limit on a many-core machine: benchmarks/RESULTS.md, "the launchers pass files").
The same functions decide every input's fate and every record's place, so the dataset is
the Beam pipeline's, byte for byte (tests/test_engines.py). What is held at once: RUN_ITEMS
entries per sort, a window of batches, pieces and shards in flight, and one group of
inputs with the same bytes.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import json
import logging
import operator
import os
import time
from collections.abc import Iterable, Iterator

import tfrecord_pipe
from beam_jobs import csv_lists, duplicates, finalise, load, local_workers, outcome, pieces
from beam_jobs import shard_plan, sources, spill, storage, summary, work_folder, worker_pool
from beam_jobs import worker_progress
from beam_jobs.config import ConvertConfig
from beam_jobs.source_file import SourceFile, rejection
from tfrecord_pipe._core import naming, paths
from tfrecord_pipe._core.rejection import Rejection

LOG = logging.getLogger(__name__)
SPILL_NAME = "tfrecord-pipe-spill-"  # in the job's temporary folder (a local output), or TMPDIR
LINES_PER_WRITE = 1024  # lines of a rejection or duplicate list written at once
SIZE_SAMPLE = 16  # one input in this many has its size read, to plan shards by size
# The sorts' files at their largest, per input, for a full disk's message: 0.58 measured at
# 50,000 small images named like "label_042/image_01234.jpg", rounded up; longer names take
# more.
SORTS_KB_AN_INPUT = 0.6


def run(
    config: ConvertConfig,
    temp_dir: str,
    fixed_labels: tuple[str, ...] | None,
    progress_dir: str | None = None,
    version: str = tfrecord_pipe.__version__,
    processes: int | None = None,
    claimed_by: str | None = None,
) -> None:
    """Converts as `pipeline.build_pipeline` does: outputs land in `temp_dir`, then are
    finalised into the output folder (`finalise.finalise`, which raises NothingWrittenError
    when every input was rejected, and ClaimLostError when run `claimed_by` lost the output's
    claim). `progress_dir`: where the progress line's counts go.

    Raises:
      ValueError, FileNotFoundError: bad input found while listing (its message says what
        to do); nothing is left in the output folder.
      worker_pool.WorkerError: a worker failed (storage, a source changed while the job ran), or
      BrokenProcessPool: one was killed; nothing is finalised.
    """
    paths.make_local_folder(temp_dir)
    spill_parent = None if paths.is_remote(temp_dir) else temp_dir
    with work_folder.work_folder(SPILL_NAME, spill_parent) as spill_dir:
        processes = processes or worker_pool.processes()
        reads_once = pieces.reads_once(config, temp_dir)
        try:
            started = (config, temp_dir, fixed_labels, reads_once)
            with worker_pool.pool(processes, local_workers.start, started) as pool:
                job = _Job(config, temp_dir, spill_dir, pool, processes, progress_dir)
                if reads_once:
                    labels = job.check_and_write(fixed_labels)
                else:
                    labels = job.check(fixed_labels)
                shards = job.write_shards(labels)
        except (ValueError, FileNotFoundError, FileExistsError):
            storage.delete_folder(temp_dir)  # the listing found bad input: no run to clear up
            raise
        except worker_pool.WorkerError as err:
            LOG.error("A worker failed:\n%s", err.worker_traceback)  # shown with --verbose
            raise
        job.write_lists()
        storage.write_bytes(
            paths.join(temp_dir, finalise.SUMMARY_NAME),
            summary.Summary.of(shards, job.count_rows(), labels, job.duplicate_totals,
                               [(*key, n) for key, n in job.label_counts.items()])
            .to_json().encode("utf-8"),
            mime_type="application/json",
        )
    finalise.finalise(config, temp_dir, version, claimed_by=claimed_by)


class _Job:
    """One run's state in the launching process: the sorts on disk and the counts."""

    def __init__(self, config: ConvertConfig, temp_dir: str, spill_dir: str, pool,
                 processes: int, progress_dir: str | None):  # fmt: skip
        self._config = config
        self._temp_dir = temp_dir
        self._pool = pool
        self._processes = processes
        self._window = processes * worker_pool.IN_FLIGHT
        self._progress_dir = progress_dir
        self._by_content = spill.SortedSpill(spill_dir, key=lambda entry: entry[1].sha256)
        self._by_key = spill.SortedSpill(spill_dir, key=operator.itemgetter(0, 1))
        self._rejected = spill.SortedSpill(spill_dir, key=operator.itemgetter(0, 1, 2))
        self._groups = spill.SortedSpill(spill_dir, key=operator.itemgetter(0))
        self._spill_dir = spill_dir
        self._counts: collections.Counter = collections.Counter()  # (split, reason) -> n
        self.duplicate_totals: collections.Counter = collections.Counter()
        self.label_counts: collections.Counter = collections.Counter()  # (split, label) -> records
        self._seen = self._seen_rejected = 0  # inputs checked, and rejected by the checks
        self._reported = time.monotonic()
        # With the records written as checked (`pieces.py`): each piece's file and split.
        self._pieces: list[str] = []
        self._piece_splits: list[str] = []
        self._written: list[pieces.Written] = []  # each piece's, once its worker is done
        self._named = 0  # pieces below this one no longer have their own name (`_cuts`)
        # The pieces' records' entries, in files their workers write (`pieces.Done`): kept in
        # record order, with (sha256, piece, index in it) of each sorted to find the inputs
        # with the same bytes; the entries are read here only for those, and by the workers
        # that put the shards together.
        self._in_order = spill.Sequence(spill_dir)  # (split, pieces.InPiece tuple, where)
        self._contents = spill.SortedSpill(spill_dir)  # (sha256, piece, index in it)
        self._totals: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])

    def _report(self, force: bool = False, written: int = 0, to_write: int = 0,
                listed: int = 0) -> None:  # fmt: skip
        """The progress line's counts (`worker_progress`), at most every POLL_S."""
        now = time.monotonic()
        if self._progress_dir is None or (not force and now - self._reported < worker_progress.POLL_S):
            return
        self._reported = now
        worker_progress.report(self._progress_dir, "local", self._seen, self._seen_rejected,
                               written, to_write, listed)  # fmt: skip

    def _reject(self, row: Rejection) -> None:
        self._counts[row.split, row.reason] += 1
        self._rejected.add((row.split, row.path, row.to_json()))

    def check(self, fixed_labels: tuple[str, ...] | None) -> tuple[str, ...]:
        """Lists and checks every input; returns the dataset's labels."""
        found = set()

        def inputs() -> Iterator[list[SourceFile]]:
            batch = []
            for source in self._listed(fixed_labels):
                if source.class_label is not None:
                    found.add(source.class_label)
                batch.append(source)
                if len(batch) == load.BATCH:
                    yield batch
                    batch = []
            if batch:
                yield batch

        for future in load.in_order(self._pool, local_workers.check, inputs(), self._window):
            for result in future.result():
                self._seen += 1
                if isinstance(result, Rejection):
                    self._seen_rejected += 1
                    self._reject(result)
                else:
                    self._by_content.add((*result, None))  # no piece holds its record
            self._report()
        self._report(force=True)
        return fixed_labels if fixed_labels is not None else tuple(sorted(found))

    def check_and_write(self, fixed_labels: tuple[str, ...] | None) -> tuple[str, ...]:
        """Lists every input, then checks them and writes their records into pieces, placed
        as if every input were used (`pieces.py`); returns the dataset's labels."""
        listed = spill.SortedSpill(self._spill_dir, key=operator.itemgetter(0, 1))
        found, counts = set(), collections.Counter()
        sizes = collections.defaultdict(lambda: [0, 0])  # split -> [inputs sized, their bytes]
        known = local_workers.AnyLabel() if fixed_labels is None else frozenset(fixed_labels)
        refused_here = 0
        for source in self._listed(fixed_labels):
            if source.class_label is not None:
                found.add(source.class_label)
            refused = outcome.refused_unread(source, known)
            if refused is not None:  # decided here as a worker would, without reading it
                refused_here += 1
                self._reject(rejection(source, refused.reason, refused.detail))
                continue
            listed.add((source.split, shard_plan.order_key(source.relpath),
                        source.as_tuple()))  # fmt: skip
            counts[source.split] += 1
            if counts[source.split] % SIZE_SAMPLE == 1:
                sizes[source.split][0] += 1
                sizes[source.split][1] += _record_size(source)
                self._report(listed=len(listed))
        self._report(force=True, listed=len(listed))  # said until the first piece is back
        labels = fixed_labels if fixed_labels is not None else tuple(sorted(found))
        planned = self._pieces_of(listed, counts, sizes, labels)
        window = self._processes * pieces.IN_FLIGHT
        for future in load.in_order(self._pool, local_workers.write_piece, planned, window):
            done = future.result()
            self._seen += refused_here + done.records + len(done.rejected)
            self._seen_rejected += refused_here + len(done.rejected)  # with the first piece's
            refused_here = 0
            for rejected in done.rejected:
                self._reject(rejected)
            self._in_order.adopt(done.in_order)
            self._contents.adopt([done.contents])
            self.label_counts.update(done.label_counts)
            for split, (n, size) in done.totals.items():
                self._totals[split][0] += n
                self._totals[split][1] += size
            self._written.append(pieces.Written(done.in_order, done.records))
            self._report()
        self._seen += refused_here  # none was left to read
        self._seen_rejected += refused_here
        self._report(force=True)
        return labels

    def _pieces_of(self, listed: spill.SortedSpill, counts: collections.Counter,
                   sizes: dict[str, list[int]], labels: tuple[str, ...]):  # fmt: skip
        """The pieces of every split's shards, planned as if every listed input were used:
        a piece a shard, of at most PIECE_INPUTS; where there are fewer shards than
        PIECES_PER_PROCESS a worker, pieces small enough to make that many."""
        plans = {}
        for split, n in counts.items():
            sized, size = sizes[split]
            plans[split] = shard_plan.num_shards(n, n * size // max(1, sized),
                                                 self._config.num_shards,
                                                 self._config.shard_bytes)  # fmt: skip
        most = pieces.PIECE_INPUTS
        wanted = pieces.PIECES_PER_PROCESS * self._processes
        if self._processes > 1 and sum(plans.values()) < wanted:  # one worker: no gain
            most = min(most, max(1, -(-sum(counts.values()) // wanted)))
        for split, entries in itertools.groupby(listed.sorted(), key=operator.itemgetter(0)):
            for length in shard_plan.shard_lengths(counts[split], plans[split]):
                for piece_length in shard_plan.shard_lengths(length, -(-length // most)):
                    taken = itertools.islice(entries, piece_length)
                    entries_path = spill.write_file(self._spill_dir,
                                                    (entry for _, _, entry in taken), ".piece")
                    path = os.path.join(self._spill_dir, f"piece-{len(self._pieces):07d}.tfrecord")
                    self._pieces.append(path)
                    self._piece_splits.append(split)
                    yield pieces.Piece(len(self._pieces) - 1, entries_path, path, labels)

    def _listed(self, fixed_labels: tuple[str, ...] | None) -> Iterator[SourceFile]:
        """Every input listed, counted; a CSV's files named twice kept once (the others
        rejected by the workers, as `pipeline.DropDuplicatePaths` rejects them)."""
        listed = sources.list_sources(self._config)
        if self._config.layout == "csv":
            known = None if fixed_labels is None else frozenset(fixed_labels)
            listed = csv_lists.kept_once(listed, self._spill_dir, labels=known)
        for source in listed:
            self._counts[source.split, None] += 1
            yield source

    def write_shards(self, labels: tuple[str, ...]) -> list[summary.ShardWritten]:
        """Groups the checked inputs by content (the duplicate report; --dedupe), then writes
        the shards in key order, or puts them together from the pieces written as the inputs
        were checked; returns what was written."""
        if self._pieces:
            dropped = self._grouped_in_order()
        else:
            self._group_by_content(labels)
        totals = self._totals
        plans = {
            split: shard_plan.num_shards(n, size, self._config.num_shards, self._config.shard_bytes)
            for split, (n, size) in totals.items()
        }
        examples = {split: n for split, (n, _) in totals.items()}
        if self._pieces:
            task, shards = local_workers.put_together, self._cuts(plans, examples, dropped)
        else:
            task, shards = local_workers.write, self._shard_files(plans, examples)
        written, to_write, done = [], sum(examples.values()), 0
        self._report(force=True, to_write=to_write)
        for future in load.in_order(self._pool, task, shards, self._window):
            files = future.result()
            written.extend(files)
            done += files[0].count if files else 0  # a shard in two formats is two files
            self._report(written=done, to_write=to_write)
        self._report(force=True, written=done, to_write=to_write)
        self._let_go(len(self._pieces))  # pieces of no record; all of them where no links
        return written

    def _count(self, split: str, label: str, size: int, n: int) -> None:
        """Counts a record (`size`: load.Checked's) in (n=1) or out (n=-1) of its split's
        totals and label counts."""
        self.label_counts[split, label] += n
        totals = self._totals[split]
        totals[0] += n
        totals[1] += n * size

    def _report_group(self, sha256: str, pairs: list) -> tuple | None:
        """Reports a group of (split, Checked or pieces.InPiece) with the same bytes, if more
        than one; with --dedupe, rejects all but the first by path, and returns the one kept."""
        row = duplicates.group_row(sha256, pairs)
        if row is None:
            return None
        self._groups.add((duplicates.report_order(row), json.dumps(row, sort_keys=True)))
        self.duplicate_totals.update(dict(duplicates.totals(row)))
        if not self._config.dedupe:
            return None
        first, others = duplicates.keep_first(pairs)
        for dropped in others:
            self._reject(dropped)
        return first

    def _group_by_content(self, labels: tuple[str, ...]) -> None:
        """The duplicates of the inputs checked before any was written: each group reported,
        and the records kept sorted by key (`_by_key`), with their labels' indexes."""
        index = {label: i for i, label in enumerate(labels)}
        by_content = self._by_content.sorted()
        for sha256, same in itertools.groupby(by_content, key=lambda entry: entry[1].sha256):
            same = list(same)  # (split, Checked, None)
            first = self._report_group(sha256, [(split, checked) for split, checked, _ in same])
            if first is not None:
                same = [entry for entry in same if entry[1] is first[1]]
            for split, checked, where in same:
                if checked.label_index != index[checked.label_text]:  # -1: labels were unknown
                    checked = checked.with_label_index(index[checked.label_text])
                self._by_key.add((split, checked.key, checked, where))
                self._count(split, checked.label_text, checked.size, 1)

    def _grouped_in_order(self) -> spill.SortedSpill:
        """The duplicates of the records written into pieces (`_in_order`, whose labels are
        right): each group reported; (piece, index in it) of the records --dedupe drops,
        sorted.
        Only the (sha256, piece, index in it) of each is sorted; a group's entries are then
        picked up in one pass, where there is any group."""
        members = spill.SortedSpill(self._spill_dir)  # ((piece, index), sha256) in a group
        last_sha256 = last_at = None
        grouped = False
        for sha256, piece, index in self._contents.sorted():
            at = (piece, index)
            if sha256 == last_sha256:
                if not grouped:
                    members.add((last_at, sha256))
                    grouped = True
                members.add((at, sha256))
            else:
                grouped = False
            last_sha256, last_at = sha256, at
        dropped = spill.SortedSpill(self._spill_dir)
        if not len(members):
            return dropped
        groups = spill.SortedSpill(self._spill_dir)  # (sha256, number, InPiece tuple, at)
        wanted = members.sorted()
        want = next(wanted)
        last_piece = index = None
        for number, (_, written, (piece, _)) in enumerate(self._in_order):
            index = index + 1 if piece == last_piece else 0
            last_piece = piece
            if (piece, index) == want[0]:
                groups.add((want[1], number, written, want[0]))
                want = next(wanted, None)
                if want is None:
                    break
        for sha256, same in itertools.groupby(groups.sorted(), key=operator.itemgetter(0)):
            same = [(at, pieces.InPiece(*written)) for _, _, written, at in same]
            first = self._report_group(sha256, [(written.split, written) for _, written in same])
            for at, written in same:
                if first is not None and written is not first[1]:
                    dropped.add(at)
                    self._count(written.split, written.label_text, written.size, -1)
        return dropped

    def _in_shards(self, plans: dict[str, int], examples: dict[str, int]):
        """(split, index, shards, its (split, key, Checked, where) entries in key order) per
        shard, in order."""
        for split, entries in itertools.groupby(self._by_key.sorted(), key=operator.itemgetter(0)):
            shards, n = plans[split], examples[split]
            ranked = enumerate(entries)
            of_rank = lambda ranked_entry: shard_plan.shard_of_rank(ranked_entry[0], n, shards)  # noqa: E731
            for shard, in_shard in itertools.groupby(ranked, key=of_rank):
                yield split, shard, shards, (entry for _, entry in in_shard)

    def _shard_files(self, plans: dict[str, int], examples: dict[str, int]):
        """(split, index, shards, file of its entries in key order) per shard, in order: each
        shard's entries go to a file of their own, so a worker reads them as it writes."""
        for split, shard, shards, entries in self._in_shards(plans, examples):
            path = spill.write_file(self._spill_dir, (checked for _, _, checked, _ in entries),
                                    ".shard")  # fmt: skip
            yield split, shard, shards, path

    def _cuts(self, plans: dict[str, int], examples: dict[str, int], dropped: spill.SortedSpill):
        """Per shard, in order, what a worker makes its file of (`local_workers.put_together`):
        the runs of records it takes of each piece (`pieces.Take`), read through its own hard
        links to the pieces; a piece's own name is removed once every shard that reads it
        has its link, so that its bytes go with the last link (pieces.py, "Disk"). Only
        counts are handled here, not records: the worker reads their entries."""
        links = pieces.Links()
        drops = dropped.sorted()  # (piece, index in it), in record order
        drop = next(drops, None)
        number = 0  # of the shard, among every split's

        def kept_of(numbers):  # (piece, records kept, indexes dropped) of each of a split's
            nonlocal drop
            for piece in numbers:
                gone = []
                while drop is not None and drop[0] == piece:
                    gone.append(drop[1])
                    drop = next(drops, None)
                yield piece, self._written[piece].records - len(gone), tuple(gone)

        split_of = self._piece_splits.__getitem__
        for split, numbers in itertools.groupby(range(len(self._pieces)), key=split_of):
            kept = kept_of(numbers)
            if not examples.get(split):  # every input of the split rejected or dropped
                collections.deque(kept, maxlen=0)  # its drops passed over
                continue
            shards = plans[split]
            for shard, takes in pieces.shards_taking(kept, examples[split], shards):
                paths_of = {take.piece: links.of(self._pieces[take.piece], number)
                            for take in takes}  # fmt: skip (a take a piece)
                last = takes[-1].piece
                if links.work:  # no shard still to come reads a piece below this one's last
                    self._let_go(last)
                whole = len(takes) == 1 and takes[0].whole(self._written[last].records)
                path = paths.join(self._temp_dir, naming.shard_name(split, shard, shards, False))
                reads = [(paths_of[take.piece], self._written[take.piece].in_order, take)
                         for take in takes]  # fmt: skip
                yield (split, shard, shards), path, reads, whole, links.work
                number += 1

    def _let_go(self, below: int) -> None:
        """Removes the own names of the pieces below `below` (`_cuts`)."""
        for piece in range(self._named, below):
            with contextlib.suppress(FileNotFoundError):  # a whole piece renamed, no links
                os.remove(self._pieces[piece])
        self._named = max(self._named, below)

    def write_lists(self) -> None:
        """rejected/rejected-<split>.jsonl (lines by path) and duplicates.jsonl (groups in
        `duplicates.report_order`), written as `pipeline.WriteRejected` and
        `pipeline.WriteDuplicates` write them."""
        temp_dir = self._temp_dir
        for split, rows in itertools.groupby(self._rejected.sorted(), key=operator.itemgetter(0)):
            _write_lines(paths.join(temp_dir, naming.rejected_name(split)),
                         (line for _, _, line in rows))  # fmt: skip
        if len(self._groups):
            _write_lines(paths.join(temp_dir, naming.DUPLICATES_NAME),
                         (line for _, line in self._groups.sorted()))  # fmt: skip

    def count_rows(self) -> list[summary.SplitCount]:
        return [summary.SplitCount(split, reason, n) for (split, reason), n in self._counts.items()]


def _write_lines(path: str, lines: Iterable[str]) -> None:
    def chunks():
        lines_left = iter(lines)
        while chunk := list(itertools.islice(lines_left, LINES_PER_WRITE)):
            yield "".join(line + "\n" for line in chunk).encode("utf-8")

    storage.write_chunks(path, chunks(), mime_type="application/x-ndjson")


def _record_size(source: SourceFile) -> int:
    """About the bytes of `source`'s record, from its file's size (0 where unknown): only
    the shards' planned count depends on it, which is checked once the records are written."""
    try:
        size = os.stat(source.path).st_size if not paths.is_remote(source.path) else 0
    except (OSError, ValueError):  # the worker reads it, and says what is wrong
        size = 0
    return shard_plan.record_size(size, source.relpath, source.label)
