"""The TPU-ready tf.data input pipeline: `make_input_fn` and `build_dataset`.

What training code imports. The pipeline, top to bottom (evaluation differs as noted):

  list files ─► this pipeline's share of the files ─► shuffle files, repeat (training)
  ─► parallel interleave of TFRecord readers (each checked against the manifest's counts)
  ─► shuffle records (training) ─► parse + decode + preprocess (`preprocess.py`), in parallel
  ─► [evaluation: pad with weight-0 examples] ─► batch(drop_remainder=True)
  ─► [transpose to HWCN] ─► [made by tf.data service workers] ─► prefetch

Every shape in the result is static, which is what XLA on a TPU needs. Parallel stages run one
call per core, without tf.data's autotuner unless asked for (`ReaderConfig.autotune`).
Beside it: `dataset` resolves what a path holds, `records` reads shard files with their
counts checked, `preprocess` makes the images, `service` hands the batching to tf.data
service workers.

    input_fn = reader.make_input_fn("gs://bucket/dataset", "train", is_training=True,
                                    batch_size=1024)
    dataset = strategy.distribute_datasets_from_function(input_fn)
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import math
import os
from collections.abc import Callable, Mapping

import tensorflow as tf

from tfrecord_pipe.core import keywords, naming, schema
from tfrecord_pipe.reading import dataset as dataset_lib
from tfrecord_pipe.reading import epochs, file_share, hosts, preprocess, records, resume, service

log = logging.getLogger(__name__)

# Records held for shuffling. Model Garden's ImageNet configs use 10k; memory is the records'
# serialized size times this.
DEFAULT_SHUFFLE_BUFFER = 10_000
# Shards read at once per pipeline. More hides per-file latency on GCS; each costs a buffer.
DEFAULT_CYCLE_LENGTH = 16
# Read buffer per open shard: large sequential reads are what GCS is fast at.
DEFAULT_READ_BUFFER = 8 << 20  # 8 MiB
# Batches ready ahead of the training step (autotune=False): hides jitter, holds little memory.
PREFETCH_BATCHES = 2

EVAL_REMAINDERS = ("pad", "drop")


# Beyond any model input in use: one such float32 image is 800 MB, and a typo (100000) would
# otherwise end in a MemoryError (or the OOM killer) instead of a message.
MAX_IMAGE_SIZE = 8192


@keywords.suggest_on_typo
@dataclasses.dataclass(frozen=True)
class ReaderConfig:
    """What to read and how.

    Attributes:
      data: a dataset folder written by tfrecord-pipe (has manifest.json), or a file pattern
        (`gs://b/d/train-*`). Local paths and anything tf.io.gfile reads.
      split: the split to read from a dataset folder; default "train" when training and
        "validation" otherwise. Must be None for a file pattern.
      is_training: True: shuffled, repeated, randomly cropped and flipped. False: one pass in
        file order with the centre crop.
      batch_size: the GLOBAL batch size. With an InputContext each replica gets its share
        (`get_per_replica_batch_size`); `input_fn(params)` uses `params["batch_size"]` instead.
      image_size: side of the square images, in pixels.
      dtype: "float32", "bfloat16" (both normalised) or "uint8" (normalise on the accelerator
        with `preprocess.Normalize` or `preprocess.normalize`).
      transpose_input: batches of images come out HWCN ([H, W, 3, batch]) instead of NHWC; a
        layout that made TPU infeed faster for the reference models.
      label_offset: subtracted from stored labels so that they come out 0-based. The
        manifest's; without a manifest it must be given (1 for data written by tfrecord-pipe
        or the Cloud TPU scripts, 0 for 0-based data): see `dataset.label_offset`.
      num_classes: labels are checked to lie in [0, num_classes). Default: the manifest's label
        count; without a manifest, no check.
      compression: "" or "GZIP". Default: the manifest's, else ".gz" file names mean GZIP.
      eval_remainder: evaluation only. "pad": the last batch is filled up with weight-0
        examples and a third element, the weights, is added; every record is counted exactly
        once and shapes stay static. Real examples all weigh slots / records (the padded
        pass's slots over its records, `padded_weight`), so that a loss averaged over batch
        slots, as Keras and `tf.nn.compute_average_loss` average it, is the mean over the
        records; count records with `weights > 0`. "drop": the last partial batch is dropped.
      shuffle_buffer: records held for shuffling (training); at most one epoch of this
        pipeline's records when the manifest gives the counts.
      seed: training: every random choice (file order, record order, crop box, flip, colour
        jitter) is a function of the seed, the epoch and the record's place in it, so two
        runs with one seed give bit-identical batches, each epoch is a permutation of the
        pipeline's records, and the iterator checkpoints as a position (`epochs.py`). Needs
        a dataset folder (its manifest's counts). None: fresh randomness on every run.
      deterministic: element order independent of thread timing. Default: False when
        training without a seed (faster), True otherwise; a seed needs True.
      cycle_length: shards read in parallel per pipeline.
      read_buffer_bytes: read buffer per open shard.
      color_jitter: 0 for none, else the strength (0..1) of random brightness, contrast and
        saturation (training).
      skip_corrupt: a corrupt or truncated shard stops the pipeline with an error naming the
        file (default), or, when True, the rest of that shard is skipped and a warning with the
        counts is printed to stderr.
      autotune: False (default): every parallel stage runs one call per core and PREFETCH_BATCHES
        batches are prefetched. True: tf.data's autotuner picks parallelism and buffer sizes
        within its RAM budget. Off by default: on few cores it made training slower, and
        deleting an autotuned iterator (once per evaluation pass, as Keras `evaluate` makes
        one per call) could wait seconds for the autotuner's thread (benchmarks/RESULTS.md,
        "Reader: without the autotuner").
      data_service: address of a tf.data service dispatcher ("grpc://host:port"), for hosts
        whose CPUs cannot keep the accelerator fed: the service's workers run the pipeline up
        to the batches (`service.py`) and stream the batches here. Receiving costs the host
        CPU too, least with dtype "uint8" (benchmarks/RESULTS.md, "tf.data service"). Training
        only, and without `seed` or `deterministic=True`: workers reading in one fixed order
        would repeat each other's batches, and batches arrive in the order the workers
        finish them.
      with_keys: seeded training only: each batch gets one more element, the records' keys
        (int64: a record's number in the split, 0..N-1, in shard order), to audit what was
        trained on: the keys of one epoch are the split's (this pipeline's share), once each.
    """

    data: str
    split: str | None = None
    is_training: bool = True
    batch_size: int | None = None
    image_size: int = 224
    dtype: str = "float32"
    transpose_input: bool = False
    label_offset: int | None = None
    num_classes: int | None = None
    compression: str | None = None
    eval_remainder: str = "pad"
    shuffle_buffer: int = DEFAULT_SHUFFLE_BUFFER
    seed: int | None = None
    deterministic: bool | None = None
    cycle_length: int = DEFAULT_CYCLE_LENGTH
    read_buffer_bytes: int = DEFAULT_READ_BUFFER
    color_jitter: float = 0.0
    skip_corrupt: bool = False
    autotune: bool = False
    data_service: str | None = None
    with_keys: bool = False

    def __post_init__(self):
        problems = []
        if not self.data:
            problems.append("data is empty: give a dataset folder or a file pattern")
        if self.batch_size is not None and self.batch_size < 1:
            problems.append(f"batch_size must be >= 1, got {self.batch_size}")
        if not 1 <= self.image_size <= MAX_IMAGE_SIZE:
            problems.append(f"image_size must be in 1..{MAX_IMAGE_SIZE}, got {self.image_size}")
        if preprocess.dtype_problem(self.dtype):
            problems.append(preprocess.dtype_problem(self.dtype))
        if self.label_offset is not None and self.label_offset < 0:
            problems.append(f"label_offset must be >= 0, got {self.label_offset}")
        if self.num_classes is not None and self.num_classes < 1:
            problems.append(f"num_classes must be >= 1, got {self.num_classes}")
        if self.compression is not None and self.compression not in naming.COMPRESSIONS:
            problems.append(
                f"compression must be one of {naming.COMPRESSIONS}, got {self.compression!r}"
            )
        if self.eval_remainder not in EVAL_REMAINDERS:
            problems.append(
                f"eval_remainder must be one of {EVAL_REMAINDERS}, got {self.eval_remainder!r}"
            )
        if self.shuffle_buffer < 1:
            problems.append(f"shuffle_buffer must be >= 1, got {self.shuffle_buffer}")
        if self.cycle_length < 1:
            problems.append(f"cycle_length must be >= 1, got {self.cycle_length}")
        if self.read_buffer_bytes < 1:
            problems.append(f"read_buffer_bytes must be >= 1, got {self.read_buffer_bytes}")
        if not 0 <= self.color_jitter <= 1:
            problems.append(f"color_jitter must be in [0, 1], got {self.color_jitter}")
        if self.data_service is not None:
            problems.extend(self._data_service_problems())
        if self.seed is not None and not 0 <= self.seed < 2**63:
            problems.append(f"seed must be in [0, 2**63), got {self.seed}")
        if self.seed is not None and self.is_training and self.deterministic is False:
            problems.append(
                "seed with deterministic=False: the order would depend on thread timing; "
                "leave deterministic unset"
            )
        if self.seed is not None and self.is_training and self.skip_corrupt:
            problems.append(
                "seed with skip_corrupt=True: a skipped record would move every record after "
                "it, so a seeded run could not resume where it was; repair the dataset "
                "(`tfrecord-pipe verify` names the damage) or leave seed=None"
            )
        if self.with_keys and not (self.is_training and self.seed is not None):
            problems.append("with_keys is for seeded training: set seed= (and is_training)")
        if problems:
            raise ValueError("Invalid ReaderConfig: " + "; ".join(problems))

    def _data_service_problems(self) -> list[str]:
        if not self.data_service.strip():
            return ['data_service is empty: give the dispatcher\'s address, "grpc://host:port"']
        problems = []
        if not self.is_training:
            problems.append(
                "data_service is for training: evaluation reads on this host, so that every "
                "record is counted exactly once"
            )
        if self.seed is not None:
            problems.append(
                "seed with data_service: every service worker would read the records in the "
                "same order, so the batches would repeat each other; leave seed=None"
            )
        if self.deterministic:
            problems.append(
                "deterministic=True with data_service: batches arrive from whichever worker "
                "has one ready, so their order cannot be fixed; leave deterministic unset"
            )
        return problems

    @property
    def padded(self) -> bool:
        """Whether batches carry a third element, the per-example weights."""
        return not self.is_training and self.eval_remainder == "pad"

    @property
    def is_deterministic(self) -> bool:
        if self.deterministic is not None:
            return self.deterministic
        return not self.is_training or self.seed is not None

    @property
    def seeded(self) -> bool:
        """Training in the seeded, position-addressable order of `epochs.py`."""
        return self.is_training and self.seed is not None


@dataclasses.dataclass(frozen=True)
class Source:
    """What one config reads, worked out once on the host.

    Attributes:
      split: the files, and their record counts when the manifest gives them.
      compression: "" or "GZIP".
      label_offset: subtracted from stored labels.
      num_classes: label count, or None when unknown.
    """

    split: dataset_lib.Split
    compression: str
    label_offset: int
    num_classes: int | None


def resolve_source(config: ReaderConfig, found: dataset_lib.Dataset | None = None) -> Source:
    """The files `config` reads and the facts that go with them.

    Args:
      config: what to read.
      found: `dataset.resolve(config.data)`, when the caller has it already (bench reads
        several configs of one dataset).

    Raises:
      ValueError: nothing to read, a split that does not exist, or a label offset that is
        neither in a manifest nor given; the message says what to pass.
    """
    found = found or dataset_lib.resolve(config.data)
    if found.is_pattern:
        if config.split is not None:
            found.split(config.split)  # raises, saying what to do
        chosen = found.everything()
    else:
        split = config.split or (naming.TRAIN if config.is_training else naming.VALIDATION)
        chosen = found.split(split)
        if chosen.missing and not config.skip_corrupt:
            raise ValueError(
                f"{len(chosen.missing)} shard file(s) of split {split!r} that the manifest of "
                f"{config.data} lists are missing: {', '.join(chosen.missing[:3])}. Restore "
                "them, or pass skip_corrupt=True to read without them."
            )
        if chosen.missing:
            log.warning(
                "skip_corrupt: reading split %r without %d missing shard file(s): %s",
                split, len(chosen.missing), ", ".join(chosen.missing),
            )  # fmt: skip
            chosen = chosen.without_missing()
        if not chosen.files:
            raise ValueError(
                f"Split {split!r} of {config.data} has no shards to read (0 examples written, "
                "or all missing)."
            )
    labels = found.labels
    return Source(
        split=chosen,
        compression=config.compression if config.compression is not None else found.compression,
        label_offset=dataset_lib.label_offset(found, config.label_offset),
        num_classes=config.num_classes or (len(labels) if labels else None),
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
    share = _share(config, source, input_context)
    return _records(config, source, share).with_options(data_options(config))


def prefetch_size(config: ReaderConfig) -> int:
    """Batches `build_dataset` prefetches: fixed without the autotuner (see `data_options`)."""
    return tf.data.AUTOTUNE if config.autotune else PREFETCH_BATCHES


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
    source = source or resolve_source(config)
    batch = _pipeline_batch_size(config, input_context, batch_size)
    share = _share(config, source, input_context)
    if start_batches < 0:
        raise ValueError(f"start_batches must be >= 0, got {start_batches}")
    if config.seeded:
        layout = seeded_layout(config, source, share)
        start = epochs.Position.after(start_batches * batch, layout)
        elements = epochs.stream(layout, _piece_reader(config, source, layout), start)
        parse = _seeded_parse_fn(config, source, layout, image_fn)
        # In order, a slow decode holds back those behind it: twice a call per core in flight
        # hides it (benchmarks/RESULTS.md, "Reader: seeded training").
        examples = elements.map(
            parse, num_parallel_calls=SEEDED_CALLS_PER_CORE * (os.cpu_count() or 1),
            deterministic=True,
        )  # fmt: skip
        examples = examples.batch(batch, drop_remainder=True)
        if config.transpose_input:
            examples = examples.map(_to_hwcn, num_parallel_calls=tf.data.AUTOTUNE)
        return examples.prefetch(prefetch_size(config)).with_options(data_options(config))
    if start_batches:
        raise ValueError("start_batches is for seeded training (ReaderConfig.seed)")
    serialized = _records(config, source, share)
    parse = _parse_fn(config, source, image_fn)
    if config.padded:
        examples = _padded_batches(config, source, serialized, parse, batch, input_context)
    else:
        examples = serialized.map(
            parse, num_parallel_calls=tf.data.AUTOTUNE, deterministic=config.is_deterministic
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
    if config.transpose_input and not config.data_service:  # the service's path transposes
        examples = examples.map(_to_hwcn, num_parallel_calls=tf.data.AUTOTUNE)
    examples = examples.prefetch(prefetch_size(config))
    return examples.with_options(data_options(config))


def _share(config, source, input_context) -> file_share.PipelineShare:
    """This pipeline's share of the split; refused when training would leave a pipeline
    with nothing to read (it would spin for ever, and the others wait for it)."""
    num_pipelines, index = _pipeline_position(input_context)
    if config.is_training:
        problem = file_share.empty_pipelines_problem(source.split, num_pipelines)
        if problem:
            raise ValueError(problem)
    share = file_share.share(source.split, num_pipelines, index)
    if share.record_shard is not None:
        log.warning(
            "%d files for %d input pipelines: each pipeline reads every file and keeps 1/%d "
            "of the records. Write at least %d shards (--num_shards) to read each once.",
            len(source.split.files), num_pipelines, num_pipelines, num_pipelines,
        )  # fmt: skip
    return share


def pipeline_layout(
    config: ReaderConfig, input_context: tf.distribute.InputContext | None = None
) -> epochs.Layout:
    """The order of a seeded training pipeline's records: what its positions mean."""
    if not config.seeded:
        raise ValueError("Positions are for seeded training: set seed= (and is_training).")
    source = resolve_source(config)
    return seeded_layout(config, source, _share(config, source, input_context))


def _pipeline_position(input_context) -> tuple[int, int]:
    """(number of input pipelines, this one's index)."""
    if input_context is None:
        return 1, 0
    return input_context.num_input_pipelines, input_context.input_pipeline_id


def _pipeline_batch_size(config, input_context, batch_size) -> int:
    if batch_size is not None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        return batch_size
    if config.batch_size is None:
        raise ValueError(
            "No batch size: set ReaderConfig.batch_size (the global batch), or call the "
            "input_fn with params={'batch_size': per_pipeline_batch}."
        )
    if input_context is None:
        return config.batch_size
    return input_context.get_per_replica_batch_size(config.batch_size)


def _records(config, source, share) -> tf.data.Dataset:
    """Serialized records of this pipeline's share: parallel interleave, then shuffle."""
    counts = share.record_counts if share.record_counts is not None else [-1] * len(share.files)
    firsts = share.firsts if share.firsts is not None else [0] * len(share.files)
    files = tf.data.Dataset.from_tensor_slices(
        (tf.constant(share.files), tf.constant(counts, tf.int64), tf.constant(firsts, tf.int64))
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
            cycle_length=min(config.cycle_length, len(share.files)),
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
        serialized = records.repeat_while_nonempty(one_pass(files), _nothing_read(share))
    # After the interleave: mixes records of different shards, not just shard order. A
    # buffer larger than an epoch would only mix epochs and hold memory: cap it there.
    buffer = min(config.shuffle_buffer, share.num_examples or config.shuffle_buffer)
    return serialized.shuffle(buffer, seed=config.seed)


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
        raise ValueError(_nothing_read(share))
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
    )


# Parse-and-decode calls in flight per core in a seeded pipeline, whose order is fixed.
SEEDED_CALLS_PER_CORE = 2
# Records each piece reads ahead in a seeded pipeline (which reads its pieces in turn, on one
# thread): reading then overlaps across the pieces of a group, as a parallel interleave's does.
PIECE_READ_AHEAD = 16


def _piece_reader(config, source, layout):
    """(file, count, first, start, skip) to the (key, record) pairs the piece gives."""
    read_file = records.shard_reader(
        source.compression, config.read_buffer_bytes, False, counted=True, catch=False
    )
    stride = layout.stride

    def read(file, count, first, start, skip):
        passed = skip * stride  # the file's records before this piece's next one
        kept = read_file(file, count, passed)
        if stride > 1:
            kept = kept.skip(first).shard(stride, 0)
        keys = tf.data.Dataset.range(start + passed + first, start + count, stride)
        return tf.data.Dataset.zip((keys, kept)).prefetch(PIECE_READ_AHEAD)

    return read


def _nothing_read(share) -> str:
    shown = ", ".join(share.files[:3]) + (", ..." if len(share.files) > 3 else "")
    dealt = (
        f" (or, dealt among {share.record_shard[0]} pipelines, they hold fewer records than "
        "there are pipelines: train on fewer)"
        if share.record_shard
        else ""
    )
    return (
        f"A whole pass over this input pipeline's {len(share.files)} file(s) ({shown}) gave "
        "no record: each is missing, empty, or (with skip_corrupt) corrupt from its start"
        f"{dealt}. Check them with `tfrecord-pipe verify`, or convert again."
    )


def _file_reader(config, source, share):
    """A function from (file name, expected record count, first record kept) to the records
    this pipeline keeps of that file."""
    read_shard = records.shard_reader(
        source.compression,
        config.read_buffer_bytes,
        config.skip_corrupt,
        counted=source.split.record_counts is not None,
    )

    def read(filename, expected, first):
        shard = read_shard(filename, expected)  # counts checked over the whole file
        return shard if share.stride == 1 else shard.skip(first).shard(share.stride, 0)

    return read


def _parse_fn(config, source, image_fn=None):
    """Record (and, seeded, the example's augmentation seed) to (image, label[, weight]):
    parse the two keys needed, decode, preprocess."""
    spec = records.parse_spec(schema.ENCODED, schema.LABEL)
    offset = source.label_offset
    num_classes = source.num_classes

    def parse(record, seed=None):
        features = tf.io.parse_single_example(record, spec)
        encoded = features[schema.ENCODED]
        if image_fn is not None:
            image = _checked_image(image_fn(encoded), config)
        elif config.is_training:
            image = preprocess.train_image(
                encoded, config.image_size, config.dtype, config.color_jitter, seed
            )
        else:
            image = preprocess.eval_image(encoded, config.image_size, config.dtype)
        label = features[schema.LABEL] - offset
        checks = [
            tf.debugging.assert_non_negative(
                label, message=f"Label below 0 after subtracting label_offset={offset}"
            )
        ]
        if num_classes is not None:
            checks.append(
                tf.debugging.assert_less(
                    label,
                    tf.constant(num_classes, tf.int64),
                    message=f"Label not below num_classes={num_classes} (label_offset={offset})",
                )
            )
        with tf.control_dependencies(checks):
            label = tf.cast(label, tf.int32)
        if config.padded:
            return image, label, tf.constant(1.0)
        return image, label

    return parse


def _seeded_parse_fn(config, source, layout, image_fn=None):
    """(epoch, index, key, record) to (image, label[, key]), the augmentation drawn from the
    example's seed (its epoch and place)."""
    parse = _parse_fn(config, source, image_fn)

    def parse_placed(epoch, index, key, record):
        image, label = parse(record, epochs.example_seed(layout, epoch, index))
        return (image, label, key) if config.with_keys else (image, label)

    return parse_placed


def _checked_image(image, config):
    """image_fn's result, if it has the config's static shape and dtype (checked when traced)."""
    expected = (config.image_size, config.image_size, 3)
    if image.dtype != tf.as_dtype(config.dtype) or not image.shape.is_compatible_with(expected):
        raise ValueError(
            f"image_fn returned {image.dtype.name} {image.shape}; the config asks for "
            f"{config.dtype} {list(expected)}. Resize/crop to image_size and cast to dtype."
        )
    return tf.ensure_shape(image, expected)


def _padded_batches(config, source, serialized, parse, batch, context) -> tf.data.Dataset:
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
    filler = tf.data.Dataset.from_tensors((tf.constant(b""), tf.constant(False))).repeat()
    examples = real.concatenate(filler).map(
        example, num_parallel_calls=tf.data.AUTOTUNE, deterministic=config.is_deterministic
    )
    batches = examples.batch(batch, drop_remainder=True)
    if steps is not None:
        return batches.take(steps)
    if context is not None and context.num_replicas_in_sync > 1:
        raise ValueError(
            f"Padded evaluation over {context.num_replicas_in_sync} replicas needs record "
            f"counts to give every replica the same number of batches, and {config.data} has "
            "no manifest listing them. Read a dataset folder, or use eval_remainder='drop'."
        )
    # One pipeline, one replica, count unknown: stop at the first batch that starts with filler.
    return batches.take_while(lambda images, labels, weights: weights[0] > 0)


def padded_weight(source: Source, steps: int | None, batch: int, context=None) -> float:
    """The weight of each real example in a padded evaluation pass: its slots over its records.

    Keras averages a loss over a batch's slots (`sum_over_batch_size`, padding included),
    then over batches, which are all full; so do `tf.nn.compute_average_loss` and the mean of
    its steps. With every real example weighing slots / records, that average is the mean
    over the records, whatever the padding. Accuracy as a weighted mean is unchanged. 1.0
    when the counts are unknown (a pattern without a manifest): the loss is then divided by
    the slots (a warning says so).
    """
    num_pipelines, _ = _pipeline_position(context)
    records = source.split.num_examples
    if steps is None or not records:
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
    num_pipelines, _ = _pipeline_position(input_context)
    counts = [
        file_share.share(source.split, num_pipelines, i).num_examples for i in range(num_pipelines)
    ]
    if any(count is None for count in counts):
        return None
    steps = max(math.ceil(count / batch) for count in counts)
    # Each pipeline feeds its replicas in turn: give every replica the same number of batches.
    replicas = input_context.num_replicas_in_sync // num_pipelines if input_context else 1
    replicas = max(replicas, 1)
    return math.ceil(steps / replicas) * replicas


def _to_hwcn(images, labels, *weights):
    return (tf.transpose(images, [1, 2, 3, 0]), labels, *weights)


def data_options(config: ReaderConfig) -> tf.data.Options:
    """The tf.data options of `config`'s pipelines (and of anything timed against them)."""
    options = tf.data.Options()
    options.deterministic = config.is_deterministic
    if config.seeded:
        # A checkpoint of the iterator holds where each stage is in its input, not what the
        # stages hold (shuffle windows, prefetched batches): `epochs.py` makes every element
        # a function of its position, so it is made again after a restore.
        options.experimental_symbolic_checkpoint = True
    # The pipeline shards its own files per InputContext; tf.distribute must not shard again.
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    if not config.autotune:
        # Deleting an autotuned iterator waits for the autotuner's thread to wake (seconds, in
        # about half of the evaluation passes timed; TensorFlow 2.21), and the autotuner costs
        # CPU per image (benchmarks/RESULTS.md, "Reader: without the autotuner"). Without it,
        # AUTOTUNE parallelism means initial_parallelism (capped by tf.data at its thread
        # pool: one thread per core).
        # prefetch(AUTOTUNE) would then fall back to tf.data's legacy tuner, which doubles the
        # buffer whenever a full one drains to empty: every stall the accelerator catches up
        # from (a checkpoint, say) would grow it. `prefetch_size` fixes it instead.
        options.autotune.enabled = False
        options.autotune.initial_parallelism = os.cpu_count() or 1
    return options


class InputFn:
    """The `input_fn` returned by `make_input_fn`: call it the way your training code does.

    - `input_fn(input_context)`, from `strategy.distribute_datasets_from_function`: this
      pipeline's share of the files, per-replica batches from `config.batch_size`.
    - `input_fn(params)`: TPUEstimator-era code; `params["batch_size"]` is the batch of this
      pipeline, which reads every file (TPUEstimator itself left TensorFlow in 2.16).
    - `input_fn()`: this host's share when a host position is given or JAX is in use
      (`hosts`), with batches of config.batch_size / host count; else one pipeline, batches
      of `config.batch_size`. For JAX, `input_fn().as_numpy_iterator()` yields numpy batches.
    """

    def __init__(self, config: ReaderConfig, host_index=None, host_count=None):
        if host_index is not None or host_count is not None:
            hosts.position(host_index, host_count)  # refuses a wrong position now, not later
        self.config = config
        self.host_index, self.host_count = host_index, host_count

    def __call__(self, context=None, *, start_batches: int = 0) -> tf.data.Dataset:
        """`start_batches`: seeded training: batches this pipeline has trained on already."""
        if isinstance(context, tf.distribute.InputContext):
            if self.host_count is not None:
                raise ValueError(
                    "This input_fn was given host_index/host_count, and tf.distribute's "
                    "InputContext gives a position too. Use one of the two."
                )
            return build_dataset(self.config, context, start_batches=start_batches)
        if context is not None and not isinstance(context, Mapping):
            raise TypeError(
                "input_fn takes a tf.distribute.InputContext, a params dict with 'batch_size', "
                f"or nothing; got {type(context).__name__}"
            )
        if hosts.jax_in_use():
            hosts.keep_tensorflow_off_accelerators()
        host = hosts.position(self.host_index, self.host_count)
        config = self.config
        if host and host[1] > 1 and not config.is_training and config.eval_remainder == "drop":
            raise ValueError(
                "eval_remainder='drop' with several hosts: each host drops its own remainder, "
                "so hosts would run different numbers of batches and one would wait in a "
                "collective for ever. Use eval_remainder='pad' (the default)."
            )
        host_context = hosts.input_context(*host) if host else None
        if context is None:
            return build_dataset(self.config, host_context, start_batches=start_batches)
        if "batch_size" not in context:
            raise ValueError(
                f"input_fn(params) needs params['batch_size']; got keys {sorted(context)}"
            )
        return build_dataset(
            self.config, host_context, batch_size=context["batch_size"],
            start_batches=start_batches,
        )  # fmt: skip

    def host_context(self) -> tf.distribute.InputContext | None:
        """This host's InputContext when a host position is given or JAX is in use."""
        host = hosts.position(self.host_index, self.host_count)
        return hosts.input_context(*host) if host else None

    def numpy_batches(self) -> resume.BatchIterator:
        """This host's batches as numpy arrays, for JAX, with a small state to save beside the
        model and restore after a preemption (`get_state` / `set_state`, as Grain's
        iterators have): seeded training only."""
        return resume.BatchIterator(self)

    def __repr__(self):
        return (
            f"InputFn({self.config!r}, host_index={self.host_index}, host_count={self.host_count})"
        )


def make_input_fn(
    data: str,
    split: str | None = None,
    *,
    is_training: bool | None = None,
    mode: str | None = None,
    host_index: int | None = None,
    host_count: int | None = None,
    **options,
) -> InputFn:
    """An `input_fn` for training or evaluation, in the style of the Cloud TPU reference models.

    Args:
      data: a dataset folder (with manifest.json) or a file pattern.
      split: which split of a dataset folder (default "train" or "validation" by mode).
      is_training: training (shuffle, repeat, augment) or evaluation. Give this or `mode`.
      mode: "train" or "eval" (what `tf.estimator.ModeKeys` held), instead of is_training.
      host_index, host_count: this host's position, for programs that feed each host
        themselves (JAX); default: JAX's process index and count when JAX is in use, else
        one host (`hosts`). Not with tf.distribute, whose InputContext gives the position.
      **options: every other ReaderConfig field (batch_size, image_size, dtype, seed, ...),
        shown with its default in this function's signature; `help(ReaderConfig)` says what
        each does. A name that is not one is a TypeError naming the closest.

    Returns:
      An InputFn: `input_fn(input_context)`, `input_fn(params)` or `input_fn()`.
    """
    keywords.check("make_input_fn()", options, [*_OPTIONS, *_OWN_KEYWORDS])
    if (is_training is None) == (mode is None):
        raise ValueError("Pass exactly one of is_training=True/False or mode='train'/'eval'.")
    if mode is not None:
        modes = {"train": True, "training": True, "eval": False, "evaluation": False}
        if mode not in modes:
            raise ValueError(f"mode must be 'train' or 'eval', got {mode!r}")
        is_training = modes[mode]
    config = ReaderConfig(data=data, split=split, is_training=is_training, **options)
    return InputFn(config, host_index, host_count)


# make_input_fn's options are ReaderConfig's fields; its signature lists them, with their
# defaults, for help() and editors, from the one definition above.
_OPTIONS = {
    field.name: field
    for field in dataclasses.fields(ReaderConfig)
    if field.name not in ("data", "split", "is_training")
}
_own = inspect.signature(make_input_fn)
_OWN_KEYWORDS = [p.name for p in _own.parameters.values() if p.kind == inspect.Parameter.KEYWORD_ONLY]
make_input_fn.__signature__ = _own.replace(
    parameters=[
        *(p for p in _own.parameters.values() if p.kind != inspect.Parameter.VAR_KEYWORD),
        *(
            inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=field.default,
                              annotation=field.type)
            for name, field in _OPTIONS.items()
        ),
    ]
)  # fmt: skip
del _own
