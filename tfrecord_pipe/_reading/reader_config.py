"""What the reader reads and how: `ReaderConfig`, the `Source` it resolves to on the host,
and the tf.data options every pipeline of a config runs with."""

from __future__ import annotations

import dataclasses
import logging
import os

import tensorflow as tf

from tfrecord_pipe._core import arguments, keywords, naming, paths
from tfrecord_pipe._core import manifest as manifest_lib
from tfrecord_pipe._reading import dataset as dataset_lib
from tfrecord_pipe._reading import preprocess

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
        (`gs://b/d/train-*`), a str or a `pathlib.Path`. Local paths and anything
        tf.io.gfile reads.
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
        # Types first: `2.5` or `"32"` failed deep in TensorFlow or at a comparison below, and
        # `is_training="no"` was taken as True.
        arguments.check_fields(self, _TYPE_CHECKS, "ReaderConfig")
        problems = []
        if not self.data:
            problems.append("data is empty: give a dataset folder or a file pattern")
        if self.batch_size is not None and self.batch_size < 1:
            problems.append(f"batch_size must be >= 1, got {self.batch_size}")
        if not 1 <= self.image_size <= MAX_IMAGE_SIZE:
            problems.append(f"image_size must be in 1..{MAX_IMAGE_SIZE}, got {self.image_size}")
        if preprocess.dtype_problem(self.dtype):
            problems.append(preprocess.dtype_problem(self.dtype))
        if problem := dataset_lib.label_offset_problem(self.label_offset):
            problems.append(problem)
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
        arguments.refuse("ReaderConfig", problems)

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


def per_replica(global_batch_size: int, replicas: int) -> int:
    """The batch each of `replicas` gets (hosts' pipelines, or a strategy's replicas).

    Raises:
      ValueError: the global batch does not split evenly (replicas would differ in shape).
    """
    if global_batch_size % replicas:
        raise ValueError(
            f"Global batch size {global_batch_size} does not divide among {replicas} replicas "
            f"(hosts, or a strategy's replicas); use a multiple of {replicas}, such as "
            f"{replicas * max(1, global_batch_size // replicas)}."
        )
    return global_batch_size // replicas


# dtype is checked by its value: one of preprocess.DTYPES.
_TYPE_CHECKS = arguments.field_checks(ReaderConfig, paths=("data",), skip=("dtype",))


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


def _without_them(config: ReaderConfig, advice: str) -> str:
    """The end of an error over damaged shards: `advice` (skip_corrupt) where this pipeline
    could take it; seeded training cannot (`ReaderConfig` refuses the pair), so there the
    way without them is said as it is."""
    if config.seeded:
        return ("; seeded training reads every record of its epochs, so it cannot go on "
                "without them (skip_corrupt=True needs seed=None).")
    return advice


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
    found.require_tfrecord("the tf.data reader")
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
                f"{config.data} lists are missing (or not files): "
                f"{', '.join(chosen.missing[:3])}. Restore them"
                + _without_them(config, ", or pass skip_corrupt=True to read without them.")
            )
        cut = found.manifest.splits[split].size_problems(paths.folder(config.data),
                                                         found.file_format)  # fmt: skip
        if cut and not config.skip_corrupt:
            raise ValueError(
                manifest_lib.sizes_said(cut, f"shard file(s) of split {split!r} of {config.data}")
                + f" (`tfrecord-pipe inspect {config.data} --check` checks every shard)"
                + _without_them(config, "; or pass skip_corrupt=True to read what they hold.")
            )
        if cut:
            log.warning("skip_corrupt: reading split %r with %d shard file(s) not of the size "
                        "the manifest lists: %s", split, len(cut), "; ".join(cut))  # fmt: skip
        if chosen.missing:
            # Kept in the split: hosts deal the files the manifest lists, whichever each has
            # (copies of a dataset on each host's disk), so that they take the same steps.
            log.warning(
                "skip_corrupt: reading split %r without %d missing shard file(s): %s",
                split, len(chosen.missing), ", ".join(chosen.missing),
            )  # fmt: skip
        if len(chosen.missing) == len(chosen.files):
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


def prefetch_size(config: ReaderConfig) -> int:
    """Batches `build_dataset` prefetches: fixed without the autotuner (see `data_options`)."""
    return tf.data.AUTOTUNE if config.autotune else PREFETCH_BATCHES


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
