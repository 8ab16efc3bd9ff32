"""The record format: feature keys, `ImageRecord`, `serialize` and `decode_example`, without
TensorFlow. See docs/api.md; the implementation is `tfrecord_pipe._core.schema`."""

from tfrecord_pipe._core.schema import (
    CHANNELS,
    COLORSPACE,
    DEFAULT_LABEL_OFFSET,
    ENCODED,
    FEATURES,
    FILENAME,
    FORMAT,
    FORMAT_VERSION,
    HEIGHT,
    LABEL,
    SHA256,
    SYNSET,
    WIDTH,
    ImageRecord,
    decode_example,
    parse_features,
    serialize,
)

__all__ = [
    "CHANNELS",
    "COLORSPACE",
    "DEFAULT_LABEL_OFFSET",
    "ENCODED",
    "FEATURES",
    "FILENAME",
    "FORMAT",
    "FORMAT_VERSION",
    "HEIGHT",
    "LABEL",
    "SHA256",
    "SYNSET",
    "WIDTH",
    "ImageRecord",
    "decode_example",
    "parse_features",
    "serialize",
]
