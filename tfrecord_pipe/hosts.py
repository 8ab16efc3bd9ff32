"""Which share of the data a host reads when JAX runs the training. See docs/api.md; the
implementation is `tfrecord_pipe._reading.hosts`."""

from tfrecord_pipe._reading.hosts import jax_in_use, keep_tensorflow_off_accelerators

__all__ = ["jax_in_use", "keep_tensorflow_off_accelerators"]
