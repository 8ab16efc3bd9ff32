"""Sources checked beside their records, for `verify` on this machine.

Joined on hashes alone, the two sides of `verify` each hash the same image: the source's
bytes (the record holds their SHA-256) and the record's copy of them (to prove it is that
copy). A worker that reads a shard of a dataset converted from a local folder can instead
read each record's source where the record's name says it lies, check it as the converter
does (`outcome.decide`), and compare the record's image with the image the converter stores
for it, byte for byte: equal bytes have the source's hash, taken once.

A record's name is only a guess at its source. The launcher uses what was found here only
for a source the listing lists with the same path, label and split (`verify._Join`); any
other listed source is checked on its own afterwards, as the conversion would check it. So a
renamed, moved or edited file, a tampered record or a source listed with a problem is judged
exactly as before, only later.
"""

from __future__ import annotations

import functools
import os
import stat
from collections.abc import Iterator

from beam_jobs import outcome, sources, storage
from beam_jobs.config import ConvertConfig
from beam_jobs.source_file import SourceFile
from tfrecord_pipe._core import manifest
from tfrecord_pipe._tools import verify_rules as rules
from tfrecord_pipe._tools.verify_rules import RECORD

# Rows of sources checked beside their records, as the join takes them: (relpath, source's
# row) alone, or (relpath, (record's row, source's row)) as one item where they pair up.
FOUND, PAIR = "found", "pair"
_SAME_ON_BOTH_SIDES = ("sha256", "encoded_sha256", "label", "label_index", "split")


# Records of at least this many bytes on average are checked beside their sources: below,
# the hash saved costs less than the pairing (benchmarks/RESULTS.md, "verify: sources
# checked beside their records").
FROM_RECORD_BYTES = 16 << 10


def chosen(config: ConvertConfig, found: manifest.Manifest) -> bool:
    """Whether `verify` checks sources beside their records: where records name their
    sources' paths (a local folder, not a CSV list), and are large enough for it to pay."""
    records = sum(info.num_examples for info in found.splits.values()) * len(found.file_formats)
    size = sum(info.num_bytes for info in found.splits.values()) / max(1, records)
    return possible(config) and size >= FROM_RECORD_BYTES


def possible(config: ConvertConfig) -> bool:
    """Whether records name their sources' paths: a local folder, not a CSV list."""
    return sources.source_finder(config) is not None


class Beside:
    """One worker's checks of the sources its shards' records name (`verify_reading.read_shard`
    calls `ahead` and `same_image`); `with_found` puts their rows among the shard's."""

    def __init__(self, config: ConvertConfig, expect: rules.Expect):
        self._config = config
        self._find = sources.source_finder(config)
        self._expect = expect
        self._labels = expect.labels
        self._named: dict[str, SourceFile | None] = {}  # the window's, from `ahead`
        self._opened = storage.ReadAhead(())  # the window's sources, opened by `ahead`
        self._found: list[tuple[str, dict]] = []
        self._failed: BaseException | None = None  # ours, not the shard's: raised by `with_found`

    def ahead(self, relpaths: list[str]) -> None:
        """The sources of the next records, asked into the kernel's cache at once."""
        try:
            self._opened.close()  # the last window's, never read
            self._named = {relpath: self._regular(relpath) for relpath in relpaths}
            named = (source.path for source in self._named.values() if source)
            self._opened = storage.ReadAhead(named)
        except Exception as err:  # noqa: BLE001 - a bug of ours, never the shard's damage
            self._failed = self._failed or err

    def _regular(self, relpath: str) -> SourceFile | None:
        """The source at `relpath` if it is a regular file: the walk opens nothing else (a
        FIFO, a device reached through a link), and neither does this."""
        source = self._find(relpath)
        try:
            return source if source and stat.S_ISREG(os.stat(source.path).st_mode) else None
        except OSError:  # gone, unreadable: the listing says what
            return None

    def same_image(self, relpath: str, image: bytes) -> bytes | None:
        """The SHA-256 of `image` when it is, byte for byte, the image the converter stores
        for the source at `relpath`; else None. The source's row is kept either way."""
        try:
            source = self._named[relpath] if relpath in self._named else self._regular(relpath)
            if source is None:
                return None
            policy = self._config.policy
            read = functools.partial(self._opened.read, source.path, policy.max_file_bytes)
            result = outcome.decide(source, self._labels, policy, read)
            row, stored, image_sha256 = self._expect.row_and_image(source, result)
        except Exception as err:  # noqa: BLE001 - as in `ahead`
            self._failed = self._failed or err
            return None
        self._found.append((relpath, row))
        return image_sha256 if stored is not None and stored == image else None

    def with_found(self, rows: Iterator[tuple[str, object]]) -> Iterator[tuple[str, object]]:
        """A shard's rows (`verify_reading.read_shard`), with the rows of the sources found
        beside its records: a record's and its source's as one PAIR item.

        Raises what failed in `ahead` or `same_image`: an error of verify's own fails it
        (nothing proven), where inside the shard's read it would be taken for damage."""
        try:
            yield from self._rows_with_found(rows)
        finally:
            self._opened.close()

    def _rows_with_found(self, rows):
        for kind, value in rows:
            if self._failed is not None:
                raise self._failed
            found, self._found = self._found, []  # the sources of this row's record
            if kind == RECORD and len(found) == 1 and found[0][0] == value[0]:
                record, source = value[1], found[0][1]
                for key in _SAME_ON_BOTH_SIDES:  # held and pickled once where equal
                    if (same := source.get(key)) == record[key]:
                        record[key] = same
                yield PAIR, (value[0], (record, source))
                continue
            yield kind, value
            yield from ((FOUND, item) for item in found)
        if self._failed is not None:
            raise self._failed


def same_source(listed: tuple, row: dict) -> bool:
    """Whether a source's row found beside a record is that of the source the listing gave
    as `listed` (path, label, split, problem): a source found there has no problem."""
    path, label, split, problem = listed
    return problem is None and (path, label, split) == (row["path"], row["label"], row["split"])
