"""TFRecord files written and read without TensorFlow, held to what tf.data reads: records, checksums, damage."""

import pytest
import tensorflow as tf

from beam_jobs import record_reader
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


def test_a_local_compressed_shard_is_the_one_beam_s_filesystems_write(tmp_path):
    # Local files are written without Beam now (its import cost the workers most of a
    # CPU-second); a shard must not depend on which way it was written.
    from apache_beam.io.filesystem import CompressionTypes
    from apache_beam.io.filesystems import FileSystems

    from beam_jobs import storage

    chunks = [b"", b"x", bytes(range(256)) * 3000, b"tail"]
    ours, beams = tmp_path / "new" / "ours.gz", tmp_path / "beams.gz"
    with storage.create(str(ours), compress=True) as f:  # its folder made, as Beam makes it
        for chunk in chunks:
            f.write(chunk)
    with FileSystems.create(str(beams), compression_type=CompressionTypes.GZIP) as f:
        for chunk in chunks:
            f.write(chunk)
    assert ours.read_bytes() == beams.read_bytes()


def test_a_failed_local_rename_is_a_storage_error_not_a_missing_input(tmp_path):
    # The launcher takes FileNotFoundError for bad input (exit 2, no guidance); a rename of
    # the job's own file that fails is the job failing (exit 1), as it was through Beam.
    from beam_jobs import storage

    with pytest.raises(OSError, match="Cannot rename") as raised:
        storage.rename([str(tmp_path / "gone")], [str(tmp_path / "there")])
    assert not isinstance(raised.value, FileNotFoundError)


def test_a_flipped_byte_fails_tf_s_checksum(tmp_path):
    path = tmp_path / "a.tfrecord"
    with RecordWriter(str(path)) as writer:
        writer.write(b"payload" * 10)
    data = bytearray(path.read_bytes())
    data[20] ^= 0xFF  # inside the payload
    path.write_bytes(bytes(data))
    with pytest.raises(tf.errors.DataLossError):
        list(tf.data.TFRecordDataset(str(path)))


def _tf_read(path: str, compression: str = "") -> tuple[list[bytes], bool]:
    """TensorFlow's reading of a TFRecord file: the records it gives, and whether it failed."""
    read = []
    try:
        for record in tf.data.TFRecordDataset(path, compression_type=compression):
            read.append(record.numpy())
    except tf.errors.OpError:
        return read, True
    return read, False


def _our_read(path: str, compression: str = "") -> tuple[list[bytes], str | None]:
    read = []
    try:
        for record in record_reader.records(path, compression):
            read.append(record)
    except record_reader.CorruptShardError as err:
        return read, str(err)
    return read, None


@pytest.mark.slow  # every cut and damage of a shard, read both ways
@pytest.mark.parametrize("compress", [False, True])
def test_our_reader_gives_what_tensorflow_gives_whole_cut_short_or_damaged(tmp_path, compress):
    # verify reads shards without TensorFlow: every way a file can be damaged must read as
    # TensorFlow reads it, the records before the damage then an error, never a silent end.
    # Ours is stricter in two ways: TensorFlow takes a file cut inside a record's 12-byte
    # header, and a gzip stream cut anywhere, for the file's end, without an error.
    records = [b"", b"x", bytes(range(256)) * 40, "ünïcode".encode(), b"last" * 100]
    whole = tmp_path / ("whole.tfrecord.gz" if compress else "whole.tfrecord")
    with RecordWriter(str(whole), compress) as writer:
        for record in records:
            writer.write(record)
    compression = "GZIP" if compress else ""
    assert _our_read(str(whole), compression) == (records, None)
    assert _tf_read(str(whole), compression) == (records, False)
    data = whole.read_bytes()
    cuts = [1, 11, *range(13, len(data), max(1, len(data) // 75))]  # 1, 11: in a header
    damaged = [data[:cut] for cut in cuts]
    if not compress:  # a flipped byte in every part of a record: length, its CRC, data, CRC
        damaged += [data[:at] + bytes([data[at] ^ 0x5A]) + data[at + 1:]
                    for at in range(0, len(data), max(1, len(data) // 75))]  # fmt: skip
    stricter = 0
    for number, content in enumerate(damaged):
        path = tmp_path / f"damaged-{number}{whole.suffix}"
        path.write_bytes(content)
        (ours, problem), (theirs, failed) = _our_read(str(path), compression), _tf_read(
            str(path), compression)  # fmt: skip
        assert ours == theirs, (number, len(content))
        assert problem is not None, (number, len(content))  # every damage is said
        if not failed:
            assert "truncated record" in problem or "not a whole gzip stream" in problem, problem
            stricter += 1
    assert stricter, "no cut fell inside a header: the sample misses the case"


def test_a_missing_shard_is_not_found_not_empty(tmp_path):
    for name in ("gone.tfrecord", "gone.array_record"):
        with pytest.raises(FileNotFoundError):
            list(record_reader.records(str(tmp_path / name)))


@pytest.mark.parametrize("compress", [False, True])
def test_a_length_of_a_terabyte_with_a_good_checksum_is_damage_said_at_once(tmp_path, compress):
    # Read as asked, it was a terabyte's allocation: a MemoryError that verify took for a
    # storage failure, retried, and reported with no reason.
    import gzip
    import struct

    from beam_jobs.record_writer import masked_crc32c

    length = struct.pack("<Q", 1 << 40)
    data = length + struct.pack("<I", masked_crc32c(length)) + b"only a few bytes"
    path = tmp_path / ("huge.tfrecord.gz" if compress else "huge.tfrecord")
    path.write_bytes(gzip.compress(data) if compress else data)
    with pytest.raises(record_reader.CorruptShardError, match="truncated record at offset 0"):
        list(record_reader.records(str(path), "GZIP" if compress else ""))
