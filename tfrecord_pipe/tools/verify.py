"""Proof that a conversion lost and changed nothing: every source is in exactly one record or
in rejected/, and every record is what the converter would write for its source.

Used by `tfrecord-pipe verify SRC OUT`. For each listed source it re-derives the expected
outcome (its label, the bytes `images.normalise` stores, or a rejection); for each record it
checks that it parses, that its image decodes to the stated shape, and that shards hold the
counts the manifest gives. The two sides are joined on the source's relative path.

It streams: rows are spilled to bucket files on local disk by a hash of the path and each
bucket is joined on its own, so memory stays flat however large the dataset.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import math
import os
import tempfile
from collections.abc import Iterator
from concurrent import futures

import tensorflow as tf

from beam_jobs import convert, sources
from tfrecord_pipe.core import images, naming, paths, schema
from tfrecord_pipe.reading import dataset as dataset_lib

ROWS_PER_BUCKET = 20_000  # rows joined in memory at once
MAX_PROBLEMS_KEPT = 1000  # problems listed in full; beyond that only counted
_WORKERS = 8  # threads reading and decoding (I/O and decoders release the GIL)
_CHUNK = 256  # items handed to the threads at a time, so memory stays flat


@dataclasses.dataclass(frozen=True)
class VerifyReport:
    """Attributes: sources listed; records read; rejected lines read; problems (the first
    MAX_PROBLEMS_KEPT); num_problems in all."""

    sources: int
    records: int
    rejected: int
    problems: tuple[str, ...]
    num_problems: int

    @property
    def ok(self) -> bool:
        return self.num_problems == 0

    def __str__(self):
        head = (
            f"{self.sources} sources listed; {self.records} records in the shards; "
            f"{self.rejected} rejected"
        )
        if self.ok:
            return head + ": every source accounted for, every record checked. OK"
        lines = [head + f": {self.num_problems} problems"]
        lines += [f"  {problem}" for problem in self.problems]
        if self.num_problems > len(self.problems):
            lines.append(f"  ... and {self.num_problems - len(self.problems)} more")
        return "\n".join(lines)


class _Problems:
    def __init__(self):
        self.kept, self.count = [], 0

    def add(self, text: str) -> None:
        self.count += 1
        if len(self.kept) < MAX_PROBLEMS_KEPT:
            self.kept.append(text)


class _Buckets:
    """Rows spilled to JSON-lines files by a hash of their key; read back one bucket at a time."""

    def __init__(self, folder: str, count: int):
        self._paths = [os.path.join(folder, f"bucket-{i:05d}.jsonl") for i in range(count)]
        self._files = [open(path, "w") for path in self._paths]

    def add(self, key: str, kind: str, row: dict) -> None:
        index = int(hashlib.md5(key.encode()).hexdigest()[:8], 16) % len(self._files)
        self._files[index].write(json.dumps([key, kind, row]) + "\n")

    def groups(self) -> Iterator[tuple[str, dict[str, list[dict]]]]:
        for handle in self._files:
            handle.close()
        for path in self._paths:
            rows: dict[str, dict[str, list]] = collections.defaultdict(
                lambda: {"source": [], "record": [], "rejected": []}
            )
            with open(path) as lines:
                for line in lines:
                    key, kind, row = json.loads(line)
                    rows[key][kind].append(row)
            yield from rows.items()
            os.remove(path)


def verify(source: str, dataset: str) -> VerifyReport:
    """Checks dataset `dataset` against the inputs at `source` (as given to the converter).

    Raises:
      FileNotFoundError: `dataset` is not a finished dataset, or `source` lists nothing.
      ValueError: the manifest does not record how the dataset was converted.
    """
    found = dataset_lib.read_manifest(dataset)
    if not found.conversion:
        raise ValueError(
            f"The manifest of {dataset} does not record how it was converted, so verify cannot "
            "redo the conversion. Convert the images again with this version to verify them."
        )
    problems = _Problems()
    listed = sum(info.listed for info in found.splits.values())
    with tempfile.TemporaryDirectory(prefix="tfrecord-pipe-verify-") as work:
        buckets = _Buckets(work, max(1, math.ceil(3 * listed / ROWS_PER_BUCKET)))
        num_records = _add_records(dataset, found, buckets, problems)
        num_rejected = _add_rejected(dataset, buckets)
        per_split = _add_sources(source, dataset, found, buckets)
        for split, info in sorted(found.splits.items()):
            if per_split.get(split, 0) != info.listed:
                problems.add(
                    f"split {split}: the manifest lists {info.listed} inputs, {source} now has "
                    f"{per_split.get(split, 0)}"
                )
        for relpath, rows in buckets.groups():
            _check(relpath, rows, problems)
    return VerifyReport(
        sources=sum(per_split.values()),
        records=num_records,
        rejected=num_rejected,
        problems=tuple(problems.kept),
        num_problems=problems.count,
    )


def _add_records(dataset, found, buckets, problems) -> int:
    """Reads every shard: counts against the manifest, each record parsed and decoded."""
    total = 0
    with futures.ThreadPoolExecutor(_WORKERS) as pool:
        for split, info in sorted(found.splits.items()):
            for name, expected in zip(info.files, info.shard_lengths):
                path = paths.join(dataset, name)
                if not tf.io.gfile.exists(path):
                    problems.add(f"shard {name} is missing (the manifest lists {expected} records)")
                    continue
                count = 0
                try:
                    for chunk in _chunks(_serialized(path, found.compression)):
                        for row in pool.map(lambda r: _record_row(r, found), chunk):
                            count += 1
                            if "problem" in row:
                                problems.add(f"{name} record {count}: {row['problem']}")
                                continue
                            buckets.add(row.pop("relpath"), "record", dict(row, shard=name))
                except tf.errors.OpError as err:
                    problems.add(f"shard {name} is corrupt after {count} records: {err.message}")
                if count != expected:
                    problems.add(f"shard {name} holds {count} records, the manifest lists {expected}")
                total += count
    return total


def _serialized(path: str, compression: str) -> Iterator[bytes]:
    for record in tf.data.TFRecordDataset(path, compression_type=compression):
        yield record.numpy()


def _chunks(items, size: int = _CHUNK):
    chunk = []
    for item in items:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _record_row(serialized: bytes, found) -> dict:
    try:
        record = schema.decode_example(serialized, label_offset=found.label_offset)
    except ValueError as err:
        return {"problem": f"does not parse: {err}"}
    try:
        shape = tuple(tf.io.decode_jpeg(record.encoded, channels=3).shape)
    except tf.errors.OpError as err:
        return {"problem": f"{record.filename}: image does not decode: {err.message}"}
    problems = []
    if shape != (record.height, record.width, 3):
        problems.append(f"decodes to {shape}, the record says {record.height}x{record.width}x3")
    if not 0 <= record.label_index < len(found.labels) or (
        found.labels[record.label_index] != record.label_text
    ):
        problems.append(f"label {record.label_index} ({record.label_text!r}) does not match labels.txt")
    return {
        "relpath": record.filename,
        "sha256": record.sha256,
        "encoded_sha256": hashlib.sha256(record.encoded).hexdigest(),
        "label": record.label_text,
        "record_problems": problems,
    }


def _add_rejected(dataset, buckets) -> int:
    count = 0
    pattern = paths.join(dataset, naming.rejected_name("*"))
    for path in sorted(tf.io.gfile.glob(pattern)):
        with tf.io.gfile.GFile(path) as lines:
            for line in lines:
                if line.strip():
                    row = json.loads(line)
                    buckets.add(row.get("relpath") or row["path"], "rejected", row)
                    count += 1
    return count


def _add_sources(source, dataset, found, buckets) -> dict[str, int]:
    """Lists the inputs as the converter did and records what each should have become."""
    recorded = convert.recorded_config(found.conversion)
    config = sources.resolve_layout(dataclasses.replace(recorded, source=source, output=dataset))
    labels = set(found.labels)
    per_split = collections.Counter()
    with futures.ThreadPoolExecutor(_WORKERS) as pool:
        for chunk in _chunks(_listed(config)):
            for listed, row in pool.map(lambda s: (s, _expected(s, labels, config.policy)), chunk):
                per_split[listed.split] += 1
                buckets.add(listed.relpath, "source", row)
    return dict(per_split)


def _listed(config) -> Iterator:
    if config.layout == "csv":
        with tf.io.gfile.GFile(config.source) as lines:
            for line in lines:
                listed = sources.source_from_csv_line(
                    line.rstrip("\n"), config.source, config.validation_fraction
                )
                if listed is not None:
                    yield listed
        return
    root = config.source_root
    for folder, _, names in tf.io.gfile.walk(root):
        for name in sorted(names):
            yield sources.source_from_folder(
                paths.join(folder, name), root, config.layout, config.validation_fraction
            )


def _expected(listed, labels, policy) -> dict:
    """What the converter should have made of one source: a record's hashes, or a rejection."""
    row = {"path": listed.path, "split": listed.split, "label": listed.label}
    if listed.label is None or listed.label not in labels:
        return dict(row, rejected=images.NO_LABEL if listed.label is None else images.UNKNOWN_LABEL)
    try:
        with tf.io.gfile.GFile(listed.path, "rb") as f:
            data = f.read()
    except tf.errors.OpError as err:
        return dict(row, rejected=f"unreadable: {err.message}")
    row["sha256"] = hashlib.sha256(data).hexdigest()
    try:
        stored = images.normalise(data, policy)
    except images.Rejected as err:
        return dict(row, rejected=err.reason)
    row["encoded_sha256"] = hashlib.sha256(stored.encoded).hexdigest()
    return row


def _check(relpath: str, rows: dict[str, list[dict]], problems: _Problems) -> None:
    """The rules for one relative path: its sources, records and rejection lines agree."""
    listed, records, rejected = rows["source"], rows["record"], rows["rejected"]
    if not listed:
        where = [f"shard {r['shard']}" for r in records] + ["rejected/"] * len(rejected)
        problems.add(f"{relpath}: in {', '.join(where)} but not among the sources")
        return
    if len(records) > 1:
        shards = ", ".join(record["shard"] for record in records)
        problems.add(f"{relpath}: written {len(records)} times (shards {shards})")
    if len(records) + len(rejected) < len(listed):
        problems.add(f"{relpath}: listed but in no shard and not in rejected/ (lost)")
        return
    if len(records) + len(rejected) > len(listed):
        problems.add(
            f"{relpath}: listed {len(listed)} times but has {len(records)} records and "
            f"{len(rejected)} rejection lines"
        )
    if not records:
        return
    record = records[0]
    expected = next((s for s in listed if "encoded_sha256" in s), None)
    for problem in record["record_problems"]:
        problems.add(f"{relpath} (shard {record['shard']}): {problem}")
    if expected is None:
        reasons = ", ".join(sorted({s.get("rejected", "?") for s in listed}))
        problems.add(f"{relpath}: has a record, but the source should be rejected ({reasons})")
        return
    if record["sha256"] != expected["sha256"]:
        problems.add(f"{relpath}: the source changed since conversion (content hash differs)")
    elif record["encoded_sha256"] != expected["encoded_sha256"]:
        problems.add(
            f"{relpath} (shard {record['shard']}): the record's image is not what the converter "
            "writes for this source (modified record)"
        )
    if record["label"] != expected["label"]:
        problems.add(
            f"{relpath} (shard {record['shard']}): label {record['label']!r}, the source says "
            f"{expected['label']!r}"
        )
