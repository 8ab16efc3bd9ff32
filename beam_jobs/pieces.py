"""Shards written as their inputs are checked: each input read once, on the local engine.

The two-read way (`shard_writer.py`) checks every input, then reads each one again to write
its record, once the records' places are known; on photos its second read cost a fifth of
the workers' CPU (benchmarks/RESULTS.md, "Conversion: each local input read once"). Here the
launcher lists every input first, and places the records as if every input were used: a
*piece* is a run of consecutive records of one such shard. A worker checks a piece's inputs
and writes the record of each one used into the piece's file, from the bytes it checked.
Once every input is checked the places are known: a shard that is one whole piece takes the
piece's file; any other (inputs were rejected or dropped as duplicates, or a shard was cut
into several pieces to keep every worker busy) is copied together from the byte ranges of
the pieces that hold its records. The records, and their places, are those the two-read way
writes (tests/test_local_engine.py).

Disk: each shard made of pieces is given its own hard link to each piece it reads, and
removes it once copied; the launcher removes a piece's own name once every shard that reads
it has its link. So a piece's bytes are freed as soon as the last shard that needs them has
copied them, in whatever order the workers finish: the job holds the dataset on disk and a
piece for each shard being copied (1.1x-1.2x the dataset where every shard is copied, with
2 to 32 workers). Where the disk takes no hard links, the pieces stay until the end: up to
twice the dataset.

Only plain TFRecord shards are cut so (a GZIP stream or an ArrayRecord file cannot be cut
at a record), written on local disk from inputs listed quickly (a folder on local disk or a
CSV list); the other jobs read their inputs twice.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import logging
import os
from typing import NamedTuple

from beam_jobs import load, record_writer, shard_plan, spill, storage
from beam_jobs.config import ConvertConfig
from beam_jobs.source_file import SourceFile
from tfrecord_pipe._core import manifest, naming, paths

LOG = logging.getLogger(__name__)
# Inputs a piece holds at most: a worker holds their entries at once (a few hundred bytes
# each), before writing them beside the piece (`Done`).
PIECE_INPUTS = 4096
# Where there are fewer shards than this many a worker (and more than one worker), they are
# cut into that many pieces a worker, so that every worker has work to the end (at the
# price of copying the shards).
PIECES_PER_PROCESS = 2
# Pieces per worker given out ahead: enough that none waits, each piece being many inputs.
IN_FLIGHT = 2
COPY_CHUNK = 1 << 20  # bytes copied at a time from a piece into a shard


def reads_once(config: ConvertConfig, temp_dir: str) -> bool:
    """Whether the job writes its shards as it checks its inputs (above)."""
    return (
        config.formats == (naming.TFRECORD,)
        and not config.compress
        and not paths.is_remote(temp_dir)
        and not paths.is_remote(config.source)
    )


@dataclasses.dataclass(frozen=True)
class Piece:
    """A worker's task: inputs to check, whose records go to one file.

    Attributes:
      number: the piece's place among the job's pieces, in record order.
      entries: file of the inputs, as `SourceFile.as_tuple` gives them, in record order
        (`spill.write_items`).
      path: where the records go; what the launcher keeps of them goes beside it (`Done`).
      labels: the dataset's labels, each record's label index its place here.
    """

    number: int
    entries: str
    path: str
    labels: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Done:
    """What a worker gives back of a piece: the records' entries in files beside it, for the
    launcher to take without reading them one by one (at 500,000 inputs their unpickling,
    spilling and counting were a third of its CPU), and the sums of them.

    Attributes:
      in_order: file of (split, `InPiece` tuple, (piece number, offset in its file)) of each
        record, in record order (`spill.write_items`).
      contents: file of (sha256, piece number, index in the piece) of each record, sorted:
        a run for the sort that finds the inputs with the same bytes.
      rejected: the rejections of the piece's inputs.
      label_counts: records per (split, label).
      totals: per split, [records, the sum of their `load.Checked.size`].
    """

    in_order: str
    contents: str
    rejected: list
    label_counts: collections.Counter
    totals: dict[str, list[int]]

    @property
    def records(self) -> int:
        return sum(self.label_counts.values())


class Written(NamedTuple):
    """What the launcher keeps of a piece once written (`Done`): its entries' file and its
    records."""

    in_order: str
    records: int


class Take(NamedTuple):
    """A run of a shard's records in one piece: those kept from the `first` to before the
    `end` (counted among the kept), the records at the indexes `dropped` (--dedupe's) left
    out."""

    piece: int
    first: int
    end: int
    dropped: tuple[int, ...]

    def whole(self, records: int) -> bool:
        """Whether this is every record of a piece of `records`."""
        return self.first == 0 and self.end == records and not self.dropped


def shards_taking(kept, num_examples: int, shards: int):
    """(shard, its `Take`s in order) of each shard of a split with records, in order, from
    the split's pieces in order as (piece, records kept, indexes dropped): the shards hold
    the records ranked as `shard_plan.shard_lengths` says, as the two-read way ranks them."""
    lengths = iter(enumerate(shard_plan.shard_lengths(num_examples, shards)))
    shard, wanted = next(lengths, (None, 0))  # none: a split of no record (--dedupe's)
    takes = []
    for piece, count, dropped in kept:
        first = 0
        while first < count:
            while not wanted:  # a shard of no record (none is planned so): none is written
                shard, wanted = next(lengths)
            end = min(count, first + wanted)
            takes.append(Take(piece, first, end, dropped))
            wanted -= end - first
            first = end
            if not wanted:
                yield shard, takes
                takes = []
    if takes or wanted or any(length for _, length in lengths):  # a bug of ours: said
        raise AssertionError(f"the pieces' records kept do not add up to {num_examples}")


class InPiece(NamedTuple):
    """A record written into a piece, as the launcher keeps it: only what places, counts and
    groups it. Written and read as a plain tuple in this order (a tuple of strings and
    numbers pickles cheapest, and the garbage collector stops following it); made an InPiece
    only where its names help, for the few inputs with the same bytes as another.

    Attributes:
      split, relpath, path, label_index, label_text, sha256, size: as in `load.Checked`.
      length: the bytes the record takes in the piece's file.
    """

    split: str
    relpath: str
    path: str
    label_index: int
    label_text: str
    sha256: str
    size: int
    length: int


def write(piece: Piece, checker: load.Checker, label_offset: int) -> Done:
    """Checks the piece's inputs and writes the record of each one used; what it wrote."""
    index = {label: i for i, label in enumerate(piece.labels)}
    checker.set_labels(index, index)
    in_order, contents, rejected = [], [], []
    label_counts, totals = collections.Counter(), collections.defaultdict(lambda: [0, 0])

    def with_image(source, result):
        return checker.entry(source, result), result.stored

    with record_writer.RecordWriter(piece.path) as writer:
        sources = (SourceFile(*entry) for entry in spill.read_items(piece.entries))
        offset = 0
        while batch := list(itertools.islice(sources, load.BATCH)):
            for (source, checked, _, rejection), stored in checker.decide(batch, with_image):
                if checked is None:
                    rejected.append(rejection)
                    continue
                record = load.serialized_record(checked, stored.encoded, label_offset)
                writer.write(record)
                length = record_writer.framed_length(record)
                split, label = source.split, checked.label_text
                written = (split, checked.relpath, checked.path, checked.label_index, label,
                           checked.sha256, checked.size, length)  # fmt: skip
                contents.append((checked.sha256, piece.number, len(in_order)))
                in_order.append((split, written, (piece.number, offset)))
                label_counts[split, label] += 1
                totals[split][0] += 1
                totals[split][1] += checked.size
                offset += length
    contents.sort()
    folder = os.path.dirname(piece.path)
    return Done(spill.write_file(folder, in_order, ".in-order"),
                spill.write_file(folder, contents, ".contents"), rejected, label_counts,
                dict(totals))  # fmt: skip


def cut(reads: list[tuple[str, str, Take]]) -> Cut:
    """A shard's records, given as (piece's file, its entries' file, `Take`) of each run:
    read from the entries, in a worker rather than the launcher (each costs a few µs)."""
    made = Cut()
    for _, entries, take in reads:
        dropped, kept = set(take.dropped), 0
        in_order = spill.read_items(entries, remove=False)
        for index, (_, written, (piece, offset)) in enumerate(in_order):
            if index in dropped:
                continue
            if kept >= take.end:
                break
            if kept >= take.first:
                made.add(piece, offset, written)
            kept += 1
    return made


class Cut:
    """One shard's records as byte ranges of the pieces that hold them, in order, and the
    shard's `manifest.ShardPositions` digest."""

    def __init__(self):
        self.ranges: list[tuple[int, int, int]] = []  # (piece number, offset, length)
        self.count = 0
        self._positions = manifest.ShardPositions()

    def add(self, piece: int, offset: int, written: tuple) -> None:
        """Adds the record `written` (`InPiece`'s fields) at `offset` in `piece`."""
        _, relpath, _, label_index, label_text, _, _, length = written
        if self.ranges and self.ranges[-1][0] == piece and sum(self.ranges[-1][1:]) == offset:
            self.ranges[-1] = (piece, self.ranges[-1][1], self.ranges[-1][2] + length)
        else:
            self.ranges.append((piece, offset, length))
        self.count += 1
        self._positions.add(relpath, label_index, label_text)

    def digest(self) -> str:
        return self._positions.hexdigest()


class Links:
    """Each shard's own hard links to the pieces it reads (above, "Disk"); where the disk
    takes none, the pieces themselves (`work` False), which then stay to the job's end."""

    def __init__(self):
        self.work = True

    def of(self, piece: str, shard_number: int) -> str:
        """The shard's link to `piece`, or `piece` itself where links do not work."""
        if self.work:
            link = f"{piece}.{shard_number}"
            try:
                os.link(piece, link)
                return link
            except OSError as err:
                if err.errno not in storage.NO_HARD_LINKS:
                    raise
                LOG.warning("The disk of %s takes no hard links (%s): the pieces of the "
                            "shards stay on it until the job ends, up to twice the dataset's "
                            "size.", os.path.dirname(piece), err.strerror)  # fmt: skip
                self.work = False
        return piece


def put_together(path: str, ranges: list[tuple[str, int, int]], whole: bool,
                 links: bool = True) -> int:  # fmt: skip
    """Makes the shard file `path` of `ranges` of pieces: the piece itself where `whole` (the
    one range is all of it), else a copy of each range in turn. With `links`, each piece
    named is this shard's own link to it, removed once its last range is copied. Returns the
    shard's size."""
    if whole:
        (piece, _, _), = ranges
        storage.put_in_place(piece, path)
        return os.path.getsize(path)
    last = {piece: i for i, (piece, _, _) in enumerate(ranges)}
    part = storage.part_path(path)
    with open(part, "wb") as shard:
        for i, (piece, offset, length) in enumerate(ranges):
            copy(piece, offset, length, shard)
            if links and last[piece] == i:
                os.remove(piece)
        size = shard.tell()
    storage.put_in_place(part, path)
    return size


def copy(piece: str, offset: int, length: int, shard) -> None:
    """Appends `length` bytes of the file `piece`, from `offset`, to the open file `shard`."""
    with open(piece, "rb", buffering=0) as source:
        source.seek(offset)
        end = offset + length
        while length:
            chunk = source.read(min(length, COPY_CHUNK))
            if not chunk:
                raise OSError(f"{piece} ended before byte {end}: it was changed or cut while "
                              "the job ran")  # fmt: skip
            shard.write(chunk)
            length -= len(chunk)
