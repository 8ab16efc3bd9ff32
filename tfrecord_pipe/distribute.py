"""The strategy for this machine (TPU, GPUs or CPU) and the reader's datasets distributed
over it. See docs/api.md; the implementation is `tfrecord_pipe._reading.distribute`."""

from tfrecord_pipe._reading.fit_resume import FitResume
from tfrecord_pipe._reading.distribute import (
    TpuUnavailableError,
    describe,
    distribute,
    per_replica_batch_size,
    resolve_strategy,
    resumable_iterator,
)

__all__ = [
    "FitResume",
    "TpuUnavailableError",
    "describe",
    "distribute",
    "per_replica_batch_size",
    "resolve_strategy",
    "resumable_iterator",
]
