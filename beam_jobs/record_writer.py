"""Shard files, written wherever the job writes (`storage.create`): TFRecord (its framing,
checksums and optional GZIP, written here) and ArrayRecord (written by the array-record
package).

The format (what `tf.data.TFRecordDataset` reads), per record:
  uint64 length, little-endian | uint32 masked CRC-32C of those 8 bytes | data |
  uint32 masked CRC-32C of data
and with GZIP the whole file is one gzip stream.

Why not `tf.io.TFRecordWriter`: from Python it costs several times more per record than this
(benchmarks/RESULTS.md, "Writing shards"), and a shard is written by one thread; Beam's
filesystems also reach every remote place the job can write to (gs://) without TensorFlow.
"""

from __future__ import annotations

import os
import shutil
import struct
import tempfile

import google_crc32c

from beam_jobs import storage
from tfrecord_pipe._core import array_records, naming, paths

_MASK_DELTA = 0xA282EAD8


def masked_crc32c(data: bytes) -> int:
    """The CRC-32C of `data`, rotated and offset as TFRecord stores it."""
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def framed_length(data: bytes) -> int:
    """Bytes the record `data` takes in a TFRecord file: its length, two checksums, itself."""
    return len(data) + 16


def _header(data: bytes) -> bytes:
    """What precedes a record's data in the file: its length and that length's checksum."""
    length = struct.pack("<Q", len(data))
    return length + struct.pack("<I", masked_crc32c(length))


class RecordWriter:
    """Writes records to a new TFRecord file at `path` (local, or any Beam filesystem path).

    Use as a context manager. The records go to a part file beside `path`, which takes the
    name when the writer closes: a file under `path` is always complete, whatever happens to
    this writer, and a retried writer replaces it whole (`storage.part_path`).
    """

    def __init__(self, path: str, compress: bool = False):
        self._path, self._part = path, storage.part_path(path)
        self._file = storage.create(self._part, compress=compress)

    def write(self, data: bytes) -> None:
        # Three writes into the file's buffer rather than one joined copy of the record.
        self._file.write(_header(data))
        self._file.write(data)
        self._file.write(struct.pack("<I", masked_crc32c(data)))

    def close(self) -> None:
        """Finishes the file and gives it its name."""
        self._file.close()
        storage.put_in_place(self._part, self._path)

    def __enter__(self) -> RecordWriter:
        return self

    def __exit__(self, kind, *_) -> None:
        if kind is None:
            self.close()
        else:  # failed midway: the part file is left in the temporary folder, never named
            self._file.close()


class ArrayRecordFileWriter:
    """Writes records to a new ArrayRecord file at `path` (local, or any Beam filesystem path);
    used as RecordWriter is, with the same guarantee: a file under `path` is always complete.

    The array-record package writes local files only: a remote file is written to local disk
    first, then copied to its part file beside `path`.
    """

    def __init__(self, path: str, compress: bool = False):
        self._path, self._part = path, storage.part_path(path)
        self._local = None
        if paths.is_remote(path):
            handle, self._local = tempfile.mkstemp(suffix="." + naming.ARRAY_RECORD)
            os.close(handle)
        else:  # `storage.create` makes a file's folder; the package does not
            paths.make_local_folder(paths.parent(path))
        try:
            self._writer = array_records.Writer(self._local or self._part, compress)
        except BaseException:
            self._remove_local()
            raise

    def write(self, data: bytes) -> None:
        self._writer.write(data)

    def close(self) -> None:
        """Finishes the file and gives it its name."""
        try:
            self._writer.close()
            if self._local:
                with open(self._local, "rb") as source, storage.create(self._part) as target:
                    shutil.copyfileobj(source, target, 1 << 20)
        finally:
            self._remove_local()
        storage.put_in_place(self._part, self._path)

    def _remove_local(self) -> None:
        if self._local and os.path.exists(self._local):
            os.remove(self._local)

    def __enter__(self) -> ArrayRecordFileWriter:
        return self

    def __exit__(self, kind, *_) -> None:
        if kind is None:
            self.close()
        else:  # failed midway: as RecordWriter, no file takes the name
            self._writer.__exit__(kind)
            self._remove_local()


def open_shard(path: str, compress: bool):
    """The writer of the shard file `path`, for the format its name says."""
    if naming.file_format_of(path) == naming.ARRAY_RECORD:
        return ArrayRecordFileWriter(path, compress)
    return RecordWriter(path, compress)
