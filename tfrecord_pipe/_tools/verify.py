"""Proof that a conversion lost and changed nothing: every source is in exactly one record or
in rejected/, and every record is what the converter would write for its source.

Used by `tfrecord-pipe verify SRC OUT`. It lists the sources as the converter does (the same
functions, with the configuration the manifest recorded) and re-derives each one's outcome:
its split and label and the bytes `images.normalise` stores, or the reason it is rejected.
Each record must parse, decode to its stated shape and match its source's outcome, in the
right split's shard; each rejection line must give the reason the converter would give now;
shards must hold the counts the manifest gives. The two sides are joined on the source's
relative path, then the sources with the same bytes on their content hash.

The rules live here once, and two drivers run them. `verify` (below) runs on this machine and
streams: rows are spilled to bucket files on local disk by a hash of their key and each bucket
is joined on its own, so memory stays flat however large the dataset. `verify_job` runs the
same rules as a Beam pipeline (`--runner DataflowRunner`), its joins as GroupByKeys.
"""

from __future__ import annotations

import collections
import dataclasses
import fnmatch
import hashlib
import itertools
import json
import logging
import math
import os
import posixpath
import tempfile
import time
from collections.abc import Iterable, Iterator
from concurrent import futures

import tensorflow as tf

from beam_jobs import flags, outcome, sources
from tfrecord_pipe._core import images, manifest, messages, naming, paths, schema, tfds_metadata
from tfrecord_pipe._core import rejection as rejection_lib
from tfrecord_pipe._reading import dataset as dataset_lib
from tfrecord_pipe._reading import records

log = logging.getLogger(__name__)

ROWS_PER_BUCKET = 20_000  # rows joined in memory at once
READ_ATTEMPTS = 4  # reads of a shard that fail for a passing reason, before giving up
RETRY_WAIT_S = 0.5  # doubled after each failed attempt
# Errors that say something about the data, not about the storage at this moment.
_LASTING = (tf.errors.DataLossError, tf.errors.NotFoundError, tf.errors.InvalidArgumentError,
            tf.errors.OutOfRangeError, tf.errors.PermissionDeniedError)  # fmt: skip
MAX_PROBLEMS_KEPT = 1000  # problems listed in full; beyond that only counted
THREADS = 8  # threads reading and decoding (I/O and decoders release the GIL)
_CHUNK = 256  # items handed to the threads at a time, so memory stays flat

# What the readers of shards, rejection files and sources yield: (kind, value) with kind one
# of these. A row goes into the join under its relative path; a problem is reported; a count
# adds to the report's totals.
SOURCE, RECORD, REJECTED, PROBLEM, COUNT = "source", "record", "rejected", "problem", "count"
REPORTED = "reported"  # a group of duplicates.jsonl, joined on its content hash
# Problems are listed in this order: those of the dataset's files (shards, rejection files,
# the manifest's counts), then those of single inputs; alphabetically within each. The first
# MAX_PROBLEMS_KEPT are kept, the same ones by both drivers.
FILES, INPUTS = 0, 1


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


# The rules, for both drivers.


def read_conversion(dataset: str) -> manifest.Manifest:
    """The dataset's manifest, which must record how the dataset was converted.

    Raises:
      FileNotFoundError: `dataset` is not a finished dataset.
      ValueError: the manifest does not record how the dataset was converted.
    """
    found = dataset_lib.read_manifest(dataset)
    if not found.conversion:
        raise ValueError(
            f"The manifest of {dataset} does not record how it was converted, so verify cannot "
            "redo the conversion. Convert the images again with this version to verify them."
        )
    return found


def source_config(source: str, dataset: str, found: manifest.Manifest):
    """The conversion's configuration as the manifest recorded it, for these paths."""
    recorded = flags.recorded_config(found.conversion)
    return sources.resolve_layout(dataclasses.replace(recorded, source=source, output=dataset))


def check_descriptions(dataset: str, found: manifest.Manifest) -> list[str]:
    """labels.txt and TFDS's metadata must say what the manifest says (they are made from it)."""
    problems = []
    older = not found.knows_duplicates  # written before TFDS metadata too
    for name, text in manifest.files_of(found):
        if name == naming.MANIFEST_NAME or (older and name in tfds_metadata.FILES):
            continue
        path = paths.join(dataset, name)
        try:
            if not tf.io.gfile.exists(path):
                problems.append(f"{name}: missing (it is written with the manifest)")
            elif tf.io.gfile.GFile(path, "rb").read() != text.encode("utf-8"):
                problems.append(
                    f"{name}: does not say what manifest.json says (changed after writing?)"
                )
        except tf.errors.OpError as err:
            problems.append(f"{name}: cannot be read: {err.message}")
    return problems


def check_rejection_files(dataset: str, found: manifest.Manifest) -> list[str]:
    """rejected/ holds no rejections file of a split the manifest does not have (it would go
    unread). Other files there are the user's."""
    expected = {naming.rejected_name(split) for split in found.splits}
    folder = paths.join(dataset, naming.REJECTED_DIR)
    try:
        names = tf.io.gfile.listdir(folder) if tf.io.gfile.isdir(folder) else []
    except tf.errors.OpError as err:
        return [f"{naming.REJECTED_DIR}/ cannot be listed: {err.message}"]
    found_names = {
        f"{naming.REJECTED_DIR}/{name}"
        for name in names
        if fnmatch.fnmatchcase(name, posixpath.basename(naming.rejected_name("*")))
    }
    return [
        f"{name}: not a split of the manifest ({', '.join(sorted(found.splits))})"
        for name in sorted(found_names - expected)
    ]


def shards_of(found: manifest.Manifest) -> list[tuple[str, str, int, str | None]]:
    """(split, file name, records the manifest lists, the same shard in the other format or
    None) for every shard, of the format read first (TFRecord, if the dataset has it);
    `read_shard` checks the twin against it."""
    first, *other = found.file_formats
    rows = []
    for split, info in sorted(found.splits.items()):
        names = info.files_of(first)
        twins = info.files_of(other[0]) if other else [None] * len(names)
        rows += [(split, *shard) for shard in zip(names, info.shard_lengths, twins)]
    return rows


def _add_record(digest, serialized: bytes) -> None:
    """Adds a record to a digest of a sequence of records (its length first: no two sequences
    share one)."""
    digest.update(len(serialized).to_bytes(8, "little"))
    digest.update(serialized)


def read_shard(dataset: str, found: manifest.Manifest, shard: tuple[str, str, int, str | None],
               pool: futures.Executor) -> Iterator[tuple[str, object]]:  # fmt: skip
    """One shard read whole: its records as RECORD rows, each parsed and decoded (on `pool`);
    its count against the manifest's; its twin in the other format (if any) against it,
    record for record; then its COUNT of records."""
    split, name, expected, twin = shard
    path = paths.join(dataset, name)
    if not tf.io.gfile.exists(path):
        yield PROBLEM, f"shard {name} is missing (the manifest lists {expected} records)"
        return
    count, failed, digest = 0, None, hashlib.sha256()
    for chunk, failed in _chunks_until_error(_serialized(path, found.compression)):
        for serialized in chunk:
            _add_record(digest, serialized)
        for row in pool.map(lambda r: _record_row(r, found), chunk):
            count += 1
            if "problem" in row:
                yield PROBLEM, f"{name} record {count}: {row['problem']}"
                continue
            row.update(shard=name, split=split)
            yield RECORD, (row.pop("relpath"), row)
    if failed is not None:
        yield PROBLEM, f"shard {name} is corrupt after {count} records: {failed.message}"
    if count != expected:
        yield PROBLEM, f"shard {name} holds {count} records, the manifest lists {expected}"
    if twin is not None and failed is None:
        problem = _twin_problem(paths.join(dataset, twin), found, digest.hexdigest(), name)
        if problem:
            yield PROBLEM, problem
    yield COUNT, count


def _twin_problem(path: str, found: manifest.Manifest, expected: str, name: str) -> str | None:
    """Why the shard file `path` does not hold exactly the records of shard `name` (whose
    records' digest is `expected`), or None."""
    twin = paths.basename(path)
    if not tf.io.gfile.exists(path):
        return f"shard {twin} is missing (the same records as {name})"
    digest, count = hashlib.sha256(), 0
    try:
        for serialized in _serialized(path, found.compression):
            _add_record(digest, serialized)
            count += 1
    except tf.errors.OpError as err:
        return f"shard {twin} is corrupt after {count} records: {err.message}"
    if digest.hexdigest() != expected:
        return f"shard {twin} does not hold the records of {name} ({count} records read)"
    return None


def _serialized(path: str, compression: str) -> Iterator[bytes]:
    """The records of a shard, of the format its name says. A read that fails for a passing
    reason (an error status TensorFlow's own retries did not get past) resumes after the last
    record, a few times: our retry, on top of the client library's."""
    file_format = naming.file_format_of(path)
    done = failures = 0
    while True:
        try:
            if file_format == naming.ARRAY_RECORD:
                read = itertools.islice(records.array_record_records(path), done, None)
            else:
                read = (r.numpy() for r in records.shard_records(path, compression).skip(done))
            for record in read:
                yield record
                done += 1
            return
        except tf.errors.OpError as err:
            failures += 1
            if isinstance(err, _LASTING) or failures >= READ_ATTEMPTS:
                raise
            log.warning("Reading %s failed (%s); again from record %d", path, err.message, done)
            time.sleep(RETRY_WAIT_S * 2**failures)


def _chunks(items, size: int = _CHUNK):
    chunk = []
    for item in items:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _chunks_until_error(records: Iterator[bytes], size: int = _CHUNK):
    """(chunk, None) pairs, then the records read before a read error with that error: what a
    damaged shard holds up to the damage is still checked."""
    while True:
        chunk = []
        try:
            for record in records:
                chunk.append(record)
                if len(chunk) == size:
                    break
        except tf.errors.OpError as err:
            yield chunk, err
            return
        if chunk:
            yield chunk, None
        if len(chunk) < size:
            return


def _record_row(serialized: bytes, found) -> dict:
    try:
        record = schema.decode_example(serialized, label_offset=found.label_offset)
    except ValueError as err:
        return {"problem": f"does not parse: {err}"}
    problems = []
    image = records.image_problem(record)
    if image is not None and image.startswith(records.DOES_NOT_DECODE):
        return {"problem": f"{record.filename}: {image}"}
    if image is not None:
        problems.append(image)
    if not 0 <= record.label_index < len(found.labels) or (
        found.labels[record.label_index] != record.label_text
    ):
        problems.append(
            f"label {record.label_index} ({record.label_text!r}) does not match labels.txt"
        )
    return {
        "relpath": record.filename,
        "sha256": record.sha256,
        "encoded_sha256": hashlib.sha256(record.encoded).hexdigest(),
        "label": record.label_text,
        "record_problems": problems,
    }


def rejection_files(found: manifest.Manifest) -> list[tuple[str, int]]:
    """(split, lines the manifest counts) for every split: a file the manifest counts none in
    is read too, if it is there."""
    return [(split, info.rejected) for split, info in sorted(found.splits.items())]


def read_rejected(dataset: str, split: str, expected: int) -> Iterator[tuple[str, object]]:
    """One split's rejected-inputs file: its lines as REJECTED rows, its count against the
    manifest's, then its COUNT of lines."""
    name = naming.rejected_name(split)
    path = paths.join(dataset, name)
    count = 0
    try:
        if not tf.io.gfile.exists(path):
            if expected:
                yield PROBLEM, f"{name} is missing ({expected} rejected)"
            return
        with tf.io.gfile.GFile(path) as lines:
            for number, line in enumerate(lines, 1):
                if not line.strip():
                    continue
                count += 1
                try:
                    row = dataclasses.asdict(rejection_lib.Rejection.from_json(line))
                except ValueError as err:
                    yield PROBLEM, f"{name} line {number} is not a rejection ({err})"
                    continue
                yield REJECTED, (row["relpath"] or row["path"], row)
    except (tf.errors.OpError, UnicodeDecodeError) as err:
        yield PROBLEM, f"{name} cannot be read after {count} lines: {messages.one_line(err)}"
    if count != expected:
        yield PROBLEM, f"{name} holds {count} lines, the manifest counts {expected} rejected"
    yield COUNT, count


def expected_row(listed: sources.SourceFile, labels: frozenset[str], policy) -> dict:
    """What the converter should have made of one source (`outcome.decide`, as the job's
    LoadImages): a record's hashes, or a rejection."""
    row = {"path": listed.path, "split": listed.split, "label": listed.label}
    result = outcome.decide(listed, labels, policy)
    if result.reason is not None:
        return dict(row, rejected=result.reason)
    row["sha256"] = hashlib.sha256(result.data).hexdigest()
    row["encoded_sha256"] = hashlib.sha256(result.stored.encoded).hexdigest()
    return row


def count_problems(found: manifest.Manifest, source: str, listed: dict[str, int]) -> list[str]:
    """Each split lists as many sources now as the manifest says it did."""
    return [
        f"split {split}: the manifest lists {info.listed} inputs, {source} now has "
        f"{listed.get(split, 0)}"
        for split, info in sorted(found.splits.items())
        if listed.get(split, 0) != info.listed
    ]


def check_path(relpath: str, rows: dict[str, list[dict]], dedupe: bool) -> list[str]:
    """The rules for one relative path: its SOURCE, RECORD and REJECTED rows agree.

    A source rejected as a duplicate of another's content is checked with that other
    (`check_content`), when the conversion deduplicated.
    """
    # In a fixed order: the joins deliver rows in any order (one row, the usual case, is).
    listed, records, rejected = (
        sorted(rows[kind], key=_order) if len(rows[kind]) > 1 else list(rows[kind])
        for kind in (SOURCE, RECORD, REJECTED)
    )
    problems: list[str] = []
    if (
        dedupe
        and not records
        and [r.get("reason") for r in rejected] == [images.DUPLICATE_CONTENT]
        and [s.get("rejected") for s in listed] == [None]
    ):
        return problems
    if not listed:
        where = [f"shard {r['shard']}" for r in records] + ["rejected/"] * len(rejected)
        return [f"{relpath}: in {', '.join(where)} but not among the sources"]
    if len(records) > 1:
        shards = ", ".join(record["shard"] for record in records)
        problems.append(f"{relpath}: written {len(records)} times (shards {shards})")
    stored = [s for s in listed if "rejected" not in s]
    refused = [s for s in listed if "rejected" in s]
    if records and stored:
        _check_record(relpath, records[0], stored[0], problems)
    elif records:
        reasons = ", ".join(sorted({s["rejected"] for s in refused}))
        problems.append(
            f"{relpath}: has a record, but the converter would reject it now ({reasons})"
        )
    elif stored:
        if rejected:
            problems.append(
                f"{relpath}: in rejected/ ({rejected[0].get('reason')}), but the converter "
                "would store it now"
            )
        else:
            problems.append(f"{relpath}: listed but in no shard and not in rejected/ (lost)")
    # A stored source's line in rejected/ was reported just above, and so was a record of a
    # source that would be rejected now (it has no rejection line to miss).
    lines = rejected[1:] if stored and not records and rejected else rejected
    _check_rejections(relpath, refused if stored or not records else [], lines, problems)
    return problems


def _order(row: dict) -> str:
    return json.dumps(row, sort_keys=True)


def content_row(relpath: str, rows: dict[str, list[dict]]) -> tuple[str, dict] | None:
    """A source the converter would store, under its content hash, with what became of it."""
    stored = [s for s in rows[SOURCE] if "rejected" not in s]
    if len(rows[SOURCE]) != 1 or not stored:
        return None
    became = "record" if rows[RECORD] else None
    if not became and rows[REJECTED]:
        became = min(rows[REJECTED], key=_order).get("reason")
    source = stored[0]
    row = {"relpath": relpath, "split": source["split"], "label": source["label"], "became": became}
    return source["sha256"], row


def check_content(rows: Iterable[dict], reported: list[list[str]], found: manifest.Manifest
                  ) -> tuple[list[str], int, int]:  # fmt: skip
    """The sources with the same bytes (`content_row`s), and the groups duplicates.jsonl gives
    for those bytes (one, or none): listed there as they are; with dedupe, the first by path
    is the one stored and the others are rejected.

    Returns the problems, and 1 or 0 for: a group of duplicates, one across splits.
    """
    group = sorted(rows, key=lambda row: row["relpath"])
    reported = sorted(reported)
    problems = []
    if len(reported) > 1:
        problems.append(f"{naming.DUPLICATES_NAME}: lists the bytes of {reported[0][0]} "
                        f"{len(reported)} times")  # fmt: skip
    if found.conversion.get("dedupe") and group:
        first, *others = group
        if first["became"] != "record":
            problems.append(
                f"{first['relpath']}: the first of its content (--dedupe) is not stored"
            )
        for other in others:
            if other["became"] != images.DUPLICATE_CONTENT:
                problems.append(
                    f"{other['relpath']}: the same bytes as {first['relpath']}, yet "
                    f"{'stored' if other['became'] == 'record' else 'not rejected as such'}"
                    " (--dedupe)"
                )  # fmt: skip
    if len(group) < 2:
        if reported:
            problems.append(f"{naming.DUPLICATES_NAME}: lists {reported[0][0]} and others, "
                            "which differ now")  # fmt: skip
        return problems, 0, 0
    if found.knows_duplicates and reported[:1] != [[row["relpath"] for row in group]]:
        problems.append(
            f"{naming.DUPLICATES_NAME}: the inputs with the bytes of {group[0]['relpath']} "
            f"({len(group)}) are not listed as one group"
        )
    return problems, 1, int(len({row["split"] for row in group}) > 1)


def read_reported(dataset: str, found: manifest.Manifest) -> Iterator[tuple[str, object]]:
    """duplicates.jsonl's groups as REPORTED (content hash, relative paths), or its PROBLEM.
    Read whenever it is there: a report the manifest counts no groups in is checked too."""
    path = paths.join(dataset, naming.DUPLICATES_NAME)
    try:
        if not tf.io.gfile.exists(path):
            if found.duplicates.get("groups"):
                yield (
                    PROBLEM,
                    (f"{naming.DUPLICATES_NAME} is missing ({found.duplicates['groups']} groups)"),
                )
            return
        with tf.io.gfile.GFile(path) as lines:
            rows = [json.loads(line) for line in lines if line.strip()]
        groups = [(row["sha256"], [f["relpath"] for f in row["files"]]) for row in rows]
        if not all(isinstance(sha, str) and files and all(isinstance(f, str) for f in files)
                   for sha, files in groups):  # fmt: skip
            raise TypeError("a group without a content hash or files")
    except (ValueError, KeyError, TypeError, RecursionError, tf.errors.OpError) as err:
        yield PROBLEM, f"{naming.DUPLICATES_NAME} is not a duplicates report ({messages.one_line(err)})"
        return
    for group in groups:
        yield REPORTED, group


def group_count_problems(found: manifest.Manifest, groups: int, cross_split: int) -> list[str]:
    """The manifest's duplicate counts are the sources' (when it counts them)."""
    in_manifest = (found.duplicates.get("groups", 0), found.duplicates.get("cross_split_groups", 0))
    if not found.knows_duplicates or in_manifest == (groups, cross_split):
        return []
    return [
        (
            f"manifest.json counts {in_manifest[0]} duplicate groups ({in_manifest[1]} across "
            f"splits); the sources have {groups} ({cross_split})"
        )
    ]


def _check_record(relpath: str, record: dict, expected: dict, problems: list[str]) -> None:
    where = f"{relpath} (shard {record['shard']})"
    for problem in record["record_problems"]:
        problems.append(f"{where}: {problem}")
    if record["split"] != expected["split"]:
        problems.append(f"{where}: in split {record['split']}, but listed in {expected['split']}")
    if record["sha256"] != expected["sha256"]:
        problems.append(f"{relpath}: the source changed since conversion (content hash differs)")
    elif record["encoded_sha256"] != expected["encoded_sha256"]:
        problems.append(
            f"{where}: the record's image is not what the converter writes for this source "
            "(modified record)"
        )
    if record["label"] != expected["label"]:
        problems.append(
            f"{where}: label {record['label']!r}, the source says {expected['label']!r}"
        )


def _check_rejections(relpath, refused, rejected, problems: list[str]) -> None:
    """Each rejection the converter would make now has its line, with its reason and split."""
    lines = list(rejected)
    for expected in refused:
        line = next((r for r in lines if r.get("reason") == expected["rejected"]), None)
        if line is None and lines:
            line = lines[0]
            problems.append(
                f"{relpath}: rejected as {line.get('reason')}, but the converter would now say "
                f"{expected['rejected']}"
            )
        if line is None:
            problems.append(
                f"{relpath}: should be rejected ({expected['rejected']}), but is in no shard and "
                "not in rejected/ (lost)"
            )
            continue
        lines.remove(line)
        if line.get("split") != expected["split"]:
            problems.append(
                f"{relpath}: rejected in split {line.get('split')}, but listed in "
                f"{expected['split']}"
            )
    for line in lines:
        problems.append(f"{relpath}: an extra rejection line ({line.get('reason')})")


# The local driver.


def first_problems(ranked: Iterable[tuple[int, str]]) -> list[str]:
    """The problems listed: the first MAX_PROBLEMS_KEPT of (rank, text) pairs in order."""
    return [text for _, text in sorted(ranked)[:MAX_PROBLEMS_KEPT]]


class _Problems:
    """All problems counted; the first MAX_PROBLEMS_KEPT in order kept, in bounded memory."""

    def __init__(self):
        self._ranked: list[tuple[int, str]] = []
        self.count = 0

    def add(self, text: str, rank: int = INPUTS) -> None:
        self.count += 1
        self._ranked.append((rank, text))
        if len(self._ranked) >= 2 * MAX_PROBLEMS_KEPT:
            self._ranked = sorted(self._ranked)[:MAX_PROBLEMS_KEPT]

    def extend(self, texts: Iterable[str], rank: int = INPUTS) -> None:
        for text in texts:
            self.add(text, rank)

    @property
    def kept(self) -> list[str]:
        return first_problems(self._ranked)


class _Buckets:
    """Rows spilled to JSON-lines files by a hash of their key; read back one bucket at a time."""

    def __init__(self, folder: str, count: int):
        os.makedirs(folder, exist_ok=True)
        self.count = count
        self._paths = [os.path.join(folder, f"bucket-{i:05d}.jsonl") for i in range(count)]
        self._files = [open(path, "w") for path in self._paths]

    def add(self, key: str, kind: str, row) -> None:
        index = int(hashlib.md5(key.encode()).hexdigest()[:8], 16) % len(self._files)
        self._files[index].write(json.dumps([key, kind, row]) + "\n")

    def groups(self) -> Iterator[tuple[str, dict[str, list]]]:
        for handle in self._files:
            handle.close()
        for path in self._paths:
            rows: dict[str, dict[str, list]] = collections.defaultdict(
                lambda: {SOURCE: [], RECORD: [], REJECTED: []}
            )
            with open(path) as lines:
                for line in lines:
                    key, kind, row = json.loads(line)
                    rows[key][kind].append(row)
            yield from rows.items()
            os.remove(path)


def verify(source: str, dataset: str) -> VerifyReport:
    """Checks dataset `dataset` against the inputs at `source` (as given to the converter), on
    this machine.

    Raises:
      FileNotFoundError: `dataset` is not a finished dataset, or `source` lists nothing.
      ValueError: the manifest does not record how the dataset was converted.
    """
    found = read_conversion(dataset)
    problems = _Problems()
    problems.extend(check_descriptions(dataset, found), FILES)
    problems.extend(check_rejection_files(dataset, found), FILES)
    listed = sum(info.listed for info in found.splits.values())
    totals = collections.Counter()
    with tempfile.TemporaryDirectory(prefix="tfrecord-pipe-verify-") as work:
        buckets = _Buckets(work, max(1, math.ceil(3 * listed / ROWS_PER_BUCKET)))

        def add(read: Iterable[tuple[str, object]], total: str) -> None:
            for kind, value in read:
                if kind == PROBLEM:
                    problems.add(value, FILES)
                elif kind == COUNT:
                    totals[total] += value
                else:
                    key, row = value
                    buckets.add(key, kind, row)

        with futures.ThreadPoolExecutor(THREADS) as pool:
            for shard in shards_of(found):
                add(read_shard(dataset, found, shard, pool), RECORD)
            for split, expected in rejection_files(found):
                add(read_rejected(dataset, split, expected), REJECTED)
            per_split = _add_sources(source, dataset, found, buckets, work, pool)
        problems.extend(count_problems(found, source, per_split), FILES)
        by_content = _Buckets(os.path.join(work, "by-content"), buckets.count)
        dedupe = bool(found.conversion.get("dedupe"))
        for relpath, rows in buckets.groups():
            problems.extend(check_path(relpath, rows, dedupe))
            same = content_row(relpath, rows)
            if same is not None:
                by_content.add(same[0], SOURCE, same[1])
        _check_duplicates(dataset, found, by_content, problems)
    return VerifyReport(
        sources=sum(per_split.values()),
        records=totals[RECORD],
        rejected=totals[REJECTED],
        problems=tuple(problems.kept),
        num_problems=problems.count,
    )


def _add_sources(source, dataset, found, buckets, work, pool) -> dict[str, int]:
    """Lists the inputs as the converter did and records what each should have become."""
    config = source_config(source, dataset, found)
    listed = sources.list_sources(config)
    found_listed = sum(info.listed for info in found.splits.values())
    if config.layout == "csv":  # a file listed twice is kept once, as the converter does
        listed = _one_per_file(listed, work, max(1, math.ceil(found_listed / ROWS_PER_BUCKET)))
    labels = frozenset(found.labels)
    per_split = collections.Counter()
    for chunk in _chunks(listed):
        for item, row in pool.map(lambda s: (s, expected_row(s, labels, config.policy)), chunk):
            per_split[item.split] += 1
            buckets.add(item.relpath, SOURCE, row)
    return dict(per_split)


def _one_per_file(listed, work, count: int) -> Iterator[sources.SourceFile]:
    """`listed`, with every listing of a file but the one kept marked as a duplicate
    (`sources.one_per_file`); grouped on local disk, so memory stays flat."""
    by_file = _Buckets(os.path.join(work, "by-file"), count)
    for item in listed:
        by_file.add(sources.identity(item), SOURCE, dataclasses.asdict(item))
    for _, rows in by_file.groups():
        kept, duplicates = sources.one_per_file([_source_file(row) for row in rows[SOURCE]])
        yield kept
        yield from duplicates


def _source_file(row: dict) -> sources.SourceFile:
    return sources.SourceFile(**{**row, "problem": tuple(row["problem"] or ()) or None})


def _check_duplicates(dataset, found, by_content: _Buckets, problems: _Problems) -> None:
    """Every group of sources with the same bytes, and every group duplicates.jsonl reports."""
    reported = collections.defaultdict(list)
    for kind, value in read_reported(dataset, found):
        if kind == PROBLEM:
            problems.add(value, FILES)
        else:
            reported[value[0]].append(value[1])
    groups = cross_split = 0
    for sha256, rows in by_content.groups():
        found_problems, group, across = check_content(rows[SOURCE], reported.pop(sha256, []), found)
        problems.extend(found_problems)
        groups, cross_split = groups + group, cross_split + across
    for files in reported.values():  # bytes no source has now
        problems.extend(check_content([], files, found)[0])
    problems.extend(group_count_problems(found, groups, cross_split), FILES)
