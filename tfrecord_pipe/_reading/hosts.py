"""Which share of the data a host reads when JAX, not tf.distribute, runs the training.

A JAX program runs one process per host, and each host feeds its devices its own slice of the
global batch. `make_input_fn(host_index=, host_count=)` deals the files to hosts exactly as
tf.distribute deals them to input pipelines (an InputContext with one pipeline and one replica
per host): disjoint files, the global batch split evenly, and the same number of evaluation
batches on every host, so that no host waits in a collective for another that has finished.
With JAX in use (`jax_in_use`) and no position given, the position is jax.process_index() of
jax.process_count(), and TensorFlow, which then only feeds data, is kept off the accelerators.
"""

from __future__ import annotations

import logging
import sys

import tensorflow as tf

log = logging.getLogger(__name__)

_ACCELERATORS = ("GPU", "TPU")


def jax_in_use() -> bool:
    """Whether this process trains with JAX: Keras runs on JAX, JAX's hosts are joined
    (`jax.distributed.initialize()`, which starts no backend: hosts that asked for batches
    before their first JAX op each read the whole split, a helper's trial), or JAX has
    started its backend (any `jax.devices()`, `jax.process_index()` or array op does).

    Having imported jax is not enough: TensorFlow itself imports it when it is installed, and
    a TensorFlow program must keep its accelerators.
    """
    if "jax" not in sys.modules:
        return False
    keras = sys.modules.get("keras")
    if keras is not None and keras.backend.backend() == "jax":
        return True
    joined = getattr(sys.modules.get("jax.distributed"), "is_initialized", None)
    if joined is not None and joined():
        return True
    bridge = sys.modules.get("jax._src.xla_bridge")  # no public way to ask, as of jax 0.10
    started = getattr(bridge, "backends_are_initialized", None)
    return bool(started is not None and started())


def position(host_index: int | None, host_count: int | None) -> tuple[int, int] | None:
    """(index, count) of this host: as given, from JAX when it is in use, else None.

    Raises:
      ValueError: only one of the two is given, or they do not make a position.
    """
    if (host_index is None) != (host_count is None):
        raise ValueError(
            "Give both host_index and host_count (this host's position among the hosts), or "
            "neither (JAX's process index and count, when JAX is in use: `jax_in_use`)."
        )
    if host_count is None:
        if not jax_in_use():
            return None
        jax = sys.modules["jax"]

        host_index, host_count = jax.process_index(), jax.process_count()
    if host_count < 1 or not 0 <= host_index < host_count:
        raise ValueError(
            f"host_index must be in [0, host_count) and host_count >= 1; got host_index="
            f"{host_index}, host_count={host_count}"
        )
    return host_index, host_count


def input_context(index: int, count: int) -> tf.distribute.InputContext:
    """The InputContext tf.distribute would give host `index` of `count`, one replica each."""
    return tf.distribute.InputContext(
        num_input_pipelines=count, input_pipeline_id=index, num_replicas_in_sync=count
    )


def keep_tensorflow_off_accelerators() -> None:
    """Hides GPUs and TPUs from TensorFlow, so that it only feeds data.

    JAX owns the accelerators; TensorFlow on them would take GPU memory (by default nearly all
    of it) and contend for TPU chips. It must run before TensorFlow first runs an op: the
    reader calls it when JAX is in use; call it yourself if you use TensorFlow before that.
    """
    for kind in _ACCELERATORS:
        try:
            if tf.config.get_visible_devices(kind):
                tf.config.set_visible_devices([], kind)
        except RuntimeError:  # TensorFlow has already started on its devices
            log.warning(
                "TensorFlow already uses the %ss, so JAX has to share them. Call "
                "tfrecord_pipe.hosts.keep_tensorflow_off_accelerators() before any TensorFlow "
                "op runs.",
                kind,
            )
