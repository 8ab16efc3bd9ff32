"""Shard files read wherever they are (`storage`), without TensorFlow: TFRecord (its framing and
checksums checked as `tf.data.TFRecordDataset` checks them) and ArrayRecord.

`verify` reads every record of a dataset. Loading TensorFlow to do it costs some 700 MB of
memory in each process, four times what the rest of the job holds; reading the format
`record_writer.py` writes takes a few lines.
"""

from __future__ import annotations

import contextlib
import gzip
import os
import stat
import struct
import tempfile
import zlib
from collections.abc import Iterator

from beam_jobs import storage
from beam_jobs.record_writer import masked_crc32c
from tfrecord_pipe._core import array_records, messages, naming, paths

_HEADER = 12  # uint64 length, uint32 masked CRC-32C of it
_FOOTER = 4  # uint32 masked CRC-32C of the data
COPY_CHUNK = 8 << 20  # bytes copied at a time, fetching a remote ArrayRecord file
READ_CHUNK = 64 << 20  # bytes of one record read at a time


class CorruptShardError(Exception):
    """A shard file is damaged: cut short, a checksum that does not match, not of its format.
    Lasting: reading it again gives the same."""


def records(path: str, compression: str = "", temp_dir: str | None = None) -> Iterator[bytes]:
    """The records of one shard file, of the format its name says, in order.

    Args:
      path: local or remote (gs://...).
      compression: "GZIP" or "" (TFRecord files; ArrayRecord files say their own).
      temp_dir: where a remote ArrayRecord file is copied to be read (default: the system's
        temporary folder); a copy left by a killed process goes with that folder.

    Raises:
      CorruptShardError: after the records before the damage.
      FileNotFoundError: the file is not there.
      OSError, or Beam's own errors: the storage failed (perhaps for a moment).
    """
    if naming.file_format_of(path) == naming.ARRAY_RECORD:
        return _array_records(path, temp_dir)
    return _tfrecords(path, compression)


def _tfrecords(path: str, compression: str) -> Iterator[bytes]:
    with _open(path, compression) as f:
        offset = 0
        while True:
            header = _read(f, _HEADER, path)
            if not header:
                return
            if len(header) < _HEADER:
                raise CorruptShardError(f"{path}: truncated record at offset {offset}")
            length, length_crc = struct.unpack("<QI", header)
            if masked_crc32c(header[:8]) != length_crc:
                raise CorruptShardError(f"{path}: corrupted record at offset {offset}")
            body = _read(f, length + _FOOTER, path)
            if len(body) < length + _FOOTER:
                raise CorruptShardError(f"{path}: truncated record at offset {offset}")
            data = body[:length]
            if masked_crc32c(data) != struct.unpack("<I", body[length:])[0]:
                raise CorruptShardError(f"{path}: corrupted record at offset {offset}")
            yield data
            offset += _HEADER + length + _FOOTER


@contextlib.contextmanager
def _open(path: str, compression: str):
    """The file's bytes, decompressed. Python's gzip, not Beam's: Beam's (and TensorFlow's)
    take a stream cut short for its end."""
    if compression not in ("", "GZIP"):
        raise ValueError(f"compression must be '' or 'GZIP', got {compression!r}")
    with contextlib.ExitStack() as stack:
        if not paths.is_remote(path):
            raw = stack.enter_context(_open_local(path))
        elif not storage.exists(path):
            raise FileNotFoundError(f"{path} not found")
        else:
            raw = stack.enter_context(storage.open_to_read(path))
        yield stack.enter_context(gzip.GzipFile(fileobj=raw, mode="rb")) if compression else raw


def _open_local(path: str):
    """A local file opened for reading, if it is a regular file (a FIFO would block for
    ever); with plain `open`: Beam's wrapper costs more per call."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise CorruptShardError(f"{path}: not a regular file")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb", buffering=1 << 20)


def _read(f, size: int, path: str) -> bytes:
    """`size` bytes, fewer only at the file's end (a gzip stream cut short is damage). Read
    READ_CHUNK at a time: a damaged length saying a terabyte must end at the file's end, not
    in an allocation of a terabyte."""
    try:
        data = f.read(min(size, READ_CHUNK))
        while data and len(data) < size:
            more = f.read(min(size - len(data), READ_CHUNK))
            if not more:
                break
            data += more
    except (zlib.error, EOFError, gzip.BadGzipFile) as err:
        raise CorruptShardError(f"{path}: not a whole gzip stream ({err})") from err
    return data


def _array_records(path: str, temp_dir: str | None) -> Iterator[bytes]:
    with _local_copy(path, temp_dir) as local:
        try:
            yield from array_records.records(local)
        except (OSError, RuntimeError) as err:  # RuntimeError: the package's, for damaged chunks
            raise CorruptShardError(f"{path}: {messages.one_line(err)}") from err


@contextlib.contextmanager
def _local_copy(path: str, temp_dir: str | None):
    """`path` on local disk: itself, or a temporary copy of a remote file (the array-record
    package reads local files only)."""
    if not paths.is_remote(path):
        if not os.path.exists(path):
            raise FileNotFoundError(f"{path} not found")
        if not os.path.isfile(path):
            raise CorruptShardError(f"{path}: not a regular file")
        yield path
        return
    if not storage.exists(path):
        raise FileNotFoundError(f"{path} not found")
    handle, local = tempfile.mkstemp(suffix="." + naming.ARRAY_RECORD, dir=temp_dir)
    try:
        with os.fdopen(handle, "wb") as out, storage.open_to_read(path) as remote:
            while chunk := remote.read(COPY_CHUNK):
                out.write(chunk)
        yield local
    finally:
        os.remove(local)
