"""What the converter makes of an image file (`normalise`, `ImagePolicy`) and why it rejects
one (`Rejected` and its reasons), without TensorFlow. See docs/api.md; the implementation is
`tfrecord_pipe._core.images`."""

from tfrecord_pipe._core.images import (
    DEFAULT_MAX_FILE_BYTES,
    DEFAULT_MAX_PIXELS,
    ImagePolicy,
    Rejected,
    StoredImage,
    normalise,
)

__all__ = [
    "DEFAULT_MAX_FILE_BYTES",
    "DEFAULT_MAX_PIXELS",
    "ImagePolicy",
    "Rejected",
    "StoredImage",
    "normalise",
]
