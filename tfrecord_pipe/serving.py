"""Export a model whose serving signature takes image files' bytes and gives it the pixels
evaluation gave it. See docs/api.md; the implementation is `tfrecord_pipe._reading.serving`."""

from tfrecord_pipe._reading.serving import (
    DEFAULT_MAX_REQUEST_PIXELS,
    INPUT_NAME,
    SIGNATURE,
    ServingConfig,
    ServingModule,
    export,
    model_inputs,
)

__all__ = [
    "DEFAULT_MAX_REQUEST_PIXELS",
    "INPUT_NAME",
    "SIGNATURE",
    "ServingConfig",
    "ServingModule",
    "export",
    "model_inputs",
]
