"""Files through Beam's filesystems, which reach every place the job reads and writes (local
disk, gs://, ...) without TensorFlow: the few operations the job needs, each written once."""

from __future__ import annotations

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from tfrecord_pipe.core import paths


def exists(pattern: str) -> bool:
    """Whether anything matches `pattern` (a path or a glob)."""
    try:
        return bool(FileSystems.match([pattern], limits=[1])[0].metadata_list)
    except Exception:  # a pattern that matches nothing raises on some filesystems
        return False


def matching(pattern: str) -> list[str]:
    """The paths that match `pattern`; none when nothing does. A failed listing raises."""
    return [meta.path for meta in FileSystems.match([pattern])[0].metadata_list]


def delete_matching(pattern: str) -> None:
    paths_found = matching(pattern)
    if paths_found:
        FileSystems.delete(paths_found)


def read_bytes(path: str) -> bytes:
    """A file's bytes, as stored (never decompressed because of its name).

    Local files are read with open(): Beam's FileSystems costs more per file, and the job
    reads every input twice (benchmarks/RESULTS.md, "Reading inputs").
    """
    if not paths.is_remote(path):
        with open(path, "rb") as f:
            return f.read()
    with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as f:
        return f.read()


def write_bytes(path: str, data: bytes, mime_type: str = "application/octet-stream") -> None:
    with FileSystems.create(path, mime_type=mime_type) as f:
        f.write(data)
