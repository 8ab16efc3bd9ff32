"""How fast the reader delivers batches, next to a decode ceiling measured in the same run.

Used by `tfrecord-pipe bench` and `benchmarks/reader_bench.py`. Machines are shared and
noisy, so absolute images/s mean little across runs; the ratio to the ceiling, measured
moments apart on the same shards, says whether the pipeline itself is the bottleneck.

The ceiling: the records read by the reader's own stages (`reader.read_records`), then only
parsed and fully decoded with `tf.io.decode_jpeg`, in parallel. A pipeline near 1.0x of it
spends its time decoding, which only more host cores (or smaller images) can speed up.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable

import tensorflow as tf

from tfrecord_pipe._core import naming, paths, progress, schema
from tfrecord_pipe._reading import dataset as dataset_lib
from tfrecord_pipe import reader
from tfrecord_pipe._reading import padded, records

WARMUP_BATCHES = 3  # threads started, shuffle buffer filled, autotuning begun
# A pipeline whose whole pass is fewer batches than this is timed mostly starting up again
# (a pass of 1-3 padded evaluation batches measured 0.10-0.36x): its ratio is not shown.
MIN_PASS_BATCHES = 20


@dataclasses.dataclass(frozen=True)
class Measurement:
    """Attributes: name; images delivered in the timed part; seconds it took; the batches in
    one whole pass, when the dataset ended (evaluation) during the run, else None; the
    images in that pass."""

    name: str
    images: int
    seconds: float
    pass_batches: int | None = None
    pass_images: int | None = None

    @property
    def too_short(self) -> bool:
        """A pass too short to time: restarts, not reading, set the rate."""
        return self.pass_batches is not None and self.pass_batches < MIN_PASS_BATCHES

    @property
    def images_per_s(self) -> float:
        return self.images / self.seconds if self.seconds else 0.0


def ceiling_dataset(
    config: reader.ReaderConfig, source: reader.Source | None = None
) -> tf.data.Dataset:
    """Parse + full decode of the records `config` reads, batched as scalars (nothing to copy)."""
    spec = records.parse_spec(schema.ENCODED)

    @tf.autograph.experimental.do_not_convert
    def decode(record):
        encoded = tf.io.parse_single_example(record, spec)[schema.ENCODED]
        return tf.shape(tf.io.decode_jpeg(encoded, channels=3))[0]

    # With the reader's options (no autotuner by default), timed the way the pipeline is.
    serialized = reader.read_records(config, source=source)
    decoded = serialized.map(decode, num_parallel_calls=tf.data.AUTOTUNE, deterministic=False)
    return decoded.batch(config.batch_size).prefetch(reader.prefetch_size(config))


def measure(
    name: str,
    dataset: tf.data.Dataset,
    seconds: float,
    images_in: Callable[[tuple], int],
    show_progress: bool = True,
) -> Measurement:
    """Iterates `dataset` for `seconds` (one element at least) after a warm-up; restarts it
    when it ends (evaluation).

    Args:
      name: shown on the progress bar.
      dataset: what to time.
      seconds: length of the timed part.
      images_in: images in one element (real ones only, for padded evaluation batches).
      show_progress: show a progress line on stderr.
    """
    line = progress.StatusLine() if show_progress else None
    iterator = iter(dataset)
    in_pass, in_pass_images, pass_batches, pass_images = 0, 0, None, None

    def next_element():
        nonlocal iterator, in_pass, in_pass_images, pass_batches, pass_images
        try:
            element = next(iterator)
        except StopIteration:
            pass_batches = in_pass if pass_batches is None else min(pass_batches, in_pass)
            pass_images = in_pass_images if pass_images is None else min(pass_images,
                                                                         in_pass_images)  # fmt: skip
            iterator, in_pass, in_pass_images = iter(dataset), 0, 0  # its start-up included
            element = next(iterator, None)
            if element is None:
                raise ValueError(f"The {name} pipeline gives no batch at all: is the split "
                                 "smaller than one batch? Give a smaller --batch_size.")  # fmt: skip
        in_pass += 1
        in_pass_images += images_in(element)
        return element

    for _ in range(WARMUP_BATCHES):
        next_element()
    images, started = 0, time.perf_counter()
    while True:  # one element at least: `--seconds 1e-9` gave a table of zeros
        images += images_in(next_element())
        elapsed = time.perf_counter() - started
        if elapsed >= seconds:
            break
        if line:
            line.update(_progress_text(name, elapsed, seconds, images))
    if line:
        line.finish(_progress_text(name, elapsed, seconds, images))
    return Measurement(name, images, elapsed, pass_batches, pass_images)


def _progress_text(name: str, elapsed: float, seconds: float, images: int) -> str:
    return (
        f"  {name:8s} {progress.bar(elapsed / seconds)} {min(elapsed, seconds):5.1f}/"
        f"{seconds:g} s {images / max(elapsed, 1e-9):7.0f} img/s"
    )


def batch_images(config: reader.ReaderConfig) -> Callable[[tuple], int]:
    """Images in one batch of `config`'s pipeline: real ones only for padded evaluation."""
    if config.padded:
        return lambda element: int(tf.math.count_nonzero(element[2]))  # weights: 0 = padding
    return lambda element: config.batch_size


def bench(
    path: str, seconds: float = 10.0, show_progress: bool = True, **options
) -> list[Measurement]:
    """Ceiling, training and evaluation pipelines on the dataset at `path`, one after another.

    A dataset folder's train split feeds the ceiling and training, its validation split (or
    the train split when there is none, or it holds no record) evaluation; a file pattern
    feeds all three.

    Args:
      path: a dataset folder or a file pattern.
      seconds: timed run per pipeline.
      show_progress: show progress lines on stderr.
      **options: `reader.ReaderConfig` fields for both pipelines (image_size, batch_size
        (default 128), dtype, label_offset for a bare pattern, ...); `data_service` applies
        to training only, as evaluation always reads on this host.
    """
    found = dataset_lib.resolve(path)  # once, for all three pipelines
    train_split = eval_split = None
    if not found.is_pattern:
        if naming.TRAIN not in found.splits:  # the reader's advice, split=, is no flag here
            others = sorted(found.splits)
            raise ValueError(
                f"{path} has no split {naming.TRAIN!r} (it has {others}): bench times training "
                f"on it. Give a pattern of a split's files instead, as "
                f"{paths.join(path, others[0] + '-*') if others else 'DATASET/SPLIT-*'}."
            )
        train_split = naming.TRAIN
        # A validation split with no record (its inputs all rejected) is as good as none.
        validation = found.splits.get(naming.VALIDATION)
        eval_split = naming.VALIDATION if validation and validation.files else train_split
    base = {"batch_size": 128, **options, "data": path}
    train = reader.ReaderConfig(split=train_split, is_training=True, **base)
    evaluation = reader.ReaderConfig(
        split=eval_split, is_training=False, **{**base, "data_service": None}
    )
    train_source = reader.resolve_source(train, found)
    eval_source = reader.resolve_source(evaluation, found)
    # All built before any is timed: a bad option fails at once, not after a timed run. The
    # padded evaluation's note on its loss is for training scripts: no loss is taken here.
    with _held_back(padded.log):
        pipelines = [
            ("ceiling", ceiling_dataset(train, train_source), train),  # always on this host
            ("train", reader.build_dataset(train, source=train_source), train),
            ("eval", reader.build_dataset(evaluation, source=eval_source), evaluation),
        ]
        # A batch of each read first: a record the reader refuses (a label below 0 for the
        # offset given) fails the command in seconds, not after the ceiling's timed run.
        # Training's without its shuffle buffer, which its timed run fills.
        probe = dataclasses.replace(train, shuffle_buffer=1, data_service=None)
        for config, source in ((probe, train_source), (evaluation, eval_source)):
            next(iter(reader.build_dataset(config, source=source)), None)
    return [
        measure(name, dataset, seconds, batch_images(config), show_progress)
        for name, dataset, config in pipelines
    ]


@contextlib.contextmanager
def _held_back(log: logging.Logger):
    """`log`'s warnings are not shown during the block."""
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


def render(results: list[Measurement]) -> str:
    """A table of images/s and the ratio of each pipeline to the ceiling (the first row); a
    pipeline whose pass is too short to time gets a warning instead of a ratio."""
    ceiling = results[0].images_per_s
    lines = ["| pipeline | images/s | / ceiling |", "|---|---|---|"]
    warnings = []
    for result in results:
        ratio = f"{result.images_per_s / ceiling:.2f}x" if ceiling else "-"
        if result.too_short:
            ratio = "too small to time"
            # A smaller batch helps only where the split holds enough records.
            smaller = " (or a smaller --batch_size)" if result.pass_images is None or \
                result.pass_images >= MIN_PASS_BATCHES else f": it holds {result.pass_images}"  # fmt: skip
            warnings.append(
                f"WARNING: a pass of {result.name} is only {result.pass_batches} batch(es), so "
                "restarting it, not reading, sets its rate. Bench a split of at least "
                f"{MIN_PASS_BATCHES} batches{smaller}."
            )
        lines.append(f"| {result.name} | {result.images_per_s:.0f} | {ratio} |")
    return "\n".join(lines + warnings)
