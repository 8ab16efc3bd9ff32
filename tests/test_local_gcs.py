"""The test GCS is real enough: each of our three clients reads what the other two wrote.

TensorFlow talks to it through its own compiled-in gs:// code (via the TLS proxy), Beam and
google-cloud-storage through STORAGE_EMULATOR_HOST. If any of these breaks, every gs:// test
downstream would test nothing, so this file checks the plumbing itself.
"""

import os
import pathlib
import time

import apache_beam as beam
import pytest
import tensorflow as tf
from apache_beam.io.filesystems import FileSystems
from google.cloud import storage

import local_gcs

pytestmark = pytest.mark.slow  # a real emulator and proxy, in their own processes


def write_with_tf(url: str, data: bytes):
    with tf.io.gfile.GFile(url, "wb") as f:
        f.write(data)


def write_with_beam(url: str, data: bytes):
    with FileSystems.create(url) as f:
        f.write(data)


def write_with_gcs_client(url: str, data: bytes):
    bucket, _, name = url[len("gs://"):].partition("/")
    storage.Client().bucket(bucket).blob(name).upload_from_string(data)


def read_with_tf(url: str) -> bytes:
    with tf.io.gfile.GFile(url, "rb") as f:
        return f.read()


def read_with_beam(url: str) -> bytes:
    with FileSystems.open(url) as f:
        return f.read()


def read_with_gcs_client(url: str) -> bytes:
    bucket, _, name = url[len("gs://"):].partition("/")
    return storage.Client().bucket(bucket).blob(name).download_as_bytes()


WRITERS = {"tf": write_with_tf, "beam": write_with_beam, "gcs_client": write_with_gcs_client}
READERS = {"tf": read_with_tf, "beam": read_with_beam, "gcs_client": read_with_gcs_client}


@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_each_client_reads_what_another_wrote(gcs, writer):
    # 300 KB of non-repeating bytes: larger than one chunk of any client's upload buffer.
    data = os.urandom(300_000)
    url = gcs.url("cross", f"written-by-{writer}.bin")
    WRITERS[writer](url, data)
    for reader in sorted(READERS):
        if reader != writer:
            assert READERS[reader](url) == data, f"{reader} read back different bytes"


def test_tfrecord_written_to_gs_by_tf_reads_back_with_tf_data(gcs, tmp_path):
    records = [os.urandom(1500 + i % 700) for i in range(3000)]  # ~5 MB
    url = gcs.url("tfrecord", "big.tfrecord")
    local = tmp_path / "big.tfrecord"
    for path in (url, str(local)):
        with tf.io.TFRecordWriter(path) as writer:
            for record in records:
                writer.write(record)

    read_back = [r.numpy() for r in tf.data.TFRecordDataset(url)]

    assert read_back == records
    assert read_with_gcs_client(url) == local.read_bytes()
    assert len(local.read_bytes()) > 4 << 20


def test_tf_glob_on_a_gs_pattern_lists_matching_objects(gcs):
    for name in ("train-00000-of-00002", "train-00001-of-00002", "validation-00000-of-00001"):
        write_with_gcs_client(gcs.url("glob", name), b"x")
    assert sorted(tf.io.gfile.glob(gcs.url("glob", "train-*"))) == [
        gcs.url("glob", "train-00000-of-00002"),
        gcs.url("glob", "train-00001-of-00002"),
    ]


def test_tf_makedirs_and_listdir_on_gs(gcs):
    # TF creates zero-byte "dir/" objects here, which the bare emulator cannot store.
    tf.io.gfile.makedirs(gcs.url("made", "sub"))
    write_with_tf(gcs.url("made", "sub", "f.txt"), b"y")
    assert tf.io.gfile.isdir(gcs.url("made", "sub"))
    assert "f.txt" in tf.io.gfile.listdir(gcs.url("made", "sub"))


def test_beam_pipeline_round_trips_through_gs_without_credential_retries(gcs):
    started = time.monotonic()
    prefix = gcs.url("beam", "words")
    with beam.Pipeline(runner="FnApiRunner") as pipeline:
        _ = (
            pipeline
            | beam.Create(["alpha", "beta", "gamma"])
            | beam.io.WriteToText(prefix, num_shards=1, shard_name_template="")
        )
    elapsed = time.monotonic() - started
    assert read_with_tf(prefix).decode().split() == ["alpha", "beta", "gamma"]
    # Without the local credentials file google-auth retries for ~25 s before going anonymous.
    assert elapsed < 20, f"pipeline took {elapsed:.1f} s: credential look-up is retrying"


def test_server_stops_everything_it_started(tmp_path):
    with local_gcs.LocalGcs(tmp_path) as server:
        processes = [server._emulator, server._proxy]
        pids = [p.pid for p in processes]
        assert all(p.poll() is None for p in processes)
    assert all(p.poll() is not None for p in processes)
    for pid in pids:  # stopped and reaped: nothing left in the process table
        assert not pathlib.Path(f"/proc/{pid}").exists()


def test_a_dead_emulator_fails_loudly(tmp_path, monkeypatch):
    monkeypatch.setattr(local_gcs.sys, "executable", "/bin/false")
    with pytest.raises(RuntimeError, match="exited with code"):
        with local_gcs.LocalGcs(tmp_path):
            pass


def test_a_port_for_a_server_to_bind_is_never_one_the_os_hands_out_meanwhile():
    # A port picked by binding port 0 and released went to the next process binding port 0
    # (another worker's proxy, Gloo, a tf.data service) before the emulator or JAX's
    # coordinator, started next, could bind it.
    import socket

    lowest = int(pathlib.Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for _ in range(20):
        port = local_gcs.free_port()
        assert 10_000 <= port < lowest
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))  # free
