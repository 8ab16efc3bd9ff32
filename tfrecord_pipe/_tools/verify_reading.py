"""The dataset's side of `verify`: its manifest, small files, shards, rejection lists and
duplicates report, read into the rows and problems the rules (`verify_rules`) judge.

Read as the job writes them (`beam_jobs.storage`: local disk, gs://), without TensorFlow,
and without Beam for a local dataset: verify's workers import this module. A shard read that
fails for a passing reason (storage, not damage) resumes after the last record read, a few
times: our retry, on top of the client library's.
"""

from __future__ import annotations

import collections
import dataclasses
import fnmatch
import hashlib
import itertools
import json
import logging
import os
import posixpath
import time
from collections.abc import Iterator

from beam_jobs import finalise, record_reader, shard_plan, storage
from tfrecord_pipe._core import manifest, messages, naming, paths, schema
from tfrecord_pipe._core import rejection as rejection_lib
from tfrecord_pipe._tools.verify_rules import (
    COUNT,
    LABEL_COUNT,
    PLANNED,
    PROBLEM,
    RECORD,
    REJECTED,
    REPORTED,
    SPAN,
    parse_record,
    record_row,
)

log = logging.getLogger(__name__)

READ_ATTEMPTS = 4  # reads of a shard that fail for a passing reason, before giving up
RETRY_WAIT_S = 0.5  # doubled after each failed attempt
# Errors that say something about the data, not about the storage at this moment.
_LASTING = (record_reader.CorruptShardError, FileNotFoundError, PermissionError)


def read_conversion(dataset: str, source: str | None = None) -> manifest.Manifest:
    """The dataset's manifest, which must record how the dataset was converted.

    Raises:
      FileNotFoundError: `dataset` is not a finished dataset (and where `source` is one, the
        two were given the wrong way round: that is said).
      ValueError: the manifest cannot be read, does not parse, or does not record how the
        dataset was converted.
    """
    path = paths.join(dataset, naming.MANIFEST_NAME)
    if not storage.exists(path):
        if source is not None and finalise.dataset_in(source) is not None:
            raise FileNotFoundError(
                f"{dataset} is not a dataset but {source} is: the arguments look swapped. Give "
                "the images first, then the dataset (verify SRC OUT)."
            )
        raise manifest.not_a_dataset(dataset)
    try:
        found = manifest.Manifest.from_file_text(storage.read_text(path), path)
    except PermissionError as err:
        raise ValueError(f"{path} cannot be read: {messages.one_line(err)}") from err
    except (ValueError, UnicodeDecodeError) as err:
        raise manifest.edited(ValueError(messages.one_line(err))) from err
    if not found.conversion:
        raise ValueError(
            f"The manifest of {dataset} does not record how it was converted, so verify cannot "
            "redo the conversion. Convert the images again with this version to verify them."
        )
    return found


def source_config(source: str, dataset: str, found: manifest.Manifest):
    """The conversion's configuration as the manifest recorded it, for these paths.

    Raises:
      ValueError: the dataset is the source folder or inside it (the arguments swapped or
        mistyped: the converter refuses such an output), or a folder is given for a dataset
        converted from a CSV list.
    """
    from beam_jobs import flags, sources  # the launcher's alone: the workers import this module

    recorded = flags.recorded_config(found.conversion)
    if recorded.layout == "csv" and not paths.is_remote(source) and os.path.isdir(source):
        raise ValueError(
            f"{dataset} was converted from the CSV list {recorded.source}: give that file (or "
            f"its copy) as SRC, not the folder {source}."
        )
    # Not the rules a new conversion must meet: a dataset of a version before them verifies.
    config = sources.resolve_layout(dataclasses.replace(recorded, source=source, output=dataset),
                                    converting=False)  # fmt: skip
    root = config.source_root
    if config.layout != "csv" and paths.is_inside(dataset, root):
        raise ValueError(
            f"The dataset {dataset} is the source folder {root}, or inside it: its own files "
            "would be listed as inputs. Give the images the dataset was converted from first, "
            "then the dataset: tfrecord-pipe verify SRC OUT."
        )
    return config


def check_descriptions(dataset: str, found: manifest.Manifest) -> list[str]:
    """labels.txt and TFDS's metadata must say what the manifest says (they are made from it)."""
    problems = []
    for name, text in manifest.files_beside(found):
        path = paths.join(dataset, name)
        try:
            if not storage.exists(path):
                problems.append(f"{name}: missing (it is written with the manifest)")
            elif storage.read_bytes(path) != text.encode("utf-8"):
                problems.append(
                    f"{name}: does not say what manifest.json says (changed after writing?)"
                )
        except Exception as err:  # noqa: BLE001 - any filesystem's error: said, not fatal
            problems.append(f"{name}: cannot be read: {messages.one_line(err)}")
    return problems


def check_rejection_files(dataset: str, found: manifest.Manifest) -> list[str]:
    """rejected/ holds no rejections file of a split the manifest does not have (it would go
    unread). Other files there are the user's."""
    expected = {naming.rejected_name(split) for split in found.splits}
    try:
        _, names = storage.children(paths.join(dataset, naming.REJECTED_DIR))
    except Exception as err:  # noqa: BLE001 - any filesystem's error: said, not fatal
        return [f"{naming.REJECTED_DIR}/ cannot be listed: {messages.one_line(err)}"]
    found_names = {
        f"{naming.REJECTED_DIR}/{name}"
        for name in names
        if fnmatch.fnmatchcase(name, posixpath.basename(naming.rejected_name("*")))
    }
    return [
        f"{name}: not a split of the manifest ({', '.join(sorted(found.splits))})"
        for name in sorted(found_names - expected)
    ]


def check_manifest(found: manifest.Manifest) -> list[str]:
    """The manifest agrees with itself: its record format is this version's, its label offset
    and compression the ones its conversion recorded, its counts of rejection reasons add up
    to its splits' rejections (a manifest older than the reasons has none), and each split
    holds inputs."""
    problems = []
    if found.format_version != schema.FORMAT_VERSION:
        problems.append(
            f"{naming.MANIFEST_NAME}: record format {found.format_version}, but this version "
            f"reads format {schema.FORMAT_VERSION}: convert again, or verify with the version "
            f"that wrote it ({found.tool_version or 'unknown'})"
        )
    recorded = found.conversion.get("label_offset", found.label_offset)  # 0.1's: its flags
    if recorded != found.label_offset:
        problems.append(
            f"{naming.MANIFEST_NAME}: label_offset {found.label_offset}, but the conversion it "
            f"records wrote labels with {recorded!r} (edited?)"
        )
    compressed = found.conversion.get("compress")  # absent before 0.2
    if isinstance(compressed, bool) and compressed != (found.compression == naming.GZIP):
        problems.append(
            f"{naming.MANIFEST_NAME}: compression {found.compression!r}, but the conversion it "
            f"records ran with compress {compressed} (edited?)"
        )
    reasons = sum(found.rejected_reasons.values())
    if found.rejected_reasons and reasons != found.num_rejected:
        problems.append(
            f"{naming.MANIFEST_NAME}: its rejection reasons count {reasons} rejected, its splits "
            f"{found.num_rejected} (edited?)"
        )
    # The converter makes a split of the inputs it lists for it: one of none, used or
    # rejected, passed, and `inspect` said every input of it was rejected (a helper's trial).
    problems.extend(
        f"{naming.MANIFEST_NAME}: split {split} holds no input, used or rejected: the converter "
        "writes no such split (edited?)"
        for split, info in sorted(found.splits.items()) if info.listed == 0
    )  # fmt: skip
    return problems


def check_rejection_reasons(dataset: str, found: manifest.Manifest) -> list[str]:
    """The manifest's count of each rejection reason is the count of rejected/'s lines of that
    reason, where the totals agree: the totals are checked apart (`read_rejected`,
    `check_manifest`), and only these counts were not (a helper's manifest that moved two
    rejections from one reason to another verified). A manifest older than the reasons has
    none."""
    if not found.rejected_reasons:
        return []
    lines: collections.Counter = collections.Counter()
    for split in sorted(found.splits):
        path = paths.join(dataset, naming.rejected_name(split))
        try:
            if not storage.exists(path):
                continue
            for line in storage.read_lines(path):
                if line.strip():
                    lines[rejection_lib.Rejection.from_json(line).reason] += 1
        except Exception:  # noqa: BLE001 - read_rejected says what is wrong with the file
            return []
    if sum(lines.values()) != sum(found.rejected_reasons.values()):
        return []  # said by the checks of the totals
    return [
        f"{naming.MANIFEST_NAME}: counts {found.rejected_reasons.get(reason, 0)} rejected as "
        f"{reason}, where {naming.REJECTED_DIR}/ has {lines[reason]} lines of that reason (edited?)"
        for reason in sorted(set(lines) | set(found.rejected_reasons))
        if lines[reason] != found.rejected_reasons.get(reason, 0)
    ]


def check_shard_sizes(dataset: str, found: manifest.Manifest) -> list[str]:
    """Each local shard file of another size than the manifest lists (readers refuse it)."""
    return [problem for info in found.splits.values() for problem in info.size_problems(dataset)]


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


def read_shard(dataset: str, found: manifest.Manifest, shard: tuple[str, str, int, str | None],
               decode: bool = False, temp_dir: str | None = None, beside=None
               ) -> Iterator[tuple[str, object]]:  # fmt: skip
    """One shard read whole: its records as RECORD rows (`verify_rules.record_row`, which
    decodes each image with `decode`); its count against the manifest's; its twin in the
    other format (if any) against it, record for record; its SPAN of keys (read whole), with
    whether the inputs it holds are those the manifest's digest of them names
    (`manifest.ShardPositions`); then its COUNT of records.
    Also the records of each label it holds, as LABEL_COUNT rows, and the bytes its records
    count for in shard sizing (PLANNED).
    `temp_dir`: where a remote ArrayRecord shard is copied to be read. `beside`: told the
    relative paths of each window of records before they are judged (`ahead`), and asked
    whether each record's image is its source's (`same_image`; `verify_beside`)."""
    split, name, expected, twin = shard
    path = paths.join(dataset, name)
    count, failed, digest = 0, None, hashlib.sha256() if twin is not None else None
    first_key, last_key, out_of_order = None, "", None
    positions, unparsed = manifest.ShardPositions(), False
    labels, planned = collections.Counter(), 0
    same_image = beside.same_image if beside is not None else None
    try:
        records = _serialized(path, found.compression, temp_dir)
        for serialized, parsed in _parsed(records, found, beside.ahead if beside else None):
            count += 1
            if digest is not None:
                _add_record(digest, serialized)
            row = record_row(serialized, found, decode, parsed, same_image)
            if "problem" in row:
                yield PROBLEM, f"{name} record {count}: {row['problem']}"
                unparsed = True
                continue
            positions.add(row["relpath"], row["label_index"], row["label"])
            labels[row["label"]] += 1
            planned += shard_plan.record_size(len(parsed[0].encoded), row["relpath"], row["label"])
            # The converter writes a shard's records in key order (shard_plan.order_key).
            key = shard_plan.order_key(row["relpath"])
            if key <= last_key and out_of_order is None:
                out_of_order = count
            first_key = key if first_key is None else first_key
            last_key = max(key, last_key)
            row.update(shard=name, split=split)
            yield RECORD, (row.pop("relpath"), row)
    except FileNotFoundError:
        yield PROBLEM, f"shard {name} is missing (the manifest lists {expected} records)"
        return
    except Exception as err:  # noqa: BLE001 - damage, or a storage that kept failing
        failed = err
        doing = "is corrupt" if isinstance(err, record_reader.CorruptShardError) else (
            "could not be read")  # fmt: skip
        yield PROBLEM, (f"shard {name} {doing} after {count} records: "
                        f"{messages.one_line(err) or type(err).__name__}")  # fmt: skip
    if out_of_order is not None:
        yield PROBLEM, (f"shard {name}: its records are not in the order the converter writes "
                        f"them, from record {out_of_order} on (moved or reordered?)")  # fmt: skip
    if count != expected:
        yield PROBLEM, f"shard {name} holds {count} records, the manifest lists {expected}"
    recorded = _recorded_digest(found, split, name)
    # A shard blamed already (a record that does not parse, out of order, another count)
    # would be blamed again: the digest speaks only for a shard otherwise sound.
    blamed = unparsed or out_of_order is not None or count != expected
    named = blamed or not recorded or positions.hexdigest() == recorded
    if failed is None and first_key is not None:
        yield SPAN, (split, name, first_key, last_key, named)
    if twin is not None and failed is None:
        problem = _twin_problem(paths.join(dataset, twin), found, digest.hexdigest(), name,
                                temp_dir)  # fmt: skip
        if problem:
            yield PROBLEM, problem
    for label, n in labels.items():
        yield LABEL_COUNT, (split, label, n)
    yield PLANNED, (split, planned)
    yield COUNT, count


WINDOW_RECORDS = 64  # records parsed ahead of their rows, for `ahead` (their sources' reads)
WINDOW_BYTES = 8 << 20  # and at most this many bytes of them (held twice: read and parsed)


def _parsed(records: Iterator[bytes], found: manifest.Manifest, ahead
            ) -> Iterator[tuple[bytes, tuple | str]]:  # fmt: skip
    """(record, `verify_rules.parse_record`'s answer) per record; with `ahead`, a window at a
    time, `ahead` given the window's relative paths first. A read that fails gives the
    records before it, then raises."""
    if ahead is None:
        for serialized in records:
            yield serialized, parse_record(serialized, found)
        return
    records, ended = iter(records), False
    while not ended:
        window, size, failed = [], 0, None
        try:
            for serialized in records:
                window.append((serialized, parse_record(serialized, found)))
                size += len(serialized)
                if len(window) >= WINDOW_RECORDS or size >= WINDOW_BYTES:
                    break
            else:
                ended = True
        except Exception as err:  # noqa: BLE001 - raised again once the window is judged
            failed = err
        ahead([parsed[0].filename for _, parsed in window if not isinstance(parsed, str)])
        yield from window
        if failed is not None:
            raise failed


def _recorded_digest(found: manifest.Manifest, split: str, name: str) -> str:
    """The manifest's `ShardPositions` digest of the shard file `name` ("" if it has none)."""
    info = found.splits[split]
    if not info.shard_digests:
        return ""
    for file_format in naming.FILE_FORMATS:
        if name in info.files_of(file_format):
            return info.shard_digests[info.files_of(file_format).index(name)]
    return ""


def _add_record(digest, serialized: bytes) -> None:
    """Adds a record to a digest of a sequence of records (its length first: no two sequences
    share one)."""
    digest.update(len(serialized).to_bytes(8, "little"))
    digest.update(serialized)


def _twin_problem(path: str, found: manifest.Manifest, expected: str, name: str,
                  temp_dir: str | None) -> str | None:  # fmt: skip
    """Why the shard file `path` does not hold exactly the records of shard `name` (whose
    records' digest is `expected`), or None."""
    twin = paths.basename(path)
    digest, count = hashlib.sha256(), 0
    try:
        for serialized in _serialized(path, found.compression, temp_dir):
            _add_record(digest, serialized)
            count += 1
    except FileNotFoundError:
        return f"shard {twin} is missing (the same records as {name})"
    except Exception as err:  # noqa: BLE001 - damage, or a storage that kept failing
        return f"shard {twin} is corrupt after {count} records: {messages.one_line(err)}"
    if digest.hexdigest() != expected:
        return f"shard {twin} does not hold the records of {name} ({count} records read)"
    return None


def _serialized(path: str, compression: str, temp_dir: str | None) -> Iterator[bytes]:
    """The records of a shard (`record_reader.records`). A read that fails for a passing
    reason resumes after the last record, a few times."""
    done = failures = 0
    while True:
        try:
            for record in itertools.islice(record_reader.records(path, compression, temp_dir), done, None):
                yield record
                done += 1
            return
        except _LASTING:
            raise
        except Exception as err:  # noqa: BLE001 - every filesystem raises its own
            failures += 1
            if failures >= READ_ATTEMPTS:
                raise
            log.warning("Reading %s failed (%s); again from record %d", path,
                        messages.one_line(err), done)  # fmt: skip
            time.sleep(RETRY_WAIT_S * 2**failures)


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
        if not storage.exists(path):
            if expected:
                yield PROBLEM, f"{name} is missing ({expected} rejected)"
            return
        for number, line in enumerate(storage.read_lines(path), 1):
            if not line.strip():
                continue
            count += 1
            try:
                row = dataclasses.asdict(rejection_lib.Rejection.from_json(line))
            except ValueError as err:
                yield PROBLEM, f"{name} line {number} is not a rejection ({err})"
                continue
            yield REJECTED, (row["relpath"] or row["path"], row)
    except Exception as err:  # noqa: BLE001 - any filesystem's error, or a line not UTF-8
        yield PROBLEM, f"{name} cannot be read after {count} lines: {messages.one_line(err)}"
    if count != expected:
        yield PROBLEM, f"{name} holds {count} lines, the manifest counts {expected} rejected"
    yield COUNT, count


def read_reported(dataset: str, found: manifest.Manifest) -> Iterator[tuple[str, object]]:
    """duplicates.jsonl's groups as REPORTED (content hash, the line read), or its PROBLEM.
    Read whenever it is there: a report the manifest counts no groups in is checked too.
    The file is read twice, to check it whole and then to give its groups, rather than held."""
    path = paths.join(dataset, naming.DUPLICATES_NAME)
    try:
        if not storage.exists(path):
            if found.duplicates.get("groups"):
                yield (PROBLEM,
                       f"{naming.DUPLICATES_NAME} is missing ({found.duplicates['groups']} groups)")  # fmt: skip
            return
        for _ in _groups(path):
            pass
    except Exception as err:  # noqa: BLE001 - any filesystem's error, or not a report
        yield PROBLEM, f"{naming.DUPLICATES_NAME} is not a duplicates report ({messages.one_line(err)})"
        return
    try:
        for group in _groups(path):
            yield REPORTED, group
    except Exception as err:  # noqa: BLE001 - changed, or the storage failed, since the check
        yield PROBLEM, f"{naming.DUPLICATES_NAME} cannot be read again ({messages.one_line(err)})"


def _groups(path: str) -> Iterator[tuple[str, dict]]:
    for line in storage.read_lines(path):
        if not line.strip():
            continue
        row = json.loads(line)
        sha256, files = row["sha256"], [f["relpath"] for f in row["files"]]
        if not (isinstance(sha256, str) and files and all(isinstance(f, str) for f in files)):
            raise TypeError("a group without a content hash or files")
        yield sha256, row
