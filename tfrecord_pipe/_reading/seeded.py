"""The seeded training pipeline: a pipeline's share laid out as `epochs.py` orders it, read
piece by piece, parsed in order, each example augmented from its own seed."""

from __future__ import annotations

import os

import tensorflow as tf

from tfrecord_pipe._core import manifest
from tfrecord_pipe._reading import epochs, file_share, parse, records
from tfrecord_pipe._reading.reader_config import ReaderConfig, Source, resolve_source

# Parse-and-decode calls in flight per core in a seeded pipeline, whose order is fixed.
SEEDED_CALLS_PER_CORE = 2
# Records each piece reads ahead in a seeded pipeline (which reads its pieces in turn, on one
# thread): reading then overlaps across the pieces of a group, as a parallel interleave's does.
PIECE_READ_AHEAD = 16


def examples(config, source, share, batch: int, image_fn=None, start_batches: int = 0):
    """The seeded training pipeline's examples, unbatched, from `start_batches` batches of
    `batch` on: the order of `epochs.py`, parsed in order."""
    layout = seeded_layout(config, source, share)
    start = epochs.Position.after(start_batches * batch, layout)
    elements = epochs.stream(layout, _piece_reader(config, source, layout), start)
    parse_placed = _seeded_parse_fn(config, source, layout, image_fn)
    # In order, a slow decode holds back those behind it: twice a call per core in flight
    # hides it (benchmarks/RESULTS.md, "Reader: seeded training").
    return elements.map(
        parse_placed, num_parallel_calls=SEEDED_CALLS_PER_CORE * (os.cpu_count() or 1),
        deterministic=True,
    )  # fmt: skip


def pipeline_layout(
    config: ReaderConfig, input_context: tf.distribute.InputContext | None = None
) -> epochs.Layout:
    """The order of a seeded training pipeline's records: what its positions mean."""
    return _source_and_layout(config, input_context)[1]


def position_facts(config: ReaderConfig, input_context=None) -> dict:
    """What a position of this pipeline means, as a restore compares it: the layout's
    fingerprint, and the settings it holds that a refusal names (`epochs.NAMED_ONLY`)."""
    source, layout = _source_and_layout(config, input_context)
    split = source.split
    return {
        "seed": layout.seed,
        "dataset": manifest.split_identity(split.files, split.record_counts, split.positions),
        "shuffle_window": layout.window,  # the shuffle_buffer in effect: at most the records
        "cycle_length": layout.cycle,  # and the files read at a time
        "fingerprint": epochs.fingerprint(layout),
    }


def _source_and_layout(config: ReaderConfig, input_context) -> tuple[Source, epochs.Layout]:
    if not config.seeded:
        raise ValueError("Positions are for seeded training: set seed= (and is_training).")
    source = resolve_source(config)
    share = file_share.pipeline_share(source.split, input_context, config.is_training)
    return source, seeded_layout(config, source, share)


def seeded_layout(config: ReaderConfig, source: Source, share) -> epochs.Layout:
    """The order of a seeded training pipeline's records (`epochs.Layout`)."""
    if share.record_counts is None:
        raise ValueError(
            f"seed= needs the record counts a dataset folder's manifest gives, and {config.data} "
            "has none: read the dataset folder, not a file pattern, or leave seed=None."
        )
    starts, start = {}, 0
    for file, count in zip(source.split.files, source.split.record_counts):
        starts[file] = start
        start += count
    firsts, stride = share.firsts or (0,) * len(share.files), share.stride
    kept = [
        i for i, (first, count) in enumerate(zip(firsts, share.record_counts)) if first < count
    ]  # empty files give nothing, and are not opened
    if not kept:
        raise ValueError(file_share.nothing_read(share))
    total = sum(len(range(firsts[i], share.record_counts[i], stride)) for i in kept)
    return epochs.Layout(
        files=tuple(share.files[i] for i in kept),
        counts=tuple(share.record_counts[i] for i in kept),
        firsts=tuple(firsts[i] for i in kept),
        starts=tuple(starts[share.files[i]] for i in kept),
        stride=stride,
        cycle=min(config.cycle_length, len(kept)),
        window=min(config.shuffle_buffer, total),
        seed=config.seed,
        positions=source.split.positions,
    )


def _piece_reader(config, source, layout):
    """(file, count, first, start, skip) to the (key, record) pairs the piece gives."""
    read_file = records.shard_reader(
        source.compression, config.read_buffer_bytes, False, counted=True, catch=False
    )
    stride = layout.stride

    @tf.autograph.experimental.do_not_convert
    def read(file, count, first, start, skip):
        passed = skip * stride  # the file's records before this piece's next one
        keyed = read_file(file, count, passed, numbered_from=start)  # (not a zip: epochs.stream)
        if stride > 1:
            keyed = keyed.skip(first).shard(stride, 0)
        return keyed.prefetch(PIECE_READ_AHEAD)

    return read


def _seeded_parse_fn(config, source, layout, image_fn=None):
    """(epoch, index, key, record) to (image, label[, key]), the augmentation drawn from the
    example's seed (its epoch and place)."""
    parse_one = parse.parse_fn(config, source, image_fn)

    def parse_placed(epoch, index, key, record):
        image, label = parse_one(record, epochs.example_seed(layout, epoch, index))
        return (image, label, key) if config.with_keys else (image, label)

    return parse.converted_for(image_fn, parse_placed)
