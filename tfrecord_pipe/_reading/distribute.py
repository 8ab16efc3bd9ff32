"""Choosing a tf.distribute strategy (TPU, else local GPUs, else CPU) and feeding it.

    strategy = distribute.resolve_strategy()          # or resolve_strategy(tpu="my-tpu")
    train = distribute.distribute(strategy, reader.make_input_fn(..., batch_size=1024))

The decision is a pure function (`choose`), tested on its own; the TPU branch itself cannot
run without a TPU and stays thin: resolve, connect, initialise, build `TPUStrategy`.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import sys
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import tensorflow as tf

from tfrecord_pipe._core import network
from tfrecord_pipe._reading import file_share, reader_config, resume

TPU, GPUS, CPU = "tpu", "gpus", "cpu"
# Device files of a Cloud TPU VM's local chips (/dev/accel* up to v4, /dev/vfio/* from v5).
TPU_DEVICE_PATTERNS = ("/dev/accel*", "/dev/vfio/[0-9]*")
# How long to wait for a TPU's gRPC address to accept a connection before giving up.
CONNECT_TIMEOUT_S = 10.0


class TpuUnavailableError(RuntimeError):
    """A TPU was named (or detected) but cannot be used; the message says what to check."""


@dataclasses.dataclass(frozen=True)
class Choice:
    """Which strategy to build, and why.

    Attributes:
      kind: TPU, GPUS or CPU.
      tpu: what to pass to TPUClusterResolver (a name, "local", or grpc://host:port); TPU only.
      reason: one line saying why, printed with the strategy.
    """

    kind: str
    tpu: str | None = None
    reason: str = ""


def choose(
    tpu: str | None,
    environ: Mapping[str, str],
    tpu_devices: Sequence[str],
    num_gpus: int,
) -> Choice:
    """Decides TPU, GPUs or CPU from what is named and what this machine has.

    Args:
      tpu: the TPU the user named; "" or None to detect.
      environ: the environment (TPU_NAME is set on Cloud TPU setups that name the TPU).
      tpu_devices: TPU device files found on this machine (a Cloud TPU VM has some).
      num_gpus: GPUs TensorFlow sees.
    """
    if tpu:
        return Choice(TPU, tpu, f"TPU {tpu!r} was named")
    if environ.get("TPU_NAME"):
        return Choice(TPU, environ["TPU_NAME"], f"TPU_NAME={environ['TPU_NAME']!r} is set")
    if tpu_devices:
        return Choice(TPU, "local", f"this is a TPU VM ({len(tpu_devices)} TPU device files)")
    if num_gpus:
        return Choice(GPUS, reason=f"no TPU; {num_gpus} GPU(s) visible")
    return Choice(CPU, reason="no TPU and no GPU")


def resolve_strategy(tpu: str | None = None) -> tf.distribute.Strategy:
    """The strategy for this machine: TPUStrategy, MirroredStrategy over all GPUs, or default.

    Args:
      tpu: a TPU name, "local", or grpc://host:port; None to detect (TPU_NAME, TPU VM devices).

    Raises:
      TpuUnavailableError: a named or detected TPU cannot be resolved or reached.
    """
    tpu_devices = [path for pattern in TPU_DEVICE_PATTERNS for path in glob.glob(pattern)]
    choice = choose(tpu, os.environ, tpu_devices, len(tf.config.list_physical_devices("GPU")))
    if choice.kind == TPU:
        strategy = _tpu_strategy(choice.tpu)
    elif choice.kind == GPUS:
        strategy = tf.distribute.MirroredStrategy()
    else:
        strategy = tf.distribute.get_strategy()
    # Printed, not logged: which strategy and how many replicas is what a user checks first,
    # and Python's logging shows nothing below a warning until the program sets it up.
    print(f"tfrecord-pipe: using {describe(strategy)}: {choice.reason}", file=sys.stderr)
    return strategy


def _tpu_strategy(tpu: str) -> tf.distribute.TPUStrategy:
    try:
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=tpu)
    except Exception as err:  # URLError, ValueError, ...: nothing we can do but explain
        raise TpuUnavailableError(
            f"Cannot resolve TPU {tpu!r}: {err}. Check the TPU name, zone and project (or "
            "pass grpc://host:8470), or run without a TPU to use the GPUs or CPU."
        ) from err
    master = resolver.master()
    if master.startswith("grpc://"):
        _check_reachable(tpu, master)
    try:
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
    except Exception as err:
        raise TpuUnavailableError(f"TPU {tpu!r} ({master}) did not initialise: {err}") from err
    return tf.distribute.TPUStrategy(resolver)


def _check_reachable(tpu: str, master: str) -> None:
    """Fails fast: connecting to a dead gRPC address otherwise waits without end."""
    try:
        network.check_reachable(master, CONNECT_TIMEOUT_S)
    except (OSError, ValueError) as err:
        raise TpuUnavailableError(
            f"TPU {tpu!r} at {master} cannot be reached ({err}). Is it running, and is this "
            "machine in its network?"
        ) from err


def describe(strategy: tf.distribute.Strategy) -> str:
    """`TPUStrategy (8 replicas)`; the default strategy reads `default strategy (1 replica)`."""
    name = type(strategy).__name__
    if name.startswith("_Default"):
        name = "default strategy"
    replicas = strategy.num_replicas_in_sync
    return f"{name} ({replicas} replica{'s' if replicas != 1 else ''})"


def per_replica_batch_size(global_batch_size: int, strategy: tf.distribute.Strategy) -> int:
    """The batch each replica gets.

    Raises:
      ValueError: the global batch does not split evenly (replicas would differ in shape).
    """
    return reader_config.per_replica(global_batch_size, strategy.num_replicas_in_sync)


def distribute(
    strategy: tf.distribute.Strategy,
    input_fn: Callable[[tf.distribute.InputContext], tf.data.Dataset],
    *,
    start_steps: int = 0,
) -> tf.distribute.DistributedDataset:
    """`strategy.distribute_datasets_from_function(input_fn)`: one pipeline per host (worker).

    Each pipeline reads its own files and makes per-replica batches; the reader's input_fn
    gets both from the InputContext. Checks the batch splits evenly first. `start_steps`:
    seeded training: global steps already trained on (each pipeline starts after its
    batches of them).

    A finite dataset (evaluation) also gets its length in global steps right: TensorFlow
    reports a pipeline's batches, and Keras 3 runs that many steps. With several replicas per
    pipeline that is too many: the extra step's empty batches were counted by Keras's loss
    tracker, so a padded evaluation's loss was off (by 16/24 on two replicas).
    """
    config = getattr(input_fn, "config", None)
    if config is not None and config.batch_size is not None:
        per_replica_batch_size(config.batch_size, strategy)
    contexts = []

    def recorded(context):
        contexts.append(context)
        if start_steps:
            return input_fn(context, start_batches=resume.pipeline_batches(context, start_steps))
        return input_fn(context)

    distributed = strategy.distribute_datasets_from_function(recorded)
    batches = getattr(distributed, "_cardinality", None)  # a pipeline's batches (TF 2.21)
    if contexts and isinstance(batches, (int, np.integer)) and batches > 0:
        per_pipeline = file_share.replicas_per_pipeline(contexts[0])
        distributed._cardinality = batches // per_pipeline  # one global step takes one each
    return distributed


def resumable_iterator(strategy: tf.distribute.Strategy, input_fn) -> resume.DistributedIterator:
    """An iterator over a seeded training input's steps under `strategy` that
    `tf.train.Checkpoint` can save and restore (TensorFlow's own cannot):

        iterator = distribute.resumable_iterator(strategy, input_fn)
        checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, iterator=iterator)

    `next(iterator)` outside a `tf.function`; inside one that runs several steps per call,
    `next` on `iterator.in_function()`, passed in as an argument on every call.
    """
    config = getattr(input_fn, "config", None)
    if config is not None and config.batch_size is not None:
        per_replica_batch_size(config.batch_size, strategy)
    return resume.DistributedIterator(strategy, input_fn)
