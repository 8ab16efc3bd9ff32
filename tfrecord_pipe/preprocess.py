"""The image preprocessing shared by training, evaluation and serving, and the normalisation
of uint8 batches on the accelerator. See docs/api.md; the implementation is
`tfrecord_pipe._reading.preprocess`."""

from tfrecord_pipe._reading.preprocess import (
    DTYPES,
    MEAN_RGB,
    STDDEV_RGB,
    Normalize,
    eval_image,
    normalize,
    train_image,
)

__all__ = ["DTYPES", "MEAN_RGB", "STDDEV_RGB", "Normalize", "eval_image", "normalize", "train_image"]
