"""One shard written: its records, read again from their sources, into one file per format.
Plain Python (no Beam), for the Beam job's `write_shards.WriteShard` and the local engine's
workers."""

from __future__ import annotations

import contextlib
import functools
import itertools
from concurrent import futures

from beam_jobs import load, record_writer, storage, summary
from beam_jobs.config import ConvertConfig
from tfrecord_pipe._core import manifest, naming, paths

READ_AHEAD = 64  # records read ahead of the writer, bounding memory to ~64 images


def write_shard(
    entries, split: str, index: int, shards: int, temp_dir: str, config: ConvertConfig,
    pool: futures.Executor,
) -> list[summary.ShardWritten]:
    """Writes shard `index` of `shards` of `split` into `temp_dir`: the records of `entries`
    (Checked, in key order), read again from their sources; one file per format, each holding
    the same records in the same order. Remote sources are read on `pool`, READ_AHEAD ahead.
    Each file's row carries the shard's `manifest.ShardPositions` digest.
    """
    names = [
        naming.shard_name(split, index, shards, config.compress, file_format)
        for file_format in config.formats
    ]
    files = [paths.join(temp_dir, name) for name in names]
    read = functools.partial(load.read_record, policy=config.policy,
                             label_offset=config.label_offset)  # fmt: skip
    count, positions = 0, manifest.ShardPositions()

    def noted(entries):
        for checked in entries:
            positions.add(checked.relpath, checked.label_index, checked.label_text)
            yield checked

    # Each record is read and made once, and goes to every format's file.
    with contextlib.ExitStack() as stack:
        writers = [
            stack.enter_context(record_writer.open_shard(path, config.compress)) for path in files
        ]
        entries = iter(entries)
        first = next(entries, None)
        entries = noted(itertools.chain([first] if first is not None else [], entries))
        if first is not None and paths.is_remote(first.path):
            records = (future.result() for future in load.in_order(pool, read, entries, READ_AHEAD))
        else:
            records = _read_here(entries, read)
        # Closed here, not when collected: a write that fails frees the files read ahead.
        records = stack.enter_context(contextlib.closing(records))
        for serialized in records:
            for writer in writers:
                writer.write(serialized)
            count += 1
    return [
        summary.ShardWritten(split, index, shards, count, storage.size(path), name, file_format,
                             positions.hexdigest())  # fmt: skip
        for file_format, name, path in zip(config.formats, names, files)
    ]


def _read_here(entries, read):
    """read(entry) of each of `entries` (local files), the files of each READ_AHEAD of them
    asked into the kernel's cache before the first is read (`storage.ReadAhead`)."""
    entries = iter(entries)
    while window := list(itertools.islice(entries, READ_AHEAD)):
        with storage.ReadAhead(checked.path for checked in window) as ahead:
            for checked in window:
                yield read(checked, read=ahead.read)
