"""The seeded training stream: each epoch a permutation of one pipeline's records, every choice
a function of (seed, epoch, position), and a stream that starts at any position.

One epoch, for a seed:

  the pipeline's files ("pieces": whole files, or every n-th record of them) in an order drawn
  from (seed, epoch) ─► groups of `cycle` pieces, each group read round-robin, one record of
  each piece in turn ─► windows of `window` records, each permuted by a draw from (seed,
  epoch, window number) ─► (epoch, index in the epoch, key, record)

Epochs follow each other without a gap. Nothing in it depends on thread timing or on what was
read before, so the records at a position can be worked out from the counts alone: a stream
started at (epoch, index) skips whole files without opening them, seeks inside the files of
the current group, re-reads at most one window, and decodes nothing it skips. The key is the
record's place in the split (its file's first record's number plus its place in the file),
0..N-1 over the split.

A record moves at most `window` places from where the group reading puts it (within a group,
records of its pieces alternate): the order is a draw of the file order, then a shuffle inside
windows (benchmarks/RESULTS.md, "Exact epochs").
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable

import numpy as np
import tensorflow as tf

# Streams of seeds, each folded into the epoch's seed: what each draw is made from.
_PIECE_ORDER, _WINDOW, _EXAMPLE = 0, 1, 2


@dataclasses.dataclass(frozen=True)
class Layout:
    """How one input pipeline's records are ordered.

    Attributes:
      files: the pieces' files.
      counts: records in each file (the whole file).
      firsts: the first record of each file this pipeline keeps; then every `stride`-th.
      starts: the number, in the split, of each file's first record (keys count from it).
      stride: 1 when the pipeline owns whole files, else the number of pipelines.
      cycle: pieces read round-robin at a time.
      window: records permuted together.
      seed: the run's seed.
      positions: which input is at each place of the split (`manifest.SplitInfo.positions`);
        "" when the manifest predates it.
    """

    files: tuple[str, ...]
    counts: tuple[int, ...]
    firsts: tuple[int, ...]
    starts: tuple[int, ...]
    stride: int
    cycle: int
    window: int
    seed: int
    positions: str = ""

    @property
    def sizes(self) -> tuple[int, ...]:
        """Records each piece gives this pipeline."""
        return tuple(
            len(range(first, count, self.stride)) for first, count in zip(self.firsts, self.counts)
        )

    @property
    def records_per_epoch(self) -> int:
        return sum(self.sizes)


def seed_pair(seed: int) -> tf.Tensor:
    """The [2] int64 seed of TensorFlow's stateless ops for a run's integer seed."""
    return tf.constant([seed & 0xFFFFFFFF, (seed >> 32) & 0xFFFFFFFF], tf.int64)


def draw_seed(layout: Layout, epoch, stream: int, number=None) -> tf.Tensor:
    """The seed of one draw: from the run's seed, the epoch, the kind of draw and its number."""
    fold = tf.random.experimental.stateless_fold_in
    seed = fold(seed_pair(layout.seed), tf.cast(epoch, tf.int64))
    seed = fold(seed, tf.constant(stream, tf.int64))
    if number is not None:
        seed = fold(seed, tf.cast(number, tf.int64))
    return seed


@tf.autograph.experimental.do_not_convert
def example_seed(layout: Layout, epoch, index) -> tf.Tensor:
    """The seed of one example's augmentation: its epoch and place in it."""
    return draw_seed(layout, epoch, _EXAMPLE, index)


def _permutation(size, seed) -> tf.Tensor:
    return tf.argsort(tf.random.stateless_uniform([size], seed), stable=True)


def piece_order(layout: Layout, epoch) -> tf.Tensor:
    """The pieces' order in `epoch`: a permutation of range(len(files))."""
    return _permutation(len(layout.files), draw_seed(layout, epoch, _PIECE_ORDER))


@dataclasses.dataclass(frozen=True)
class Position:
    """Where a stream is: `index` records of epoch `epoch` given out."""

    epoch: int
    index: int

    @classmethod
    def after(cls, records: int, layout: Layout) -> Position:
        """The position after `records` records from the start of epoch 0."""
        epoch, index = divmod(records, layout.records_per_epoch)
        return cls(epoch, index)


# (file, count, first, start, skip) -> (key, record) of the records a piece gives, `skip`
# of them already given.
PieceReader = Callable[..., tf.data.Dataset]


def fingerprint(layout: Layout) -> str:
    """What a position means: the pieces (file names, counts, which records, which inputs
    they hold), the grouping, the window and the seed. A position is only restored into a
    layout of the same one."""
    names = [file.rsplit("/", 1)[-1] for file in layout.files]
    facts = repr((names, layout.counts, layout.firsts, layout.starts, layout.stride,
                  layout.cycle, layout.window, layout.seed))  # fmt: skip
    if layout.positions:  # (not in the facts of a dataset whose manifest has none, as before)
        facts += layout.positions
    return hashlib.sha256(facts.encode()).hexdigest()[:16]


# The stream counts its records in a range whose high bits are the layout's fingerprint and
# low bits the place of the record in the whole stream (epoch * records_per_epoch + index).
# A TensorFlow checkpoint of the iterator holds the counter; a restore into another layout
# (another host count, dataset, seed or window), or into a stream built from another start
# (start_batches), finds a count that is not the place of the records that come: an error.
_COUNT_BITS = 40
_FINGERPRINT_BITS = 22
def other_records(saved: str, what: str, afresh: str = "start the input afresh") -> str:
    """The refusal of a position saved by a pipeline that reads other records; `afresh`: how
    the caller's input starts again from its first batch."""
    return (
        f"{saved} was saved by a pipeline that reads other records ({what}), so its position "
        f"means nothing here. Restore it with the settings it was saved with, or {afresh}."
    )


# What a position means, also named for a refusal (`seeded.position_facts`): the settings its
# fingerprint holds, and the dataset whole (a change in another host's files is refused too).
NAMED_ONLY = ("seed", "dataset", "shuffle_window", "cycle_length")


def differences(saved: dict, here: dict, batch_of: str = "a replica's") -> str:
    """The settings of a saved position's record that differ from `here`'s, in words ("" for
    none); one only named (NAMED_ONLY) counts where the record has it (records of 0.4 and
    before do not). The record's batch_size is `batch_of` one replica or host: named so,
    since the same global batch over another count of them differs too."""
    differ = [name for name in here
              if (name in saved or name not in NAMED_ONLY) and saved.get(name) != here[name]]  # fmt: skip
    # Names that say what changed where the values are digests or per-replica numbers.
    named = {"batch_size": f"batch_size ({batch_of})",
             "dataset": "dataset (converted again from other inputs, or another one)"}
    return "; ".join(f"{named.get(name, name)}: saved {saved.get(name)}, here {here[name]}"
                     for name in differ)  # fmt: skip


EPOCH_MISMATCH = (
    "An epoch of this seeded input did not read each of its records once: its iterator was "
    "restored to a wrong place. Resume from a checkpoint saved before this epoch, or take "
    "distribute.resumable_iterator(...), which rebuilds the stream from a count "
    "(docs/preemption.md)."
)
MISMATCH = other_records(
    "This input pipeline's checkpoint",
    "another dataset, seed, host count, batch or shuffle setting, or a stream built from "
    "another start: build it with start_batches=0, the checkpoint holds the position",
    "restore the checkpoint without the iterator: one not restored starts at its first batch",
)


def stream(layout: Layout, read_piece: PieceReader, start: Position = Position(0, 0)):
    """(epoch, index, key, record) for ever, from `start`."""
    window = layout.window
    first_window = start.index // window
    resumed = _group_table(layout, start.epoch, first_window * window)
    per_epoch = layout.records_per_epoch
    mark = (int(fingerprint(layout), 16) % (1 << _FINGERPRINT_BITS)) << _COUNT_BITS
    first_count = mark + start.epoch * per_epoch + start.index

    @tf.autograph.experimental.do_not_convert
    def epoch_windows(epoch):
        at_start = tf.equal(epoch, start.epoch)
        table = tuple(map(tf.where, (at_start,) * 2, resumed, _whole_groups(layout, epoch)))
        first = tf.where(at_start, tf.constant(first_window, tf.int64), 0)
        return _windows(layout, read_piece, epoch, table, first)

    @tf.autograph.experimental.do_not_convert
    def same_start(saved, epoch):
        """A restore rebuilds the current epoch from this stage before it reopens any file:
        a state saved by a stream of another layout or start is refused here, in words, and
        not by a file read at another's offset ("corrupted record", a short file)."""
        with tf.control_dependencies([tf.debugging.Assert(tf.equal(saved, first_count),
                                                          [MISMATCH])]):  # fmt: skip
            return saved, tf.identity(epoch)

    # Every epoch, the first one too, under one flat_map, and no zip, enumerate or concatenate
    # over a flat_map or an unbatch: TensorFlow 2.21's symbolic checkpoint of those loses the
    # place of what is under them once the iterator has been restored and saved again, and
    # the stream went back or on, silently, or read a file at another's offset
    # (tests/test_resume.py).
    numbers = tf.data.Dataset.range(start.epoch, np.iinfo(np.int64).max)
    numbers = numbers.scan(tf.constant(first_count, tf.int64), same_start)
    windows = numbers.flat_map(epoch_windows)
    # One window ahead: the next is read while this one is decoded (else reading a window and
    # decoding it take turns). Memory: two windows of serialized records. A window's records
    # are its slices, not an unbatch's: restored into windows of another size (another
    # shuffle_buffer), TensorFlow's unbatch reads past the window's end and the process died;
    # a slice past the end ends the window, and the position check below says what is wrong.
    slices = lambda *parts: tf.data.Dataset.from_tensor_slices(parts)  # noqa: E731
    records = windows.prefetch(1).flat_map(slices).skip(start.index - first_window * window)
    keys_sum = _keys_sum(layout)

    @tf.autograph.experimental.do_not_convert
    def checked(state, element):
        count, summed, whole = state
        epoch, index, key = element[0], element[1], element[2]
        same = tf.equal(count, mark + epoch * per_epoch + index)
        # Each epoch's keys, once each: their sum at its end, where the epoch was read from
        # its start. A restore to a wrong place of the reading (TensorFlow 2.21 made them,
        # above) leaves the places counting on: only the keys show it.
        summed = tf.where(tf.equal(index, 0), tf.constant(0, tf.int64), summed) + key
        whole = tf.logical_or(whole, tf.equal(index, 0))
        at_end = tf.logical_and(whole, tf.equal(index, per_epoch - 1))
        once_each = tf.logical_or(tf.logical_not(at_end), tf.equal(summed, keys_sum))
        with tf.control_dependencies([tf.debugging.Assert(same, [MISMATCH]),
                                      tf.debugging.Assert(once_each, [EPOCH_MISMATCH])]):
            return (count + 1, summed, whole), tuple(tf.identity(part) for part in element)

    # The count is a scan's state, open-ended (a restored count past a range's end would end
    # the stream without a word), and not a range zipped beside the records (above).
    state = (tf.constant(first_count, tf.int64), tf.constant(0, tf.int64), tf.constant(False))
    return records.scan(state, checked)


def _keys_sum(layout: Layout) -> int:
    """The sum of the keys of one epoch of this pipeline: every record it keeps, once."""
    total = 0
    for start, first, count in zip(layout.starts, layout.firsts, layout.counts):
        keys = range(start + first, start + count, layout.stride)
        total += len(keys) * (keys[0] + keys[-1]) // 2 if keys else 0  # not one by one
    return total


def _windows(layout: Layout, read_piece: PieceReader, epoch, groups, first) -> tf.data.Dataset:
    """One epoch's windows from window `first`, each shuffled: vectors of (epoch, index, key,
    record), for `stream` to slice. `groups`: the epoch's group table (`_group_table`)."""
    window = layout.window
    epoch = tf.cast(epoch, tf.int64)
    read = _group_reader(layout, read_piece)
    records = tf.data.Dataset.from_tensor_slices(groups).flat_map(read)

    @tf.autograph.experimental.do_not_convert
    def permute(number, batch):
        keys, serialized = batch
        size = tf.shape(keys)[0]
        order = _permutation(size, draw_seed(layout, epoch, _WINDOW, number))
        places = number * window + tf.range(tf.cast(size, tf.int64))
        return tf.fill([size], epoch), places, tf.gather(keys, order), tf.gather(serialized, order)

    # Counted by a scan, not `enumerate` (a zip: `stream` says why).
    counted = records.batch(window).scan(first, lambda number, batch: (number + 1, (number, batch)))
    return counted.map(permute)


# An epoch's group table: a row per group of `cycle` pieces, in reading order, each row the
# pieces (indices into the layout's files, in round-robin order; -1 pads a row) and how many
# records each has given already.


def _whole_groups(layout: Layout, epoch) -> tuple[tf.Tensor, tf.Tensor]:
    """The group table of `epoch` read from its start."""
    rows = -(-len(layout.files) // layout.cycle)
    order = tf.cast(piece_order(layout, epoch), tf.int64)
    padding = tf.fill([rows * layout.cycle - len(layout.files)], tf.constant(-1, tf.int64))
    members = tf.reshape(tf.concat([order, padding], 0), [rows, layout.cycle])
    return members, tf.zeros_like(members)


def _group_table(layout: Layout, epoch: int, given: int) -> tuple[np.ndarray, np.ndarray]:
    """The group table of `epoch` after its first `given` records, from the counts alone:
    the groups before the one `given` ends in are empty, and that one goes on where each of
    its pieces has got."""
    members, skips = (part.numpy() for part in _whole_groups(layout, epoch))
    sizes = np.asarray(layout.sizes)
    for row in range(len(members)):
        pieces = members[row][members[row] >= 0]
        in_group = int(sizes[pieces].sum())
        members[row] = -1
        if given < in_group:
            left, gave = round_robin_resume(sizes[pieces].tolist(), given)
            members[row][: len(left)] = pieces[left]
            skips[row][: len(left)] = gave
            break
        given -= in_group
    return members, skips


def _group_reader(layout: Layout, read_piece: PieceReader):
    """A group table's row to its pieces' (key, record), read round-robin from their skips."""
    columns = (
        tf.constant(layout.files),
        tf.constant(layout.counts, tf.int64),
        tf.constant(layout.firsts, tf.int64),
        tf.constant(layout.starts, tf.int64),
    )

    @tf.autograph.experimental.do_not_convert
    def read(members, skips):
        present = members >= 0
        members, skips = tf.boolean_mask(members, present), tf.boolean_mask(skips, present)
        pieces = tuple(tf.gather(column, members) for column in columns)
        inputs = tf.data.Dataset.from_tensor_slices((*pieces, skips))
        return inputs.interleave(read_piece, cycle_length=layout.cycle, block_length=1)

    return read


def round_robin_resume(sizes: list[int], given: int) -> tuple[list[int], list[int]]:
    """How to go on with a round-robin reading of pieces of `sizes` (one record of each in
    turn; a finished piece drops out) after `given` records: which pieces (by position in
    `sizes`), in which order, and how many records each has given already.

    Reading those pieces round-robin from their skips gives exactly the records that follow.
    """
    rounds = 0  # full rounds: every piece with records left gave one in each
    while sum(min(size, rounds + 1) for size in sizes) <= given:
        rounds += 1
    gave = [min(size, rounds) for size in sizes]
    active = [j for j, size in enumerate(sizes) if size > rounds]
    rest = given - sum(gave)
    for j in active[:rest]:
        gave[j] += 1
    start = active[rest] if rest < len(active) else 0
    rotated = [(start + offset) % len(sizes) for offset in range(len(sizes))]
    left = [j for j in rotated if gave[j] < sizes[j]]
    return left, [gave[j] for j in left]
