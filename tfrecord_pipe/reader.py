"""The input pipeline for training and evaluation: `make_input_fn`, or `build_dataset` with a
`ReaderConfig`. See docs/api.md; the implementation is in `tfrecord_pipe._reading` (`reader`,
`reader_config`, `input_fn`, `padded`, `seeded`)."""

from tfrecord_pipe._reading.input_fn import InputFn, make_input_fn
from tfrecord_pipe._reading.padded import eval_steps, padded_weight
from tfrecord_pipe._reading.reader import build_dataset, read_records
from tfrecord_pipe._reading.records import parse_spec
from tfrecord_pipe._reading.reader_config import (
    ReaderConfig,
    Source,
    data_options,
    prefetch_size,
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
    "parse_spec",
    "prefetch_size",
    "read_records",
    "resolve_source",
]
