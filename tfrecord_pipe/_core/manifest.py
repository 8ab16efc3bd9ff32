"""manifest.json and labels.txt: what a dataset folder holds, written last by the converter.

A folder with a manifest is a complete dataset: the job writes it only after every shard is
in place. This module is the files' content; the converter writes them through Beam's
filesystems (`files_of`), readers read them with TensorFlow's (`reading.dataset`).
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import os
import re
import secrets

from tfrecord_pipe._core import images, messages, naming, paths, schema, tfds_metadata

DUPLICATES_AND_TFDS_SINCE = (0, 3)  # the version that began to write both
COUNTS_PER_LABEL_SINCE = (0, 5)  # and which input each record holds (shard_digests)


DIGEST_CHARS = 16  # hex digits kept of a digest: identity, not security
_json_string = json.encoder.encode_basestring_ascii  # a str as `json.dumps` writes it
_WHOLE_NUMBER = re.compile(r"[0-9]+")  # labels that are class numbers (ASCII digits only)


class ShardPositions:
    """Which input each record of a shard holds, in order, as one digest: of each record its
    file name and label. The converter writes it into the manifest and `verify` recomputes it
    from the records. Another input or label at a place changes it; the same file edited, or
    re-encoded otherwise, does not (a position still means the same inputs)."""

    def __init__(self):
        self._hash = hashlib.sha256()

    def add(self, filename: str, label_index: int, label_text: str) -> None:
        # The line `json.dumps([filename, label_index, label_text])` writes (digests in
        # manifests already written hold it), at a seventh of its cost: every record adds one.
        quoted = _json_string
        self._hash.update(f"[{quoted(filename)}, {label_index:d}, {quoted(label_text)}]\n".encode())

    def hexdigest(self) -> str:
        return self._hash.hexdigest()[:DIGEST_CHARS]


def positions_of(shard_digests) -> str:
    """Which input is at each place of these shards, in this order, as one digest ("" when a
    digest is unknown): a training position saved on one dataset means the same records on
    another only where this is the same (a dataset converted again from other images may
    have the same counts)."""
    if not shard_digests or not all(shard_digests):
        return ""
    return hashlib.sha256(",".join(shard_digests).encode()).hexdigest()[:DIGEST_CHARS]


def split_identity(files, counts, positions: str, name: str = "") -> str:
    """Which records a split holds, in which order, as one digest: its shard names and counts,
    and which input is at each place where the manifest says ("" `positions`: unknown). A
    resumed position names it when it differs ("dataset"); Grain's states hold the split's
    `name` in it too (a split read through a pattern is named by the pattern)."""
    names = ",".join(file.rsplit("/", 1)[-1] for file in files)
    facts = f"{name}:{names}:{','.join(map(str, counts))}" + (f":{positions}" if positions else "")
    return hashlib.sha256(facts.encode()).hexdigest()[:DIGEST_CHARS]


@dataclasses.dataclass(frozen=True)
class SplitInfo:
    """One split's shards and counts.

    Attributes:
      num_examples: records written to the split's shards.
      shard_lengths: records per shard, in shard order.
      num_bytes: total bytes of the split's shard files (of every format).
      listed: inputs assigned to this split.
      rejected: inputs of this split that went to rejected/ instead (listed = examples + rejected).
      files: TFRecord shard file names, relative to the dataset folder, in shard order; empty
        when the job wrote ArrayRecord only.
      array_record_files: ArrayRecord shard file names, in shard order, when the job wrote
        them (`--formats`): the same records as `files`, shard for shard, in the same order.
      shard_digests: per shard, which input each of its records holds (`ShardPositions`);
        empty in manifests of tfrecord-pipe 0.4 and before.
      label_counts: the split's records of each label, in the manifest's label order (a
        class's share, for class weights; a label with none, for a warning); empty in
        manifests of tfrecord-pipe 0.4 and before.
      file_bytes: the size of each shard file, in `all_files` order: a local copy cut short
        (a copy that stopped) is refused before training rather than hours into it; empty
        in manifests written before this field.
    """

    num_examples: int
    shard_lengths: tuple[int, ...]
    num_bytes: int
    listed: int
    rejected: int
    files: tuple[str, ...]
    array_record_files: tuple[str, ...] = ()
    shard_digests: tuple[str, ...] = ()
    label_counts: tuple[int, ...] = ()
    file_bytes: tuple[int, ...] = ()

    @property
    def positions(self) -> str:
        """Which input is at each place of the split, as one digest (`positions_of`)."""
        return positions_of(self.shard_digests)

    def files_of(self, file_format: str) -> tuple[str, ...]:
        """This split's shard files in `file_format` (naming.FILE_FORMATS), in shard order."""
        return self.array_record_files if file_format == naming.ARRAY_RECORD else self.files

    @property
    def all_files(self) -> tuple[str, ...]:
        """Every shard file of this split, of every format."""
        return self.files + self.array_record_files

    def size_problems(self, folder: str, file_format: str | None = None) -> list[str]:
        """Each shard file (of `file_format`, or of every format) in the local `folder` whose
        size is not the one listed, said; none for a remote folder (an object is whole or
        absent), a file that is not there (said as missing elsewhere), or a manifest that
        lists no sizes."""
        if not self.file_bytes or paths.is_remote(folder):
            return []
        wanted = set(self.files_of(file_format) if file_format else self.all_files)
        problems = []
        for name, listed in zip(self.all_files, self.file_bytes):
            if name not in wanted:
                continue
            try:
                size = os.stat(os.path.join(folder, name)).st_size
            except OSError:
                continue
            if size != listed:
                problems.append(f"{os.path.join(folder, name)} holds {size:,} bytes, the "
                                f"manifest lists {listed:,}")  # fmt: skip
        return problems

    def __post_init__(self):
        for file_format in naming.FILE_FORMATS:
            files = self.files_of(file_format)
            if files and len(files) != len(self.shard_lengths):
                raise ValueError(
                    f"{len(files)} {file_format} files for {len(self.shard_lengths)} shard lengths"
                )
        if self.shard_digests and len(self.shard_digests) != len(self.shard_lengths):
            raise ValueError(
                f"{len(self.shard_digests)} shard digests for {len(self.shard_lengths)} shards"
            )
        if sum(self.shard_lengths) != self.num_examples:
            raise ValueError(
                f"shard_lengths sum to {sum(self.shard_lengths)}, num_examples is {self.num_examples}"
            )
        if not all(type(n) is int and n >= 0 for n in self.label_counts):
            raise ValueError("label_counts must be counts: ints, 0 or more")
        if self.label_counts and sum(self.label_counts) != self.num_examples:
            raise ValueError(f"label_counts do not sum to num_examples ({self.num_examples})")
        if self.file_bytes and len(self.file_bytes) != len(self.all_files):
            raise ValueError(f"{len(self.file_bytes)} file_bytes for {len(self.all_files)} files")
        if not all(type(n) is int and n >= 0 for n in self.file_bytes):
            raise ValueError("file_bytes must be sizes: ints, 0 or more")
        if self.file_bytes and sum(self.file_bytes) != self.num_bytes:
            raise ValueError(f"file_bytes do not sum to num_bytes ({self.num_bytes})")
        if self.listed != self.num_examples + self.rejected:
            raise ValueError(
                f"listed ({self.listed}) != num_examples ({self.num_examples}) + "
                f"rejected ({self.rejected}): inputs were lost"
            )


@dataclasses.dataclass(frozen=True)
class Manifest:
    """Everything a reader needs to know about a dataset folder.

    Attributes:
      labels: label texts in index order (index = label - label_offset).
      label_offset: added to each label index on write.
      compression: "" or "GZIP", as tf.data.TFRecordDataset takes it.
      splits: split name to SplitInfo.
      rejected_reasons: reason code to count, over all splits.
      conversion: the conversion's configuration (`beam_jobs.config.ConvertConfig.to_record`),
        so that `verify` can redo it. Manifests of tfrecord-pipe 0.1 recorded the command-line
        flags instead; they are read as {"flags": ...}.
      tool_version: tfrecord-pipe version that wrote the dataset.
      format_version: the record format's version (schema.FORMAT_VERSION).
      duplicates: inputs with the same bytes, counted: "groups" (of more than one input),
        "copies" (inputs beyond each group's first), "cross_split_groups",
        "cross_label_groups"; empty when there are none. The groups are in duplicates.jsonl.
    """

    labels: tuple[str, ...]
    label_offset: int
    compression: str
    splits: dict[str, SplitInfo]
    rejected_reasons: dict[str, int] = dataclasses.field(default_factory=dict)
    conversion: dict = dataclasses.field(default_factory=dict)
    tool_version: str = ""
    format_version: int = schema.FORMAT_VERSION
    duplicates: dict[str, int] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        # What every reader relies on, which no converter writes otherwise: an edit says so
        # here, not as a TypeError or a wrong label deep in a reader.
        offset = self.label_offset
        if type(offset) is not int or not 0 <= offset <= schema.MAX_LABEL_OFFSET:
            raise ValueError(f"label_offset must be an int in 0..{schema.MAX_LABEL_OFFSET}, "
                             f"got {offset!r}")  # fmt: skip
        if repeated := repeated_labels(self.labels):
            raise ValueError(f"labels lists these more than once: {repeated}")
        # Names that become paths: readers open them, and --overwrite deletes them.
        for split, info in self.splits.items():
            if problem := naming.manifest_split_problem(split, info.all_files):
                raise ValueError(problem)
            if info.label_counts and len(info.label_counts) != len(self.labels):
                raise ValueError(f"split {split}: {len(info.label_counts)} label_counts for "
                                 f"{len(self.labels)} labels")  # fmt: skip
        if len({bool(info.label_counts) for info in self.splits.values()}) > 1:
            raise ValueError("label_counts in some splits and not others: a converter writes "
                             "them for every split or for none")  # fmt: skip
        # The version decides how verify judges a dataset: an older one, with what it did not
        # write, would have its newer facts go unchecked.
        splits = self.splits.values()
        held = {
            "duplicates": (bool(self.duplicates), DUPLICATES_AND_TFDS_SINCE),
            "label_counts": (any(i.label_counts for i in splits), COUNTS_PER_LABEL_SINCE),
            "shard_digests": (any(i.shard_digests for i in splits), COUNTS_PER_LABEL_SINCE),
            "file_bytes": (any(i.file_bytes for i in splits), COUNTS_PER_LABEL_SINCE),
        }
        newer = [name for name, (holds, since) in held.items()
                 if holds and not self.written_since(since)]  # fmt: skip
        if newer:
            raise ValueError(f"it holds {', '.join(newer)}, which the tfrecord-pipe it names "
                             f"(tool_version {self.tool_version!r}) does not write")  # fmt: skip

    @property
    def file_formats(self) -> tuple[str, ...]:
        """The formats of the shards, in naming.FILE_FORMATS order. A dataset with no shard
        at all gives the formats its conversion asked for."""
        written = {f for info in self.splits.values() for f in naming.FILE_FORMATS
                   if info.files_of(f)}  # fmt: skip
        if not written:
            written = set(self.conversion.get("formats", [naming.TFRECORD]))
        return tuple(f for f in naming.FILE_FORMATS if f in written)

    @property
    def num_rejected(self) -> int:
        return sum(info.rejected for info in self.splits.values())

    def written_since(self, version: tuple[int, int]) -> bool:
        """Whether a tfrecord-pipe of `version` (major, minor) or later wrote the dataset."""
        numbers = re.findall(r"\d+", self.tool_version)[:2]
        return tuple(int(n) for n in numbers) >= version

    @property
    def knows_duplicates(self) -> bool:
        """Whether the duplicates were counted: since 0.3, which also writes TFDS's metadata."""
        return self.written_since(DUPLICATES_AND_TFDS_SINCE)

    @property
    def duplicates_found(self) -> bool:
        """Whether the conversion found inputs with the same bytes (and counted them)."""
        return self.knows_duplicates and bool(self.duplicates.get("groups"))

    def duplicates_line(self) -> str:
        """What a person should know of the duplicates, in one line."""
        if not self.knows_duplicates:
            return f"not counted (written by tfrecord-pipe {self.tool_version or 'before 0.3'})"
        if not self.duplicates.get("groups"):
            return "none (no two inputs had the same bytes)"
        d = self.duplicates
        deduped = bool(self.conversion.get("dedupe"))
        text = (
            f"{d['groups']} picture(s) found under more than one name ({d['copies']} extra "
            f"copies; {d['cross_split_groups']} across splits, {d['cross_label_groups']} across "
            f"labels): {naming.DUPLICATES_NAME}"
        )
        if deduped:
            return text + "; --dedupe kept the first of each, the others are in rejected/"
        if d["cross_split_groups"]:
            text += ". Scores on one split count pictures the model trained on in another"
        return text + ". --dedupe keeps the first of each"

    def warnings(self, folder: str) -> list[str]:
        """What a person should look at in the dataset in `folder`: the launcher prints them
        after its summary, a job that finalises with nobody waiting (Dataflow's `--no_wait`,
        a template) logs them, and `inspect` shows them."""
        said = [self.duplicates_line()] if self.duplicates_found else []
        if alike := naming.look_alike(self.labels):
            said.append(
                f"labels that print alike are separate classes ({alike}): named in another "
                "case or Unicode form, or with invisible characters. Merge them if they are one "
                "class"
            )
        said += self._label_set_warnings()
        listed_again = self.rejected_reasons.get(images.DUPLICATE, 0)
        if self.conversion.get("layout") == "csv" and listed_again:
            said.append(
                f"{listed_again} line(s) of the CSV list name a file another line names "
                f"(rejected as {images.DUPLICATE}, in {naming.REJECTED_DIR}/): each file is "
                "stored once, with the label and split of one line. A list giving an image "
                "several labels (multi-label) keeps one of them, and a label only such lines "
                "give is no class. Keep one line per file"
            )
        for name, info in self.splits.items():
            if info.listed and not info.num_examples:
                inputs = f"all {info.listed} of its inputs were" if info.listed > 1 else (
                    "its one input was")  # fmt: skip
                said.append(f"split {name} has no record: {inputs} rejected; why is in "
                            f"{paths.join(folder, naming.rejected_name(name))}")  # fmt: skip
        return said + self._label_warnings() + self._unmeasured_labels()

    def _records_per_label(self) -> list[int] | None:
        """Records of each label in every split together; None where the manifest does not
        count them (before 0.5)."""
        counts = [info.label_counts for info in self.splits.values()]
        if not counts or any(len(each) != len(self.labels) for each in counts):
            return None
        return [sum(each) for each in zip(*counts)]

    def _label_set_warnings(self) -> list[str]:
        """What to say of labels that are numbers put in the order of their text (`10`
        before `2`: a CSV of class numbers), of one label holding every record (a folder of
        images given where a folder of label folders was meant), of every label holding one
        (a column of ids taken for labels), of labels named like splits (split folders read
        as labels), of splits named like validation beside it (a CSV list's `val` and
        `validation`), and of no split named train (the split the reader reads by default)."""
        said, labels = [], self.labels
        by_text = not self.conversion.get("labels_file")
        if by_text and len(labels) > 1 and all(_WHOLE_NUMBER.fullmatch(label) for label in labels):
            by_number = sorted(labels, key=int)
            if by_number != list(labels):
                first = next(a for a, b in zip(labels, by_number) if a != b)
                said.append(
                    f"labels are numbers, put in the order of their text "
                    f"({messages.some(labels, 6, repr)}): label {first!r} has index "
                    f"{labels.index(first)}, not its number's place. For indices in the "
                    "numbers' order, give --labels_file listing them in that order"
                )
        counts = self._records_per_label()
        holding = [label for label, n in zip(labels, counts) if n] if counts else list(labels)
        held = [n for n in counts if n] if counts else []
        if len(holding) == 1:  # (a `__MACOSX` beside it holds none)
            said.append(
                f"one label ({holding[0]!r}) holds every record: every record is of that one "
                "class. Label folders (SRC/cat/1.jpg, SRC/dog/2.jpg) or a CSV list's label "
                "column give a class each"
            )
        if len(held) >= 10 and max(held) == 1:
            some = messages.some(labels, 3, repr)
            said.append(f"every label holds one record ({len(held)} labels: {some}): a column "
                        "of ids, file names or boxes read as the labels?")  # fmt: skip
        if alike_splits := sorted(set(labels) & naming.SPLIT_LIKE):
            said.append(
                f"labels named like splits ({', '.join(map(repr, alike_splits))}): a folder of "
                "split folders read with --layout labels? Each is a class now"
            )
        others = sorted(set(self.splits) & naming.VALIDATION_LIKE)
        if naming.VALIDATION in self.splits and others:
            said.append(
                f"splits {', '.join(map(repr, others))} and {naming.VALIDATION!r} are separate "
                f"splits: evaluation reads {naming.VALIDATION!r} unless given split=. If they "
                "are one split, name it one way (a CSV list's split column, or one folder)"
            )
        if self.splits and naming.TRAIN not in self.splits:
            said.append(
                f"no split named {naming.TRAIN} (the splits: {', '.join(self.splits)}): the "
                f"reader reads {naming.TRAIN} when training unless given split="
            )
        for split, meant in self._misspelt_splits():
            said.append(
                f"split {split!r} is named like {meant} but is not it: a reader asked for "
                f"{meant} will not find it. If {meant} was meant, fix the name (a CSV list's "
                "split column, or a split folder's) and convert again"
            )
        return said

    def _misspelt_splits(self) -> list[tuple[str, str]]:
        """(split, the usual name it is close to) for a split named like train, validation or
        test but none of them (a CSV's `validaton`, a helper's trial: it surfaced only when
        the reader found no validation split); not one that adds to the name (`test2`,
        `train_a`, Kaggle's `test1`: a split of its own)."""
        import difflib  # only for a split of another name

        usual = (naming.TRAIN, naming.VALIDATION, naming.TEST)
        said = []
        for split in sorted(set(self.splits) - naming.SPLIT_LIKE):
            name = split.lower()
            close = difflib.get_close_matches(name, usual, n=1, cutoff=0.8)
            if close and not (name != close[0] and name.startswith(close[0])):
                said.append((split, close[0]))
        return said

    def _label_warnings(self) -> list[str]:
        """What to say of labels that no record holds, or none of train: labels come from the
        inputs listed, so a folder whose every input was rejected (`__MACOSX`, `.git`) or a
        CSV line's misspelt label is a class of its own, and shifts the indices of those after
        it. Nothing where a labels file gave the labels asked for, or no counts were kept
        (before 0.5)."""
        per_label = self._records_per_label()
        if self.conversion.get("labels_file") or not per_label:
            return []
        anywhere = {label for label, n in zip(self.labels, per_label) if n}
        train = self.splits[naming.TRAIN].label_counts if naming.TRAIN in self.splits else ()
        in_train = {label for label, n in zip(self.labels, train) if n}
        said = []
        if nowhere := [label for label in self.labels if label not in anywhere]:
            said.append(
                "labels with no record (every input of theirs was rejected): "
                f"{messages.some(nowhere, 10, ascii)}. "
                "Each is still a class and takes an index, shifting the labels after it: remove "
                "those folders or lines and convert again, or give --labels_file."
            )
        untrained = [label for label in self.labels if label in anywhere and label not in in_train]
        if in_train and untrained:
            said.append(f"labels with no record in split {naming.TRAIN}, only in others: "
                        f"{messages.some(untrained, 10, ascii)}. A model trained on it never "
                        "sees them.")  # fmt: skip
        return said

    def _unmeasured_labels(self) -> list[str]:
        """What to say of labels train holds and a split that evaluation reads does not
        (validation, or a split folder's `val`, `test`): whoever named the labels, a model
        is never measured on them there."""
        train = self.splits.get(naming.TRAIN)
        if not train:
            return []
        said = []
        for name, held in self.splits.items():
            if name == naming.TRAIN or not any(held.label_counts):
                continue
            unmeasured = [label for label, taught, there
                          in zip(self.labels, train.label_counts, held.label_counts)
                          if taught and not there]  # fmt: skip
            if not unmeasured:
                continue
            who = "Evaluation, which reads it," if name == naming.VALIDATION else (
                "An evaluation of it")  # fmt: skip
            more = "a larger --validation_fraction, or " if name == naming.VALIDATION else ""
            said.append(f"labels with no record in split {name}: "
                        f"{messages.some(unmeasured, 10, ascii)}. {who} never measures them: "
                        f"give it images of them ({more}files in their {name} folders or "
                        "lines).")  # fmt: skip
        return said

    def to_json(self) -> str:
        data = dataclasses.asdict(self)
        # Optional fields left out where empty, as 0.4.0 wrote its manifests (0.4.0 reads none
        # with shard_digests: CHANGELOG.md).
        # A split's label_counts (and file sizes) on one line, not one number a line: 20,000
        # lines at 20,000 labels. Put in place of a token no name can hold by chance.
        token, one_line = secrets.token_hex(16), {}
        for split, info in data["splits"].items():
            for optional in ("array_record_files", "shard_digests", "label_counts", "file_bytes"):
                if not info[optional]:
                    del info[optional]
            for numbers in ("label_counts", "file_bytes"):
                if info.get(numbers):
                    one_line[f"{token}-{numbers}-{split}"] = json.dumps(info[numbers])
                    info[numbers] = f"{token}-{numbers}-{split}"
        text = json.dumps(data, indent=2, sort_keys=True) + "\n"
        for placeholder, counts in one_line.items():
            text = text.replace(json.dumps(placeholder), counts, 1)
        return text

    @classmethod
    def from_file_text(cls, text: str, path: str) -> "Manifest":
        """The manifest in `text`, read from `path`.

        Raises:
          ValueError: it is not a valid manifest; the message names the file.
        """
        try:
            return cls.from_json(text)
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            raise ValueError(f"{path} is not a valid tfrecord-pipe manifest ({_why(err, text)})"
                             ) from err  # fmt: skip

    @classmethod
    def from_json(cls, text: str) -> "Manifest":
        data = json.loads(text)
        if "options" in data:  # 0.1: the command-line flags, not the configuration
            data["conversion"] = {"flags": data.pop("options")}
        data["labels"] = tuple(data["labels"])
        data["splits"] = {  # in split order (train, validation, test, ...), as written
            name: _split_info(name, info)
            for name, info in sorted(data["splits"].items(), key=lambda kv: naming.split_order(kv[0]))
        }
        return cls(**data)


def _why(err: Exception, text: str) -> str:
    """Why a manifest's text is none, in words: not JSON, not an object, a field missing."""
    if isinstance(err, json.JSONDecodeError):
        return f"not JSON: {err.msg} at line {err.lineno}, column {err.colno}"
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if not isinstance(data, dict):
        kind = {list: "list", str: "string", bool: "true or false", type(None): "null"}.get(
            type(data), "number")  # fmt: skip
        return f"a JSON {kind}, not an object of fields"
    if isinstance(err, KeyError) and len(err.args) == 1:
        return f"no {err.args[0]!r} field"
    if type(err) is ValueError:  # ours, in words already ("split train: ...")
        return str(err)
    return f"{type(err).__name__}: {err}"


def _split_info(name: str, info: dict) -> SplitInfo:
    """A split's entry of a manifest's JSON; a problem in it names the split."""
    try:
        return SplitInfo(
            **{
                **info,
                "shard_lengths": tuple(info["shard_lengths"]),
                "files": tuple(info["files"]),
                "array_record_files": tuple(info.get("array_record_files", ())),
                "shard_digests": tuple(info.get("shard_digests", ())),
                "label_counts": tuple(info.get("label_counts", ())),
                "file_bytes": tuple(info.get("file_bytes", ())),
            }
        )
    except KeyError as err:
        raise ValueError(f"split {name}: no {err.args[0]!r} field") from None
    except (ValueError, TypeError) as err:
        raise ValueError(f"split {name}: {err}") from None


def sizes_said(cut: list[str], shards: str) -> str:
    """What to say of `shards` whose sizes are not listed ones (`SplitInfo.size_problems`)."""
    return (f"{len(cut)} {shards} are not the size the manifest lists: {cut[0]}. Cut short, or "
            "changed since the conversion (a copy that stopped?): copy them again, or convert "
            "again")  # fmt: skip


def not_a_dataset(folder: str) -> FileNotFoundError:
    """The error for a folder without a manifest (every reader of datasets says the same)."""
    if "*" in folder:  # a pattern of shards, where a dataset folder is needed
        return FileNotFoundError(
            f"{folder} is a pattern of files: give the dataset folder, the one holding "
            f"{naming.MANIFEST_NAME} (the manifest says what every shard should hold)."
        )
    if not paths.is_remote(folder) and os.path.isfile(folder):  # ("afile/manifest.json")
        return FileNotFoundError(f"{folder} is a file: give the dataset folder, the one "
                                 f"holding {naming.MANIFEST_NAME}.")  # fmt: skip
    return FileNotFoundError(
        f"{paths.join(folder, naming.MANIFEST_NAME)} not found: {folder} is not a "
        f"finished tfrecord-pipe dataset (the converter writes {naming.MANIFEST_NAME} last)."
    )


def edited(err: ValueError) -> ValueError:
    """A manifest that does not parse, said with what to do."""
    return ValueError(f"{err}. Was it edited, or written by another tool? Convert the images again.")


def files_of(manifest: Manifest) -> list[tuple[str, str]]:
    """(name, text) of the files that describe a dataset, in writing order: labels.txt, the
    metadata TensorFlow Datasets reads (`tfds_metadata`), manifest.json last, as its presence
    means the dataset is complete."""
    labels = "".join(label + "\n" for label in manifest.labels)
    return [
        (naming.LABELS_NAME, labels),
        *tfds_metadata.files(manifest),
        (naming.MANIFEST_NAME, manifest.to_json()),
    ]


def files_beside(manifest: Manifest) -> list[tuple[str, str]]:
    """`files_of` that a dataset of `manifest` holds beside it: but the manifest itself, and
    TensorFlow Datasets' metadata where the dataset was written before that was
    (`knows_duplicates`)."""
    older = not manifest.knows_duplicates
    return [(name, text) for name, text in files_of(manifest)
            if name != naming.MANIFEST_NAME and not (older and name in tfds_metadata.FILES)]  # fmt: skip


def repeated_labels(labels: tuple[str, ...]) -> list[str]:
    """The labels listed more than once, sorted (in time linear in the list: 21,000 labels)."""
    return sorted(label for label, count in collections.Counter(labels).items() if count > 1)


def parse_labels(text: str, path: str) -> tuple[str, ...]:
    """The labels of a labels file's text: one per line, in index order; blanks ignored.

    Raises:
      ValueError: a label appears twice, or none is listed (`path` names the file).
    """
    labels = tuple(line.strip() for line in text.splitlines() if line.strip())
    if duplicates := repeated_labels(labels):
        raise ValueError(f"{path} lists these labels more than once: {duplicates}. List each "
                         "label once, one a line, in the order of their indices.")  # fmt: skip
    if not labels:
        raise ValueError(f"{path} lists no labels")
    return labels
