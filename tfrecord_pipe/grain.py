"""Grain input pipelines over a dataset's ArrayRecord shards (`--formats ...array_record`),
for JAX: a per-epoch global shuffle, per-record seeded augmentation, this host's share,
padded evaluation, and exact resumption from a small state. See docs/grain.md; the
implementation is `tfrecord_pipe._grain`. Needs the `grain` extra, not TensorFlow."""

from tfrecord_pipe._core.crops import MEAN_RGB, STDDEV_RGB
from tfrecord_pipe._grain.images import eval_image, normalize, train_image
from tfrecord_pipe._grain.pipeline import make_dataset
from tfrecord_pipe._grain.resume import GrainInput, ResumableBatches
from tfrecord_pipe._grain.source import find_split, source

__all__ = [
    "MEAN_RGB",
    "STDDEV_RGB",
    "GrainInput",
    "ResumableBatches",
    "eval_image",
    "find_split",
    "make_dataset",
    "normalize",
    "source",
    "train_image",
]
