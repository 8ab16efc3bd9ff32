"""Checks that a dataset's batches are what XLA on a TPU needs (static shapes, TPU dtypes). See
docs/api.md; the implementation is `tfrecord_pipe._reading.tpu_ready`."""

from tfrecord_pipe._reading.tpu_ready import NotTpuReadyError, check

__all__ = ["NotTpuReadyError", "check"]
