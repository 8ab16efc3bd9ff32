"""Training batches made by tf.data service workers and streamed to this host.

For hosts whose CPUs cannot keep the accelerator fed: `ReaderConfig(data_service=...)` makes
the reader hand its training pipeline, up to the batches, to the service's workers.

ShardingPolicy.OFF: each worker runs the whole (endlessly repeating) training pipeline on this
pipeline's files, in its own random order; this host takes batches from whichever worker has
one ready. The workers autotune: this host's core count says nothing about theirs.
Uncompressed, as the service's compression cost images/s for every dtype (benchmarks/
RESULTS.md, "tf.data service").
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import tensorflow as tf

from tfrecord_pipe._core import network, paths

log = logging.getLogger(__name__)

# Largest element the service streams: bigger batches travel in equal parts and are put back
# together here. The host's CPU cost per image rises steeply with the element's size (new
# pages for every buffer beyond glibc's mmap limit; benchmarks/RESULTS.md, "tf.data service").
STREAMED_BYTES = 24 << 20  # 24 MiB
# How long to wait for the dispatcher to accept a connection: TensorFlow itself would retry an
# unreachable one without end, in silence.
DISPATCHER_TIMEOUT_S = 10.0


def served_batches(
    examples: tf.data.Dataset,
    *,
    address: str,
    data: str,
    batch: int,
    image_bytes: int,
    transpose: Callable | None,
    worker_options: tf.data.Options,
) -> tf.data.Dataset:
    """Batches of `examples`, made by the service's workers.

    Args:
      examples: the training pipeline up to the batches (parsed, preprocessed examples).
      address: the dispatcher, "grpc://host:port".
      data: the dataset path the workers open (a local one gets a warning).
      batch: examples per batch.
      image_bytes: bytes of one example's image, to size what travels.
      transpose: a function from a batch to its HWCN layout, or None to keep NHWC. Whole
        batches are transposed by the workers, parts here once put back together.
      worker_options: the tf.data options the workers run the pipeline with.
    """
    check_dispatcher(address)
    if not paths.is_remote(data):
        log.warning(
            "data_service with local files (%s): the service's workers open the same paths, "
            "so they must see them too (a shared filesystem); gs:// paths work everywhere.",
            data,
        )
    service = tf.data.experimental.service
    part = streamed_batch(batch, image_bytes)
    whole = part == batch
    parts = examples.batch(part, drop_remainder=True)
    if whole and transpose:
        parts = parts.map(transpose, num_parallel_calls=tf.data.AUTOTUNE)
    parts = parts.with_options(worker_options).apply(
        service.distribute(service.ShardingPolicy.OFF, address, compression=None)
    )
    if whole:
        return parts
    batches = parts.rebatch(batch, drop_remainder=True)
    if transpose:
        batches = batches.map(transpose, num_parallel_calls=tf.data.AUTOTUNE)
    return batches


def check_dispatcher(address: str) -> None:
    """Raises ConnectionError, saying what to check, unless a dispatcher answers at `address`.

    TensorFlow waits for one without end, in silence, where nothing listens, and where what
    listens never answers (a frozen dispatcher: `bench` hung, deaf to Ctrl-C, in a helper's
    trial). So the dispatcher is asked its version, as TensorFlow's client first does.
    """
    try:
        network.check_reachable(address, DISPATCHER_TIMEOUT_S)
    except (OSError, ValueError) as err:
        raise ConnectionError(
            f"No tf.data service dispatcher at {address!r} ({err}). Give its address as "
            "grpc://HOST:PORT, check it is running and reachable from this machine, or leave "
            "data_service unset to make the batches here."
        ) from err
    if problem := _unanswered(address):
        raise ConnectionError(
            f"The tf.data service dispatcher at {address!r} {problem}. Check that the address "
            "is the dispatcher's and that it runs, or leave data_service unset to make the "
            "batches here."
        )


def _unanswered(address: str) -> str | None:
    """What is wrong with the dispatcher's answer to GetVersion; None where it answered."""
    import grpc  # TensorFlow's own dependency

    target = address.split("://", 1)[-1]
    with grpc.insecure_channel(target) as channel:
        ask = channel.unary_unary("/tensorflow.data.DispatcherService/GetVersion",
                                  request_serializer=bytes, response_deserializer=bytes)  # fmt: skip
        try:
            ask(b"", timeout=DISPATCHER_TIMEOUT_S)  # an empty GetVersionRequest
        except grpc.RpcError as err:
            if err.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                return f"did not answer within {DISPATCHER_TIMEOUT_S:g} s"
            if err.code() == grpc.StatusCode.UNIMPLEMENTED:
                return "is no dispatcher (it does not know a dispatcher's calls: a worker's?)"
            return f"did not answer as a dispatcher ({err.code().name}: {err.details()})"
    return None


def streamed_batch(batch: int, image_bytes: int) -> int:
    """Examples per element the service streams: `batch`, or its largest divisor whose images
    fit in STREAMED_BYTES."""
    fitting = max(STREAMED_BYTES // image_bytes, 1)
    return max(part for part in range(1, batch + 1) if batch % part == 0 and part <= fitting)
