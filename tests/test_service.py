"""reader.ReaderConfig(data_service=...): training batches made by tf.data service workers.

The dispatcher and two workers run in this process on 127.0.0.1, as real servers: the
pipeline is serialised, sent to the workers over gRPC and its batches streamed back.
"""

import gc
import logging
import socket
import time

import numpy as np
import pytest
import tensorflow as tf

from tfrecord_pipe import reader
from tfrecord_pipe._reading import tpu_ready

from dataset_factory import write_dataset
from helpers import run_cli, run_python

SIZE = 24
BATCH = 4


@pytest.fixture(scope="module")
def service():
    """(dispatcher address, workers): one dispatcher, two workers."""
    api = tf.data.experimental.service
    # Jobs without clients are collected, and their tasks ended, within a second or so:
    # a worker still running an abandoned job's task took 10-70 s to stop.
    dispatcher = api.DispatchServer(
        api.DispatcherConfig(port=0, job_gc_check_interval_ms=200, job_gc_timeout_ms=200)
    )
    address = dispatcher.target.replace("localhost", "127.0.0.1")
    workers = [
        api.WorkerServer(
            api.WorkerConfig(
                dispatcher_address=address.split("://")[1],
                worker_address="127.0.0.1:%port%",
                port=0,
                heartbeat_interval_ms=200,
            )
        )
        for _ in range(2)
    ]
    yield address, workers
    gc.collect()  # iterators that still hold a job
    time.sleep(1)  # its collection, and a heartbeat
    for worker in workers:
        worker.stop()
    dispatcher.stop()


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("service") / "ds")
    write_dataset(folder, {"train": [[0, 1, 2, 0], [1, 2, 0, 1]], "validation": [[0, 1]]})
    return folder


def served_config(dataset, address, **options):
    settings = dict(data=dataset, batch_size=BATCH, image_size=SIZE, data_service=address)
    return reader.ReaderConfig(**{**settings, **options})


# uint8 24x24: whole batches travel; float32 1100x1100 (14.5 MB an image): one image at a time,
# put back into batches of 4 on this side.
@pytest.mark.parametrize(
    "dtype, size", [("uint8", SIZE), pytest.param("float32", 1100, marks=pytest.mark.slow)]
)
def test_training_batches_come_from_the_workers_with_static_shapes(dataset, service, dtype, size):
    address, workers = service
    served = reader.build_dataset(served_config(dataset, address, dtype=dtype, image_size=size))
    tpu_ready.check(served, batch_size=BATCH)
    assert served.element_spec[0].shape == (BATCH, size, size, 3)
    iterator = iter(served)
    labels = [label for _ in range(4) for label in next(iterator)[1].numpy()]
    assert len(labels) == 4 * BATCH and set(labels) <= {0, 1, 2}
    # Private, but the one place the workers say they run the pipeline: a task each.
    assert [worker._num_tasks() >= 1 for worker in workers] == [True, True]


@pytest.mark.parametrize(
    "dtype, size", [("uint8", SIZE), pytest.param("float32", 1100, marks=pytest.mark.slow)]
)
def test_transposed_batches_are_hwcn_whether_whole_or_in_parts(dataset, service, dtype, size):
    address, _ = service
    config = served_config(dataset, address, dtype=dtype, image_size=size, transpose_input=True)
    images, labels = next(iter(reader.build_dataset(config)))
    assert images.shape == (size, size, 3, BATCH) and labels.shape == (BATCH,)


def test_local_files_warn_that_the_workers_must_see_them_too(dataset, service, caplog):
    address, _ = service
    with caplog.at_level(logging.WARNING, logger="tfrecord_pipe._reading.service"):
        reader.build_dataset(served_config(dataset, address))
    assert f"data_service with local files ({dataset})" in caplog.text


def test_a_keras_model_trains_on_served_batches(dataset, service):
    address, _ = service
    train = reader.build_dataset(served_config(dataset, address, dtype="uint8"))
    model = tf.keras.Sequential(
        [
            tf.keras.Input((SIZE, SIZE, 3), dtype="uint8"),
            tf.keras.layers.Rescaling(1 / 255),
            tf.keras.layers.GlobalAveragePooling2D(),
            tf.keras.layers.Dense(3),
        ]
    )
    model.compile("sgd", tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    history = model.fit(train, steps_per_epoch=3, epochs=1, verbose=0, shuffle=False)
    assert np.isfinite(history.history["loss"][0])


@pytest.mark.parametrize(
    "options, message",
    [
        ({"is_training": False}, "data_service is for training"),
        ({"seed": 1}, "leave seed=None"),
        ({"deterministic": True}, "leave deterministic unset"),
        ({"data_service": " "}, "data_service is empty"),
    ],
)
def test_settings_the_service_cannot_honour_are_refused(options, message):
    settings = {"data": "x", "is_training": True, "data_service": "grpc://127.0.0.1:1"}
    with pytest.raises(ValueError, match=message):
        reader.ReaderConfig(**{**settings, **options})


@pytest.mark.slow  # over a second of CPU: out of the fast subset
def test_each_input_pipeline_is_served_from_its_own_files(tmp_path, service):
    """Two hosts (input pipelines): the workers read each host's share of the files only."""
    address, _ = service
    folder = str(tmp_path / "by_shard")
    labels = ("a", "b", "c", "d")
    write_dataset(folder, {"train": [[label] * 3 for label in range(4)]}, labels=labels)
    input_fn = reader.make_input_fn(
        folder, is_training=True, image_size=SIZE, batch_size=8, data_service=address
    )
    for index in range(2):
        served = input_fn(tf.distribute.InputContext(2, index, num_replicas_in_sync=2))
        iterator = iter(served)
        seen = {int(label) for _ in range(6) for label in next(iterator)[1].numpy()}
        # Shard i holds label i; files are dealt round-robin to the pipelines.
        assert seen == {index, index + 2}


@pytest.mark.slow
def test_bench_times_training_batches_from_the_service(dataset, service):
    # That the address reaches the reader shows in the next test: a wrong one is reported.
    address, _ = service
    sizes = ("--image_size", SIZE, "--batch_size", BATCH)
    done = run_cli(
        "bench", dataset, "--seconds", "0.05", *sizes, "--dtype", "uint8", "--data_service", address
    )
    assert done.returncode == 0, done.stderr
    assert f"training batches by the tf.data service at {address}" in done.stdout
    rows = [line.split("|")[1].strip() for line in done.stdout.splitlines() if line.startswith("| ")]
    assert rows[1:] == ["ceiling", "train", "eval"]


def _closed_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (bound, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.parametrize("address", ["grpc://127.0.0.1:{port}", "grpc://127.0.0.1", "dispatcher"])
def test_an_unreachable_dispatcher_fails_at_once_saying_what_to_check(dataset, address):
    # TensorFlow itself would retry an unreachable dispatcher without end, in silence.
    address = address.format(port=_closed_port())
    with pytest.raises(ConnectionError, match="No tf.data service dispatcher at .*grpc://HOST:PORT"):
        reader.build_dataset(served_config(dataset, address))


def test_a_dispatcher_that_never_answers_or_a_worker_is_refused_in_seconds(dataset, service):
    # A port that accepts and never answers (a frozen dispatcher): bench hung, deaf to Ctrl-C.
    # In a process of its own, as a regression would hang.
    done = run_python(
        "import socket\n"
        "from tfrecord_pipe import reader\n"
        "from tfrecord_pipe._reading import service\n"
        "service.DISPATCHER_TIMEOUT_S = 1.0\n"
        "frozen = socket.socket()\n"
        "frozen.bind(('127.0.0.1', 0))\n"
        "frozen.listen(8)\n"
        "address = f'grpc://127.0.0.1:{frozen.getsockname()[1]}'\n"
        f"config = reader.ReaderConfig({str(dataset)!r}, batch_size={BATCH}, image_size={SIZE}, "
        "data_service=address)\n"
        "try:\n"
        "    reader.build_dataset(config)\n"
        "except ConnectionError as err:\n"
        "    print('REFUSED', err)\n",
        timeout=60, preloaded=True,
    )  # fmt: skip
    assert "REFUSED The tf.data service dispatcher at 'grpc://127.0.0.1:" in done.stdout, done
    assert "' did not answer within 1 s. Check that the address is the dispatcher's" in done.stdout
    worker = f"grpc://{service[1][0]._address}"  # (TensorFlow says it no other way)
    with pytest.raises(ConnectionError, match="is no dispatcher .*a worker's"):
        reader.build_dataset(served_config(dataset, worker))


@pytest.mark.slow
def test_bench_with_an_unreachable_dispatcher_exits_2(dataset):
    address = f"grpc://127.0.0.1:{_closed_port()}"
    done = run_cli("bench", dataset, "--data_service", address)
    assert done.returncode == 2
    assert f"error: No tf.data service dispatcher at '{address}'" in done.stderr
