"""ArrayRecord files, local ones: written by the conversion job, read by Grain, TFDS's data
sources, `verify` and `inspect`.

The array-record package reports a file it cannot open or write through `ok()`, not an error:
a missing file reads as 0 records, a truncated one as none, a path it cannot write (gs://)
takes every record and writes nothing. Every use here checks, so that such a file is an error
that names it, never a silent empty shard.

Records are one to a chunk ("group_size:1"), as TFDS writes them: reading one record then
decodes only that record, which random access (a global shuffle) needs. JPEG bytes do not
compress, so chunks are stored uncompressed unless compression is asked for.
"""

from __future__ import annotations

from collections.abc import Iterator

from tfrecord_pipe._core import extras, naming

UNCOMPRESSED = "group_size:1,uncompressed"
COMPRESSED = "group_size:1,zstd:3"
_BATCH = 256  # records read at once when reading a file through
# (The beam extra has array-record too, for the conversion job.)
_MISSING = f"ArrayRecord files need the array-record package: {extras.how_to_install('grain')}."


def require(formats) -> None:
    """Raises ValueError, saying what to install, where `formats` (naming.FILE_FORMATS) hold
    ArrayRecord and the array-record package is missing: a job that writes or reads such
    shards on this machine is refused before it starts. Found at its first shard, it failed
    saying to run it again, verify took every shard for lost, inspect gave a traceback."""
    if naming.ARRAY_RECORD not in formats:
        return
    try:
        _module()  # (its library too: an empty package beside a broken one is not enough)
    except ImportError:
        raise ValueError(_MISSING) from None


def _module():
    try:
        from array_record.python import array_record_module
    except ImportError as err:
        raise ImportError(_MISSING) from err
    return array_record_module


class Writer:
    """Writes records to a new local ArrayRecord file. Use as a context manager."""

    def __init__(self, path: str, compress: bool = False):
        self._path = path
        self._writer = _module().ArrayRecordWriter(path, COMPRESSED if compress else UNCOMPRESSED)
        self._check("open")

    def _check(self, doing: str) -> None:
        if not self._writer.ok():
            raise OSError(f"Cannot {doing} the ArrayRecord file {self._path} (a local path?)")

    def write(self, data: bytes) -> None:
        self._writer.write(data)

    def close(self) -> None:
        self._check("write")
        self._writer.close()

    def __enter__(self) -> Writer:
        return self

    def __exit__(self, *_) -> None:
        if self._writer.is_open():
            self._writer.close()


def reader(path: str, options: str = ""):
    """An open `ArrayRecordReader` of the local file `path`.

    Raises:
      OSError: the file is missing, or not a whole ArrayRecord file; the message names it.
    """
    try:
        opened = _module().ArrayRecordReader(path, options)
    except RuntimeError as err:  # raised for some damage (a file under 64 KiB)
        raise OSError(f"{path} is not a readable ArrayRecord file: {err}") from err
    if not opened.ok():
        raise OSError(f"{path} is missing, or not a whole ArrayRecord file")
    return opened


def count(path: str) -> int:
    """The records in the local ArrayRecord file `path`."""
    opened = reader(path)
    try:
        return opened.num_records()
    finally:
        opened.close()


def records(path: str) -> Iterator[bytes]:
    """The records of the local ArrayRecord file `path`, in order, a batch at a time."""
    opened = reader(path)
    try:
        total = opened.num_records()
        for start in range(0, total, _BATCH):
            yield from opened.read(list(range(start, min(start + _BATCH, total))))
    finally:
        opened.close()
