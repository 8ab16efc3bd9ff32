"""The TPU-ready tf.data input pipeline of one input pipeline: `build_dataset`.

The pipeline, top to bottom (evaluation differs as noted):

  list files ─► this pipeline's share of the files ─► shuffle files, repeat (training)
  ─► parallel interleave of TFRecord readers (each checked against the manifest's counts)
  ─► shuffle records (training) ─► parse + decode + preprocess (`preprocess.py`), in parallel
  ─► [evaluation: pad with weight-0 examples] ─► batch(drop_remainder=True)
  ─► [transpose to HWCN] ─► [made by tf.data service workers] ─► prefetch

Every shape in the result is static, which is what XLA on a TPU needs. Parallel stages run one
call per core, without tf.data's autotuner unless asked for (`ReaderConfig.autotune`).
Beside it: `reader_config` says what to read and how, `input_fn` calls this the ways training
code does, `file_share` deals the files among pipelines, `records` reads shard files with
their counts checked, `parse` and `preprocess` make the examples, `padded` fills the last
evaluation batch, `seeded` is the seeded training order (`epochs`), `service` hands the
batching to tf.data service workers.

    input_fn = reader.make_input_fn("gs://bucket/dataset", "train", is_training=True,
                                    batch_size=1024)
    dataset = strategy.distribute_datasets_from_function(input_fn)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import tensorflow as tf

from tfrecord_pipe._core import arguments
from tfrecord_pipe._reading import buffer_memory, file_share, padded, parse, records, seeded, service
from tfrecord_pipe._reading.reader_config import (
    ReaderConfig,
    Source,
    data_options,
    per_replica,
    prefetch_size,
    resolve_source,
)


def read_records(
    config: ReaderConfig,
    input_context: tf.distribute.InputContext | None = None,
    *,
    source: Source | None = None,
) -> tf.data.Dataset:
    """Serialized records of one input pipeline, after the reading stages and before parsing.

    The first half of `build_dataset`: this pipeline's files, shuffled and repeated when
    training, read by a parallel interleave with their counts checked, records shuffled when
    training; with the same tf.data options. For tools and benchmarks that parse records
    their own way (`prefetch(prefetch_size(config))` at the end to match `build_dataset`).
    `source`: `resolve_source(config)`, when the caller has it already.
    """
    source = source or resolve_source(config)
    share = file_share.pipeline_share(source.split, input_context, config.is_training)
    return _records(config, source, share).with_options(data_options(config))


def build_dataset(
    config: ReaderConfig,
    input_context: tf.distribute.InputContext | None = None,
    batch_size: int | None = None,
    image_fn: Callable[[tf.Tensor], tf.Tensor] | None = None,
    *,
    source: Source | None = None,
    start_batches: int = 0,
) -> tf.data.Dataset:
    """The batched dataset of one input pipeline.

    Args:
      config: what to read and how.
      input_context: from `strategy.distribute_datasets_from_function`: this pipeline's share
        of the files and the per-replica batch size. None: one pipeline reading everything.
      batch_size: the batch size of THIS pipeline, overriding the one derived from
        `config.batch_size` (TPUEstimator-style `params["batch_size"]`).
      image_fn: replaces the preprocessing of `preprocess.py`: takes the JPEG bytes of one
        record (a scalar string tensor) and returns its image, [image_size, image_size, 3] of
        `config.dtype`. For your own augmentation; evaluation and serving should keep ours.
      source: `resolve_source(config)`, when the caller has it already.
      start_batches: seeded training: batches of this pipeline already trained on; the
        stream starts after them, skipping without decoding (`resume.py`). Not with a
        TensorFlow checkpoint of the iterator, which holds the position itself: restore that
        into a pipeline built with 0 (another start is refused).

    Returns:
      (images, labels) batches, plus weights when `config.padded`, plus keys with
      `config.with_keys`; labels are int32, 0-based.
    """
    batch_size = arguments.count("batch_size", batch_size, optional=True)
    start_batches = arguments.count("start_batches", start_batches)
    source = source or resolve_source(config)
    batch = _pipeline_batch_size(config, input_context, batch_size)
    share = file_share.pipeline_share(source.split, input_context, config.is_training)
    records = share.num_examples  # None where the counts are unknown
    if not config.is_training and not config.padded and records is not None and records < batch:
        raise ValueError(
            f"eval_remainder='drop' with batch {batch} over this pipeline's {records} records of "
            f"split {source.split.name!r}: no batch would come (evaluate would return nothing). "
            "Use eval_remainder='pad' (the default), or a smaller batch."
        )
    if config.is_training:
        file_share.warn_of_repeats_in_a_step(source.split, share, batch, input_context,
                                             global_batch=batch_size is None)  # fmt: skip
        buffer_memory.warn_if_too_large(share.files, source.compression,
                                        _shuffle_buffer(config, share))  # fmt: skip
    if start_batches < 0:
        raise ValueError(f"start_batches must be >= 0, got {start_batches}")
    if config.seeded:
        examples = seeded.examples(config, source, share, batch, image_fn, start_batches)
        examples = examples.batch(batch, drop_remainder=True)
        if config.transpose_input:
            examples = examples.map(_to_hwcn, num_parallel_calls=tf.data.AUTOTUNE)
        return examples.prefetch(prefetch_size(config)).with_options(data_options(config))
    if start_batches:
        raise ValueError("start_batches is for seeded training (ReaderConfig.seed)")
    serialized = _records(config, source, share)
    parse_one = parse.parse_fn(config, source, image_fn)
    if config.padded:
        examples = padded.padded_batches(config, source, serialized, parse_one, batch, input_context)
    else:
        examples = serialized.map(
            parse_one, num_parallel_calls=tf.data.AUTOTUNE, deterministic=config.is_deterministic
        )
        if config.data_service:
            examples = service.served_batches(
                examples,
                address=config.data_service,
                data=config.data,
                batch=batch,
                image_bytes=config.image_size**2 * 3 * tf.as_dtype(config.dtype).size,
                transpose=_to_hwcn if config.transpose_input else None,
                worker_options=data_options(dataclasses.replace(config, autotune=True)),
            )
        else:
            examples = examples.batch(batch, drop_remainder=True)
            if not config.is_training:
                examples = _whole_steps(examples, source, batch, input_context,
                                        config.skip_corrupt)  # fmt: skip
    if config.transpose_input and not config.data_service:  # the service's path transposes
        examples = examples.map(_to_hwcn, num_parallel_calls=tf.data.AUTOTUNE)
    examples = examples.prefetch(prefetch_size(config))
    return examples.with_options(data_options(config))


def _whole_steps(batches, source, batch: int, input_context, skip_corrupt: bool
                 ) -> tf.data.Dataset:  # fmt: skip
    """An evaluation's batches with a dropped remainder, as many as make whole global steps on
    every pipeline, with that length known. Where one pipeline feeds several replicas,
    dropping each replica's remainder left an odd batch: a step where one replica had data
    and another none, which Keras counted as a step of empty batches, and its metrics were
    wrong with no word (a reviewer: accuracy 0.17 for 0.25 on two replicas). Every pipeline
    takes the steps of the smallest share, as synchronous replicas need; the batches past
    them are read and not given, so a shard's count is still checked at its end.

    Where the records each pipeline reads are not known before (files without a manifest;
    skip_corrupt), one pipeline keeps its whole steps as it reads, and several are refused:
    each would run its own number of steps, and one wait in a collective for ever (a
    helper's trial: 4 and 2 batches on a sound dataset, with skip_corrupt)."""
    counts = file_share.pipeline_counts(source.split, input_context)
    replicas = file_share.replicas_per_pipeline(input_context)
    if skip_corrupt or any(count is None for count in counts):
        if len(counts) > 1:
            unknown = ("with skip_corrupt=True, which skips what it cannot read" if skip_corrupt
                       else "of files without a manifest, whose records are not counted")  # fmt: skip
            raise ValueError(
                f"eval_remainder='drop' over {len(counts)} input pipelines {unknown}: the "
                "records each reads are not known before, so each would drop its own "
                "remainder and run its own number of steps, and one would wait in a "
                "collective for ever. Use eval_remainder='pad' (the default)"
                + ("." if skip_corrupt else ", or read the dataset's folder (if it has one).")
            )
        if replicas == 1:
            return batches
        return batches.batch(replicas, drop_remainder=True).unbatch()
    steps = min(counts) // (batch * replicas)
    if not steps:
        raise ValueError(
            f"eval_remainder='drop' with a batch of {batch * replicas} a step over "
            f"{min(counts)} records (the smallest pipeline's share of split "
            f"{source.split.name!r}): no step would come (evaluate would return nothing). Use "
            "eval_remainder='pad' (the default), or a smaller batch."
        )
    kept = steps * replicas
    return (
        batches.enumerate()
        .filter(lambda index, _: index < kept)
        .map(lambda _, batch_: batch_)
        .apply(tf.data.experimental.assert_cardinality(kept))
    )


def _pipeline_batch_size(config, input_context, batch_size) -> int:
    if batch_size is not None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        return batch_size
    if config.batch_size is None:
        raise ValueError(
            "No batch size: pass batch_size= (the global batch) to make_input_fn or "
            "ReaderConfig, or call the input_fn with params={'batch_size': per_pipeline_batch}."
        )
    if input_context is None:
        return config.batch_size
    # TensorFlow's own words for a batch that does not split named no host.
    return per_replica(config.batch_size, input_context.num_replicas_in_sync)


def _records(config, source, share) -> tf.data.Dataset:
    """Serialized records of this pipeline's share: parallel interleave, then shuffle."""
    counts = share.record_counts if share.record_counts is not None else [-1] * len(share.files)
    firsts = share.firsts if share.firsts is not None else [0] * len(share.files)
    files = tf.data.Dataset.from_tensor_slices(
        (tf.constant(share.files, tf.string), tf.constant(counts, tf.int64),
         tf.constant(firsts, tf.int64))
    )
    # Dealt records without counts: the files are one stream, read in order, then dealt.
    in_order = share.record_shard is not None and share.firsts is None
    read = _file_reader(config, source, share)

    def one_pass(files):
        # Each time a file is opened: one that disappeared would otherwise hang the reader.
        present = records.present(config.skip_corrupt)
        files = files.filter(lambda name, expected, first: present(name, expected))
        if in_order:
            return files.flat_map(read).shard(*share.record_shard)
        return files.interleave(
            read,
            cycle_length=max(1, min(config.cycle_length, len(share.files))),
            block_length=1,
            num_parallel_calls=tf.data.AUTOTUNE,
            deterministic=config.is_deterministic,
        )

    if not config.is_training:
        return one_pass(files)
    if not in_order:  # a new file order every pass, each file once per pass
        files = files.shuffle(len(share.files), seed=config.seed, reshuffle_each_iteration=True)
    if share.num_examples and not config.skip_corrupt:
        # Every pass gives its counted records or stops with an error: it cannot be empty,
        # and the guard below costs ~10% of training throughput (benchmarks/RESULTS.md).
        serialized = one_pass(files).repeat()
    else:
        serialized = records.repeat_while_nonempty(one_pass(files), file_share.nothing_read(share))
    # After the interleave: mixes records of different shards, not just shard order.
    return serialized.shuffle(_shuffle_buffer(config, share), seed=config.seed)


def _shuffle_buffer(config, share) -> int:
    """Records the training shuffle holds: a buffer larger than an epoch would only mix
    epochs and hold memory, so it is capped there."""
    return min(config.shuffle_buffer, share.num_examples or config.shuffle_buffer)


def _file_reader(config, source, share):
    """A function from (file name, expected record count, first record kept) to the records
    this pipeline keeps of that file."""
    read_shard = records.shard_reader(
        source.compression,
        config.read_buffer_bytes,
        config.skip_corrupt,
        counted=source.split.record_counts is not None,
    )

    @tf.autograph.experimental.do_not_convert
    def read(filename, expected, first):
        shard = read_shard(filename, expected)  # counts checked over the whole file
        return shard if share.stride == 1 else shard.skip(first).shard(share.stride, 0)

    return read


@tf.autograph.experimental.do_not_convert
def _to_hwcn(images, labels, *weights):
    return (tf.transpose(images, [1, 2, 3, 0]), labels, *weights)
