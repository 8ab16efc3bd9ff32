"""The input pipeline for training and evaluation: `make_input_fn`, or `build_dataset` with a
`ReaderConfig`. See docs/api.md; the implementation is `tfrecord_pipe.reading.reader`."""

from tfrecord_pipe.reading.reader import (
    InputFn,
    ReaderConfig,
    Source,
    build_dataset,
    data_options,
    eval_steps,
    make_input_fn,
    padded_weight,
    prefetch_size,
    read_records,
    resolve_source,
)

__all__ = [
    "InputFn",
    "ReaderConfig",
    "Source",
    "build_dataset",
    "data_options",
    "eval_steps",
    "make_input_fn",
    "padded_weight",
    "prefetch_size",
    "read_records",
    "resolve_source",
]
