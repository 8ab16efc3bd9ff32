"""TFRecord files written without TensorFlow read back with tf.data, checksums verified."""

import pytest
import tensorflow as tf

from beam_jobs.record_writer import RecordWriter


@pytest.mark.parametrize("compress", [False, True])
def test_records_read_back_in_order_with_tf_data(tmp_path, compress):
    records = [b"", b"x", bytes(range(256)) * 300, "ünïcode".encode()]
    path = str(tmp_path / ("a.tfrecord.gz" if compress else "a.tfrecord"))
    with RecordWriter(path, compress) as writer:
        for record in records:
            writer.write(record)

    read = tf.data.TFRecordDataset(path, compression_type="GZIP" if compress else "")
    assert [r.numpy() for r in read] == records


def test_a_flipped_byte_fails_tf_s_checksum(tmp_path):
    path = tmp_path / "a.tfrecord"
    with RecordWriter(str(path)) as writer:
        writer.write(b"payload" * 10)
    data = bytearray(path.read_bytes())
    data[20] ^= 0xFF  # inside the payload
    path.write_bytes(bytes(data))
    with pytest.raises(tf.errors.DataLossError):
        list(tf.data.TFRecordDataset(str(path)))
