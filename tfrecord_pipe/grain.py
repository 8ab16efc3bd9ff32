"""Grain input pipelines over a dataset's ArrayRecord shards (`--formats ...array_record`),
for JAX: a per-epoch global shuffle, per-record seeded augmentation, this host's share,
padded evaluation, and exact resumption from a small state. See docs/grain.md; the
implementation is `tfrecord_pipe._grain`. Needs the `grain` extra, not TensorFlow."""

from tfrecord_pipe._core import extras
from tfrecord_pipe._core.crops import MEAN_RGB, STDDEV_RGB

try:  # the grain extra's, as Grain, array-record and OpenCV are (loaded where first used)
    import numpy  # noqa: F401
except ImportError as err:
    raise ImportError(f"The Grain path needs the grain extra: {extras.how_to_install('grain')}.") from err

from tfrecord_pipe._grain.images import eval_image, normalize, train_image  # noqa: E402
from tfrecord_pipe._grain.pipeline import make_dataset  # noqa: E402
from tfrecord_pipe._grain.resume import GrainInput, ResumableBatches  # noqa: E402
from tfrecord_pipe._grain.source import find_split, source  # noqa: E402

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
