"""TensorFlow loaded without the lines it prints as it starts on a machine with no GPU. See
docs/api.md; the implementation is `tfrecord_pipe._reading.tensorflow_start`."""

from tfrecord_pipe._reading.tensorflow_start import start

__all__ = ["start"]
