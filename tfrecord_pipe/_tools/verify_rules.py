"""The rules of `verify`: what each source should have become, what each record and
rejection line says, and how the two must agree. Both drivers run these: `verify` on this
machine, `verify_job` as a Beam pipeline.

A record is proven by its bytes: it must be, byte for byte, the record the converter writes
for its source now (the same serialized Example: image, size, label, name, source hash).
Reading a record proves that its bytes are those the converter writes for the values they
hold (`schema.decode_written`), so it is the converter's record when those values are the
ones the converter gives its source now, the image by its SHA-256 (`RECORD_VALUES`); what
differs is explained field by field. That proves the dataset is the converter's output for
these sources, not that TensorFlow decodes every image: the converter's checks decode with
Pillow, after a walk of each JPEG's markers for the damage Pillow takes and TensorFlow
refuses (`_core/jpeg_markers.py`). `decode` (`verify --decode`) decodes every record's image
as the reader will, with TensorFlow itself. The rows of one relative path (its SOURCE, RECORD
and REJECTED rows) are judged by `check_path`; the sources with the same bytes, with
duplicates.jsonl's group for them, by `check_content`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import operator
import os
from collections.abc import Iterable

from beam_jobs import duplicates, outcome, shard_plan, sources, storage
from beam_jobs.source_file import SourceFile
from tfrecord_pipe._core import images, manifest, messages, naming, paths, schema

MAX_PROBLEMS_KEPT = 1000  # problems listed in full; beyond that only counted
# What the readers of shards, rejection files and sources yield: (kind, value) with kind one
# of these. A row goes into the join under its relative path; a problem is reported; a count
# adds to the report's totals.
SOURCE, RECORD, REJECTED, PROBLEM, COUNT = "source", "record", "rejected", "problem", "count"
REPORTED = "reported"  # a group of duplicates.jsonl, joined on its content hash
SPAN = "span"  # a shard's first and last record keys, for the order across shards
LABEL_COUNT = "label_count"  # (split, label, n): a shard's records of a label
PLANNED = "planned"  # (split, n): the bytes a shard's records count for in shard sizing
# Problems are listed in this order: those of the dataset's files (shards, rejection files,
# the manifest's counts), then those of single inputs; alphabetically within each. The first
# MAX_PROBLEMS_KEPT are kept, the same ones by both drivers.
FILES, INPUTS = 0, 1


@dataclasses.dataclass(frozen=True)
class VerifyReport:
    """Attributes: sources listed; records read; rejected lines read; problems (the first
    MAX_PROBLEMS_KEPT); num_problems in all; decoded: every record's image was decoded with
    TensorFlow too (`--decode`); converted_from: the source the manifest names, where the
    one given may be another ("" else)."""

    sources: int
    records: int
    rejected: int
    problems: tuple[str, ...]
    num_problems: int
    decoded: bool = False
    converted_from: str = ""

    @property
    def ok(self) -> bool:
        return self.num_problems == 0

    def __str__(self):
        head = (
            f"{messages.counted(self.sources, 'source')} listed; "
            f"{messages.counted(self.records, 'record')} in the shards; "
            f"{self.rejected} rejected"
        )
        if self.ok:
            checked = "checked and decoded with TensorFlow" if self.decoded else "checked"
            return head + f": every source accounted for, every record {checked}. OK"
        lines = [head + f": {messages.counted(self.num_problems, 'problem')}"]
        lines += [f"  {problem}" for problem in self.problems]
        if self.num_problems > len(self.problems):
            lines.append(f"  ... and {self.num_problems - len(self.problems)} more")
        if self.converted_from:  # a page of problems may come of another folder given
            lines.append(f"The manifest says this dataset was converted from "
                         f"{self.converted_from}: is that the folder meant?")  # fmt: skip
        return "\n".join(lines)


def converted_from(found: manifest.Manifest, source: str) -> str:
    """The source the manifest names, where it may not be `source`; else ""."""
    recorded = found.conversion.get("source")
    if not isinstance(recorded, str) or _maybe_the_same(recorded, source):
        return ""
    return recorded


def _maybe_the_same(recorded: str, source: str) -> bool:
    """Whether `source` may be the folder `recorded` named. A relative path was relative to
    where the conversion ran, unknown here: any folder by that path's end may be it."""
    if paths.folder(recorded) == paths.folder(source):
        return True
    if paths.is_remote(recorded) or paths.is_remote(source):
        return False
    given = os.path.abspath(os.path.expanduser(source))
    if os.path.isabs(recorded):
        return os.path.normpath(recorded) == given
    return (os.sep + given).endswith(os.sep + os.path.normpath(recorded))


def first_problems(ranked: Iterable[tuple[int, str]]) -> list[str]:
    """The problems listed: the first MAX_PROBLEMS_KEPT of (rank, text) pairs in order."""
    return [text for _, text in sorted(ranked)[:MAX_PROBLEMS_KEPT]]


class Expect:
    """What the converter makes of a source now: a record's hashes (`row`), or its rejection.

    The record is built as the job's `load.read_record` builds it, from `outcome.decide`'s
    verdict (as the job's checks reach it) and the dataset's labels.
    """

    def __init__(self, found: manifest.Manifest, policy: images.ImagePolicy):
        self._index = {label: i for i, label in enumerate(found.labels)}
        self._policy = policy

    @property
    def labels(self) -> frozenset[str]:
        return frozenset(self._index)

    def __call__(self, listed: SourceFile) -> dict:
        return self.row(listed, outcome.decide(listed, self._index, self._policy))

    def row(self, listed: SourceFile, result: outcome.Outcome) -> dict:
        return self.row_and_image(listed, result)[0]

    def row_and_image(self, listed: SourceFile, result: outcome.Outcome
                      ) -> tuple[dict, bytes | None, bytes | None]:  # fmt: skip
        """(the row, the image its record holds, that image's SHA-256); the row alone
        (None, None) for a source the converter rejects. The row holds the record's values
        (`RECORD_VALUES`), not its bytes: a record laid out as the converter lays records
        out with these values is, byte for byte, the one it writes (`record_row`)."""
        row = {"path": listed.path, "split": listed.split, "label": listed.label}
        if result.reason is not None:
            return dict(row, rejected=result.reason), None, None
        stored = result.stored
        source_hash = hashlib.sha256(result.data)
        encoded = stored.encoded if stored.reencoded else result.data
        image_sha256 = (hashlib.sha256(encoded) if stored.reencoded else source_hash).digest()
        row = dict(
            row,
            sha256=source_hash.hexdigest(),
            encoded_sha256=image_sha256.hex(),
            label_index=self._index[listed.label],
            height=stored.height,
            width=stored.width,
        )
        return row, encoded, image_sha256


# What a record holds besides its name (the key it is joined on) and the values every record
# has: a record `written` (laid out as `schema.serialize` writes it) with its source's values
# of these is that source's record, byte for byte (its image by its SHA-256).
RECORD_VALUES = ("sha256", "encoded_sha256", "label", "label_index", "height", "width")
_record_values = operator.itemgetter(*RECORD_VALUES)


def parse_record(serialized: bytes, found: manifest.Manifest
                 ) -> tuple[schema.ImageRecord, bool] | str:  # fmt: skip
    """(the record, whether it is laid out as `schema.serialize` lays records out), or why it
    does not parse."""
    # What the converter wrote reads fast; anything else as TensorFlow's parser reads it.
    record = schema.decode_written(serialized, label_offset=found.label_offset)
    if record is not None:
        return record, True
    try:
        return schema.decode_parsed(serialized, label_offset=found.label_offset), False
    except ValueError as err:
        return f"does not parse: {err}"


def record_row(serialized: bytes, found: manifest.Manifest, decode: bool = False,
               parsed: tuple | str | None = None, same_image=None) -> dict:  # fmt: skip
    """What a record says: its relative path, its values (`RECORD_VALUES`, the image by its
    SHA-256), whether it is `written` as the converter lays records out, or why it does not
    parse. With `decode`, its image decoded as the reader decodes it (TensorFlow).

    `parsed`: `parse_record`'s answer, if taken already. `same_image(relpath, image)`: the
    SHA-256 of the image its source's record holds, if `image` is byte for byte that image
    (its hash is then not taken again), else None.
    """
    parsed = parse_record(serialized, found) if parsed is None else parsed
    if isinstance(parsed, str):
        return {"problem": parsed}
    record, written = parsed
    image_sha256 = same_image(record.filename, record.encoded) if same_image else None
    image_sha256 = image_sha256 or hashlib.sha256(record.encoded).digest()
    problems = []
    if decode:
        from tfrecord_pipe._reading import records  # TensorFlow: only where asked for

        image = records.image_problem(record)
        if image is not None:
            problems.append(image)
    if not 0 <= record.label_index < len(found.labels) or (
        found.labels[record.label_index] != record.label_text
    ):
        problems.append(
            f"label {record.label_index} ({record.label_text!r}) is not that label in the "
            "manifest's list of labels (labels.txt is written from it)"
        )
    return {
        "relpath": record.filename,
        "written": written,
        "sha256": record.sha256,
        "encoded_sha256": image_sha256.hex(),
        "height": record.height,
        "width": record.width,
        "label": record.label_text,
        "label_index": record.label_index,
        "record_problems": problems,
    }


def label_problems(found: manifest.Manifest, config, listed: Iterable[str]) -> list[str]:
    """The manifest's labels are those the converter takes from the sources listed now, the
    sorted distinct `listed` labels (`pipeline.CollectLabels`; of a CSV list, its lines kept
    once per file), or where a labels file gave them, that file's while it is there."""
    if config.labels_file is not None:
        return _labels_file_problems(found, config.labels_file)
    expected = tuple(sorted(set(listed)))
    if expected == found.labels:
        return []
    extra, missing = set(found.labels) - set(expected), set(expected) - set(found.labels)
    said = [f"{what}: {messages.some(sorted(names), show=repr)}" for what, names in (
        ("not among the sources", extra), ("not in the manifest", missing)) if names]  # fmt: skip
    changed = "a line" if config.layout == "csv" else "a label folder"
    return [(
        f"{naming.MANIFEST_NAME}: its labels are not the sorted labels of the sources listed "
        f"now ({'; '.join(said) or 'in another order'}): {changed} added or removed since, or "
        "the manifest edited"
    )]


def _labels_file_problems(found: manifest.Manifest, path: str) -> list[str]:
    """The manifest's labels are the labels file's, in its order, where the file is still
    there (a file gone says nothing): a dataset relabelled throughout, its manifest and every
    record's index alike, passed, and so did a file edited since, from which the converter
    now makes other labels (a helper's trial)."""
    try:
        if not storage.exists_at_all(path):
            return []
        listed = sources.read_labels_file(path, warn=False)  # (the conversion warned)
    except (OSError, ValueError) as err:
        return [f"the labels file {path}, which the conversion read, cannot be read now: "
                f"{messages.one_line(err)}"]  # fmt: skip
    if listed == found.labels:
        return []
    extra, missing = set(found.labels) - set(listed), set(listed) - set(found.labels)
    said = [f"{what}: {messages.some(sorted(names), show=repr)}" for what, names in (
        ("not in the file", extra), ("not in the manifest", missing)) if names]  # fmt: skip
    # (A relative path is this process's: named whole, it says which file was read.)
    where = path if paths.is_remote(path) else os.path.abspath(path)
    return [(
        f"{naming.MANIFEST_NAME}: its labels are not those of the labels file {where} "
        f"({'; '.join(said) or 'in another order'}): the file edited since the conversion, or "
        "the manifest"
    )]


def count_problems(found: manifest.Manifest, source: str, listed: dict[str, int]) -> list[str]:
    """Each split lists as many sources now as the manifest says it did, and its records are
    cut into shards as the converter cuts them."""
    return [
        f"split {split}: the manifest lists {info.listed} inputs, {source} now has "
        f"{listed.get(split, 0)}"
        for split, info in sorted(found.splits.items())
        if listed.get(split, 0) != info.listed
    ] + shard_cut_problems(found)


def shard_cut_problems(found: manifest.Manifest) -> list[str]:
    """A split's shards hold its records as the converter deals them (counts that differ by
    one at most, the larger first): the order of the records is checked against these
    lengths, which nothing else checked (a helper's forged [18, 0, 0] for [6, 6, 6] verified)."""
    said = []
    for split, info in sorted(found.splits.items()):
        lengths, records = list(info.shard_lengths), sum(info.shard_lengths)
        if lengths != shard_plan.shard_lengths(records, len(lengths)):
            said.append(f"split {split}: its shards hold {lengths} records; the converter cuts "
                        f"{records} into {len(lengths)} shards as "
                        f"{shard_plan.shard_lengths(records, len(lengths))}")  # fmt: skip
    return said


def shard_count_problems(found: manifest.Manifest, config, planned: dict[str, int]
                         ) -> list[str]:  # fmt: skip
    """Each split has as many shards as the converter makes for its records with the
    conversion's `config`: those --num_shards asks for, else as many as their bytes need
    (`planned`, split to the bytes its records read count for: `shard_plan.record_size`), in
    a multiple of 64. Without --num_shards the count went unchecked (a helper's trial); it
    still is in manifests written before 0.5 (no `shard_digests`), whose converters sized
    shards otherwise. A shard that could not be read whole is a problem of its own, and may
    show here too."""
    asked, shard_bytes = config.num_shards, config.shard_bytes
    said = []
    for split, info in sorted(found.splits.items()):
        if asked is None and not info.shard_digests:
            continue
        size = planned.get(split, 0)
        made = shard_plan.num_shards(info.num_examples, size, asked, shard_bytes)
        if len(info.shard_lengths) == made:
            continue
        why = (f"--num_shards {asked} gives {made}" if asked is not None else
               f"the converter makes {made} for {info.num_examples} records of "
               f"{size / 2**20:,.1f} MiB at most {shard_bytes / 2**20:g} MiB a shard, in a "
               f"multiple of {shard_plan.SHARD_MULTIPLE}")  # fmt: skip
        said.append(f"split {split}: {len(info.shard_lengths)} shards, where {why} (the "
                    "manifest edited, or shards added or removed?)")  # fmt: skip
    return said


def check_path(relpath: str, rows: dict[str, list[dict]], dedupe: bool) -> list[str]:
    """The rules for one relative path: its SOURCE, RECORD and REJECTED rows agree.

    A source rejected as a duplicate of another's content is checked with that other
    (`check_content`), when the conversion deduplicated.
    """
    listed, records, rejected = rows[SOURCE], rows[RECORD], rows[REJECTED]
    if len(listed) == len(records) == 1 and not rejected and "rejected" not in listed[0]:
        # The usual case, a source and its record, as the rules below judge it.
        problems: list[str] = []
        _check_record(relpath, records[0], listed[0], problems)
        return problems
    # In a fixed order: the joins deliver rows in any order (one row, the usual case, is).
    listed, records, rejected = (
        sorted(rows[kind], key=_order) if len(rows[kind]) > 1 else list(rows[kind])
        for kind in (SOURCE, RECORD, REJECTED)
    )
    problems = []
    stored = [s for s in listed if "rejected" not in s]
    refused = [s for s in listed if "rejected" in s]
    by_content = [r for r in rejected if r.get("reason") == images.DUPLICATE_CONTENT]
    if dedupe and not records and len(stored) == 1 and by_content:
        # Its content's group judges whether it is a copy `--dedupe` drops (`check_content`);
        # here, that its line is in its split. A CSV list's other listings of the same file
        # have lines of their own.
        own = _first(by_content, split=stored[0]["split"]) or by_content[0]
        if own.get("split") != stored[0]["split"]:
            problems.append(f"{relpath}: rejected in split {own.get('split')}, but listed in "
                            f"{stored[0]['split']}")  # fmt: skip
        _check_rejections(relpath, refused, [r for r in rejected if r is not own], problems)
        return problems
    if not listed:
        where = [f"shard {r['shard']}" for r in records] + ["rejected/"] * len(rejected)
        return [f"{relpath}: in {', '.join(where)} but not among the sources"]
    if len(records) > 1:
        shards = ", ".join(record["shard"] for record in records)
        problems.append(f"{relpath}: written {len(records)} times (shards {shards})")
    if records and stored:
        _check_record(relpath, records[0], stored[0], problems)
    elif records:
        reasons = ", ".join(sorted({s["rejected"] for s in refused}))
        problems.append(
            f"{relpath}: has a record, but the converter would reject it now ({reasons})"
        )
    own = None  # the stored source's line in rejected/: of a reason no other listing has
    if stored and not records:
        taken = {s["rejected"] for s in refused}
        own = next((r for r in rejected if r.get("reason") not in taken), None)
        if own is not None:
            problems.append(
                f"{relpath}: in rejected/ ({own.get('reason')}), but the converter would store "
                "it now"
            )
        else:
            problems.append(
                f"{relpath}: listed but in no shard and not in rejected/ (lost, or added to the "
                "source since)"
            )
    # A stored source's line in rejected/ was reported just above, and so was a record of a
    # source that would be rejected now (it has no rejection line to miss).
    lines = [r for r in rejected if r is not own]
    _check_rejections(relpath, refused if stored or not records else [], lines, problems)
    return problems


def _order(row: dict) -> str:
    return json.dumps(row, sort_keys=True)


def content_row(relpath: str, rows: dict[str, list[dict]]) -> tuple[str, dict] | None:
    """A source the converter would store, under its content hash, with what became of it."""
    # One file a CSV list names twice is two sources here, one of them stored.
    stored = [s for s in rows[SOURCE] if "rejected" not in s]
    if len(stored) != 1:
        return None
    became = "record" if rows[RECORD] else None
    if not became and rows[REJECTED]:
        # The stored source's own line, not a line of the file's other listings (`duplicate`).
        listings = {s["rejected"] for s in rows[SOURCE] if "rejected" in s}
        own = [r for r in rows[REJECTED] if r.get("reason") not in listings] or rows[REJECTED]
        became = min(own, key=_order).get("reason")
    return _content(relpath, stored[0], became)


def _content(relpath: str, source: dict, became: str | None) -> tuple[str, dict]:
    row = {"relpath": relpath, "split": source["split"], "label": source["label"], "became": became}
    return source["sha256"], row


def check_pair(relpath: str, source: dict, record: dict) -> tuple[list[str], tuple[str, dict]]:
    """`check_path`'s problems and `content_row` of the usual path, told apart without its
    rows sorted into kinds: one source the converter stores now ("rejected" not in it), one
    record, no line in rejected/."""
    problems: list[str] = []
    _check_record(relpath, record, source, problems)
    return problems, _content(relpath, source, "record")


def check_content(rows: Iterable[dict], reported: list[dict], found: manifest.Manifest
                  ) -> tuple[list[str], dict[str, int]]:  # fmt: skip
    """The sources with the same bytes (`content_row`s), and the lines duplicates.jsonl gives
    for those bytes (one, or none): the line the job writes for them
    (`duplicates.report_row`); with dedupe, the first by path is the one stored and the
    others are rejected.

    Returns the problems, and what the group adds to the manifest's duplicate counts
    (`duplicates.totals`: none for bytes of one input).
    """
    group = list(rows)
    # Nearly every content is one input's, with no line of its own: nothing to sort.
    if len(group) > 1:
        group.sort(key=operator.itemgetter("relpath"))
    if len(reported) > 1:
        reported = sorted(reported, key=_order)
    first_reported = reported[0]["files"][0]["relpath"] if reported else None
    problems = []
    if len(reported) > 1:
        problems.append(f"{naming.DUPLICATES_NAME}: lists the bytes of {first_reported} "
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
            problems.append(f"{naming.DUPLICATES_NAME}: lists {first_reported} and others, "
                            "which differ now")  # fmt: skip
        return problems, {}
    expected = duplicates.report_row("", [(row["relpath"], row["split"], row["label"])
                                          for row in group])  # fmt: skip
    if found.knows_duplicates or reported:  # a report is checked whole whatever its version
        listed = [row["relpath"] for row in reported[0]["files"]] if reported else None
        if listed != [row["relpath"] for row in group]:
            problems.append(
                f"{naming.DUPLICATES_NAME}: the inputs with the bytes of {group[0]['relpath']} "
                f"({len(group)}) are not listed as one group"
            )
        elif reported[0] != {**expected, "sha256": reported[0]["sha256"]}:
            problems.append(
                f"{naming.DUPLICATES_NAME}: the group of {group[0]['relpath']} gives other "
                "splits or labels than its inputs have (edited?)"
            )
    return problems, dict(duplicates.totals(expected))


def span_problems(found: manifest.Manifest, spans: Iterable[tuple[str, str, str, str, bool]]
                  ) -> list[str]:  # fmt: skip
    """The converter ranks a split's records by key and cuts the ranks into shards in order,
    so every key of a shard sorts before every key of the next one. `spans`: (split, shard
    name, first key, last key, whether its inputs are those the manifest's digest names) of
    each shard read whole. Two shards swapped or renamed keep their counts and the order
    inside them; this finds them. A digest that names other inputs, in a shard in its place,
    is the manifest's fault (a swapped shard's would say the same again)."""
    problems = []
    # The manifest's order (names stop sorting by number past 99,999 shards).
    places = {
        (split, name): place
        for split, info in found.splits.items()
        for place, name in enumerate(info.files_of(found.file_formats[0]))
    }
    by_split: dict[str, list[tuple[int, str, str, str]]] = {}
    misnamed, misplaced = [], set()
    for split, name, first, last, named in spans:
        by_split.setdefault(split, []).append((places[split, name], name, first, last))
        if not named:
            misnamed.append((split, places[split, name], name))
    for split, shards in sorted(by_split.items()):
        shards.sort()
        for (_, before, _, last), (_, after, first, _) in zip(shards, shards[1:]):
            if first <= last:
                misplaced |= {before, after}
                problems.append(
                    f"shards {before} and {after} of split {split}: records are not in the "
                    "order the converter writes them across the shards (shards swapped or "
                    "renamed?)"
                )
    problems += [
        f"shard {name}: its records are not the inputs the manifest's digest of them names "
        "(shard_digests): was the manifest edited, or the shard replaced?"
        for _, _, name in sorted(misnamed) if name not in misplaced
    ]  # fmt: skip
    return problems


def label_count_problems(found: manifest.Manifest, counted: dict[tuple[str, str], int]
                         ) -> list[str]:  # fmt: skip
    """The manifest's records of each label per split (`SplitInfo.label_counts`) are those
    the shards hold: `counted`, (split, label) to records read. A shard that could not be
    read whole is a problem of its own, and shows here too."""
    problems = []
    for split, info in found.splits.items():
        differ = [
            f"{label!r} {counted.get((split, label), 0)} (the manifest: {n})"
            for label, n in zip(found.labels, info.label_counts)
            if counted.get((split, label), 0) != n
        ]
        if differ:
            problems.append(f"split {split}: the shards read hold other records per label than "
                            f"label_counts says: {messages.some(differ, 5)} (the manifest "
                            "edited, or shards replaced?)")  # fmt: skip
    return problems


def group_count_problems(found: manifest.Manifest, counts: dict[str, int]) -> list[str]:
    """The manifest's duplicate counts are the sources' (`counts`, summed over the groups;
    where it counts them): groups, copies, and groups across splits and labels (copies and
    labels went unchecked, and `inspect` warned of what an edit made up: a helper's trial)."""
    if not found.knows_duplicates:
        return []
    differ = [f"{name} {found.duplicates[name]} (the sources: {counts.get(name, 0)})"
              for name in _DUPLICATE_COUNTS
              if name in found.duplicates and found.duplicates[name] != counts.get(name, 0)]  # fmt: skip
    if not differ:
        return []
    return [f"manifest.json's duplicate counts are not the sources': {'; '.join(differ)}"]


_DUPLICATE_COUNTS = ("groups", "copies", "cross_split_groups", "cross_label_groups")


def _check_record(relpath: str, record: dict, expected: dict, problems: list[str]) -> None:
    same = record["written"] and _record_values(record) == _record_values(expected)
    if same and record["split"] == expected["split"] and not record["record_problems"]:
        return  # byte for byte what the converter writes, in its split
    where = f"{relpath} (shard {record['shard']})"
    if record["split"] != expected["split"]:
        problems.append(f"{where}: in split {record['split']}, but listed in {expected['split']}")
    problems.extend(f"{where}: {problem}" for problem in record["record_problems"])
    if same:
        return  # byte for byte what the converter writes
    found = []
    if record["sha256"] != expected["sha256"] and record["encoded_sha256"] == expected["encoded_sha256"]:
        found.append(f"{where}: the record's source hash is not its source's, whose image it "
                     "holds (modified record)")  # fmt: skip
    elif record["sha256"] != expected["sha256"]:
        found.append(f"{relpath}: the source, or the record, changed since conversion (the "
                     "source's content hash differs from the record's)")  # fmt: skip
    elif record["encoded_sha256"] != expected["encoded_sha256"]:
        found.append(
            f"{where}: the record's image is not what the converter writes for this source "
            "(modified record)"
        )
    elif (record["height"], record["width"]) != (expected["height"], expected["width"]):
        found.append(
            f"{where}: the record says {record['height']}x{record['width']}, the converter "
            f"stores {expected['height']}x{expected['width']} (modified record)"
        )
    if record["label"] != expected["label"]:
        found.append(f"{where}: label {record['label']!r}, the source says {expected['label']!r}")
    if not found and not record["record_problems"]:
        found.append(f"{where}: the record's bytes are not what the converter writes for this "
                     "source (modified record)")  # fmt: skip
    problems.extend(found)


def _first(lines: list[dict], **values) -> dict | None:
    """The first of `lines` that holds all these values, or None."""
    return next((line for line in lines if all(line.get(k) == v for k, v in values.items())), None)


def _check_rejections(relpath, refused, rejected, problems: list[str]) -> None:
    """Each rejection the converter would make now has its line, with its reason and split."""
    lines = list(rejected)
    # First each with its own line, of its reason and split: a file a CSV list names in two
    # splits has a line in each, with the same reason. Then the rest, to say what differs.
    unmatched = []
    for expected in refused:
        line = _first(lines, reason=expected["rejected"], split=expected["split"])
        if line is None:
            unmatched.append(expected)
        else:
            lines.remove(line)
    for expected in unmatched:
        line = _first(lines, reason=expected["rejected"])
        if line is None and lines:
            line = lines[0]
            problems.append(
                f"{relpath}: rejected as {line.get('reason')}, but the converter would now say "
                f"{expected['rejected']}"
            )
        if line is None:
            problems.append(
                f"{relpath}: should be rejected ({expected['rejected']}), but is in no shard and "
                "not in rejected/ (lost, or added to the source since)"
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
