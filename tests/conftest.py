"""Fixtures many test modules share: a real local GCS (local_gcs.py), and one small dataset
written by the conversion job."""

import os
import shutil
import tempfile

# Read by TensorFlow's GCS filesystem and google-auth when they are first loaded, so they must
# be set before anything imports them: fail fast instead of retrying for minutes offline.
os.environ.setdefault("GCS_RETRY_CONFIG_MAX_RETRIES", "2")
os.environ.setdefault("NO_GCE_CHECK", "true")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# JAX on the CPU, which the suite's checks are written for: otherwise each process that starts
# JAX (a dozen or more a run) first looks for GPU and TPU plugins, 0.5 CPU-s on this machine.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Keras on TensorFlow, which the suite's Keras tests are written for (the tests of Keras on
# JAX set it themselves): a shell's KERAS_BACKEND=jax, or a ~/.keras/keras.json saying jax,
# would move every one of them to JAX.
os.environ["KERAS_BACKEND"] = "tensorflow"
# JAX programs compiled once for the whole run, not again in each process that runs them (the
# killed and resumed runs, the hosts of a two-host run): a third of such a process's CPU.
# Made by the first process (pytest's, or xdist's controller); its workers inherit it.
_JAX_CACHE_MADE = "JAX_COMPILATION_CACHE_DIR" not in os.environ
if _JAX_CACHE_MADE:
    os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="tfrecord-pipe-tests-jax-")
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "0"

import pytest  # noqa: E402

import local_gcs  # noqa: E402
import preloaded  # noqa: E402
from helpers import IN_PROCESS, write_image_folder  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def temporary_files_in_this_run(tmp_path_factory):
    """Temporary files of the tests and the processes they start go under this run's folder,
    which pytest removes a few runs later: TensorFlow's autograph sources, Beam's and
    multiprocessing's folders, and what the processes that tests kill leave behind piled
    up in /tmp by the thousand."""
    folder = str(tmp_path_factory.mktemp("tmp"))
    os.environ["TMPDIR"], tempfile.tempdir = folder, folder


@pytest.fixture(scope="session")
def gcs(tmp_path_factory):
    """A real GCS endpoint on 127.0.0.1 with bucket `test-bucket`, exported to this process.

    Fails (never skips) when it cannot start: a test that needs GCS must not pass without it.
    """
    with local_gcs.LocalGcs(tmp_path_factory.mktemp("gcs")) as server, server.exported():
        yield server


@pytest.fixture(scope="session")
def converted(tmp_path_factory):
    """(source folder, dataset folder): 5 JPEGs per label of red, green, blue and one
    truncated file, converted into 2 shards per split with validation_fraction 0.3."""
    from beam_jobs import convert

    root = tmp_path_factory.mktemp("converted")
    src = write_image_folder(root / "src", per_label=5, odd=("truncated_jpeg.jpg",))
    convert.run([str(src), str(root / "out"), "--num_shards", "2", "--validation_fraction",
                 "0.3", *IN_PROCESS])  # fmt: skip
    return src, root / "out"


@pytest.fixture
def workers_forked(monkeypatch):
    """The local engine's and verify's workers forked from this process, as they were before
    they came from a fork server: so that what a test patches here, to make a worker fail,
    reaches them."""
    from beam_jobs import worker_pool

    monkeypatch.setattr(worker_pool, "START_METHOD", "fork")


@pytest.fixture
def converted_copy(converted, tmp_path):
    """A copy of `converted` that a test may tamper with."""
    src, out = converted
    shutil.copytree(src, tmp_path / "src")
    shutil.copytree(out, tmp_path / "out")
    return tmp_path / "src", tmp_path / "out"


def pytest_unconfigure(config):
    preloaded.stop()
    if _JAX_CACHE_MADE:
        shutil.rmtree(os.environ["JAX_COMPILATION_CACHE_DIR"], ignore_errors=True)
