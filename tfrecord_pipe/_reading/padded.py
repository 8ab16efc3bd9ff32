"""Padded evaluation: every record counted exactly once in full, static-shaped batches, the
last filled up with weight-0 examples, and the same number of batches on every pipeline."""

from __future__ import annotations

import logging
import math

import tensorflow as tf

from tfrecord_pipe._reading import file_share
from tfrecord_pipe._reading.reader_config import ReaderConfig, Source, resolve_source

log = logging.getLogger(__name__)

def padded_batches(config, source, serialized, parse, batch, context) -> tf.data.Dataset:
    """Full batches that hold every example once, the last filled up with weight-0 examples.

    With known counts every pipeline yields the same number of batches (the most any
    pipeline needs, rounded up to a multiple of its replicas), as synchronous multi-replica
    evaluation requires: a step that some replica has no batch for is dropped whole.
    """
    dtype = tf.as_dtype(config.dtype)
    blank = (
        tf.zeros([config.image_size, config.image_size, 3], dtype),
        tf.constant(0, tf.int32),
        tf.constant(0.0),
    )
    steps = eval_steps(config, batch, context, source)
    weight = tf.constant(padded_weight(source, steps, batch, context), tf.float32)

    def real_example(record):
        image, label, _ = parse(record)
        return image, label, weight

    def example(record, real):
        return tf.cond(real, lambda: real_example(record), lambda: blank)

    # The filler joins as records, before the map: map and batch then fuse, and each image is
    # copied into its batch by the thread that made it (a separate batch stage copied them all).
    real = serialized.map(lambda record: (record, tf.constant(True)))
    if steps is not None:
        real = _each_once_the_next_is_read(real)
    filler = tf.data.Dataset.from_tensors((tf.constant(b""), tf.constant(False))).repeat()
    examples = real.concatenate(filler).map(
        example, num_parallel_calls=tf.data.AUTOTUNE, deterministic=config.is_deterministic
    )
    batches = examples.batch(batch, drop_remainder=True)
    if steps is not None:
        return batches.take(steps)
    if context is not None and context.num_replicas_in_sync > 1:
        hosts = context.num_input_pipelines > 1  # (host_count refuses a dropped remainder)
        over = (f"{context.num_input_pipelines} hosts" if hosts
                else f"{context.num_replicas_in_sync} replicas")  # fmt: skip
        raise ValueError(
            f"Padded evaluation over {over} needs record counts to give each the same number "
            f"of batches, and {config.data} has no manifest listing them. Read a dataset folder"
            + ("." if hosts else ", or use eval_remainder='drop'.")
        )
    # One pipeline, one replica, count unknown: stop at the first batch that starts with filler.
    return batches.take_while(lambda images, labels, weights: weights[0] > 0)


def _each_once_the_next_is_read(real: tf.data.Dataset) -> tf.data.Dataset:
    """`real`'s (record, True) pairs, each let through once the next (or the end) is read.

    The last batch is taken as soon as it is full: without reading one more, a record past a
    shard's count (checked as it comes, `records._checked`) was never read, nor counted.
    """
    end = tf.data.Dataset.from_tensors((tf.constant(b""), tf.constant(False)))
    held_back = real.concatenate(end).scan(
        (tf.constant(b""), tf.constant(False)), lambda previous, pair: (pair, previous)
    )
    return held_back.filter(lambda record, is_real: is_real)


def padded_weight(source: Source, steps: int | None, batch: int, context=None) -> float:
    """The weight of each real example in a padded evaluation pass: its slots over its records.

    Keras averages a loss over a batch's slots (`sum_over_batch_size`, padding included),
    then over batches, which are all full; so do `tf.nn.compute_average_loss` and the mean of
    its steps. With every real example weighing slots / records, that average is the mean
    over the records, whatever the padding. Accuracy as a weighted mean is unchanged. 1.0
    when the counts are unknown (a pattern without a manifest): the loss is then divided by
    the slots (a warning says so).
    """
    num_pipelines, _ = file_share.pipeline_position(context)
    records = source.split.without_missing().num_examples  # (skip_corrupt: those read)
    if records == 0:  # nothing to weigh (every shard empty)
        return 1.0
    if steps is None or records is None:
        log.warning(
            "Padded evaluation of %s without record counts: its loss is averaged over the "
            "padded batch slots, not the records (accuracy is right). Read a dataset folder.",
            source.split.name,
        )
        return 1.0
    return steps * batch * num_pipelines / records


def eval_steps(
    config: ReaderConfig,
    batch: int,
    input_context: tf.distribute.InputContext | None = None,
    source: Source | None = None,
) -> int | None:
    """Batches each pipeline yields in one padded evaluation pass, or None when unknown.

    Args:
      config: an evaluation config.
      batch: the per-pipeline (per-replica) batch size.
      input_context: how many pipelines and replicas share the data; None for one of each.
      source: resolve_source(config), if already at hand.
    """
    source = source or resolve_source(config)
    counts = file_share.pipeline_counts(source.split, input_context)
    if any(count is None for count in counts):
        return None
    steps = max(math.ceil(count / batch) for count in counts)
    # Each pipeline feeds its replicas in turn: give every replica the same number of batches.
    replicas = file_share.replicas_per_pipeline(input_context)
    return math.ceil(steps / replicas) * replicas
