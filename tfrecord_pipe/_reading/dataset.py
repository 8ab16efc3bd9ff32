"""What a dataset path means, worked out once: its splits, shard files, counts, compression,
labels and label offset.

A path is either a dataset folder (it has manifest.json: a finished conversion) or a pattern
of shard files (`gs://b/d/train-*`). A dataset written in two formats (`--formats`) resolves
to one of them: TFRecord unless ArrayRecord is asked for (or is all there is). The reader, `inspect`, `verify` and `bench` all
start from `resolve(path)`; files are read with TensorFlow's filesystems (local, gs://).

The label offset, one policy: it is the manifest's; without a manifest it must be given, and
nothing guesses it (`label_offset`). Tools that show labels without knowing it show the
stored value, marked as such.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import os

import tensorflow as tf

from tfrecord_pipe._core import manifest as manifest_lib
from tfrecord_pipe._core import arguments, messages, naming, paths


@dataclasses.dataclass(frozen=True)
class Split:
    """Shard files read together.

    Attributes:
      name: the split's name; for a pattern's files, the name their file names give.
      files: full paths, in shard order.
      record_counts: records per file, from the manifest; None when unknown.
      missing: those of `files` the manifest lists that are not there as files (a FIFO
        named like a shard would block its reader for ever).
      digests: per file, which input each record holds (the manifest's `shard_digests`);
        empty, or "" for a file, where the manifest does not say.
    """

    name: str
    files: tuple[str, ...]
    record_counts: tuple[int, ...] | None
    missing: tuple[str, ...] = ()
    digests: tuple[str, ...] = ()

    @property
    def positions(self) -> str:
        """Which input is at each place of these files, as one digest; "" when unknown."""
        known = len(self.digests) == len(self.files)
        return manifest_lib.positions_of(self.digests) if known else ""

    @property
    def num_examples(self) -> int | None:
        return None if self.record_counts is None else sum(self.record_counts)

    def without_missing(self) -> Split:
        """This split without its missing files (and their counts)."""
        kept = [i for i, file in enumerate(self.files) if file not in self.missing]
        counts = self.record_counts
        return Split(
            self.name,
            tuple(self.files[i] for i in kept),
            None if counts is None else tuple(counts[i] for i in kept),
            digests=tuple(self.digests[i] for i in kept) if self.digests else (),
        )


@dataclasses.dataclass(frozen=True)
class Dataset:
    """A dataset folder or a file pattern, resolved.

    Attributes:
      path: as given.
      is_pattern: a file pattern (its files are what is read), not a dataset folder.
      splits: split name to Split. A folder: the manifest's splits, in its order. A pattern:
        the files it matches, grouped by the split their names give.
      compression: "" or "GZIP" (of TFRecord files).
      manifest: the folder's manifest, or the one beside a pattern's files; None if neither.
      file_format: the format of `files` (naming.FILE_FORMATS).
    """

    path: str
    is_pattern: bool
    splits: dict[str, Split]
    compression: str
    manifest: manifest_lib.Manifest | None
    file_format: str = naming.TFRECORD

    def require_tfrecord(self, reader: str) -> None:
        """Raises ValueError unless `files` are TFRecord files, which `reader` reads."""
        if self.file_format != naming.TFRECORD:
            if self.manifest is not None and naming.TFRECORD in self.manifest.file_formats:
                raise ValueError(  # a pattern of a dataset's ArrayRecord files
                    f"{self.path} matches ArrayRecord shards, and {reader} reads TFRecord: "
                    "pass the dataset folder, or a pattern of its .tfrecord files."
                )
            raise ValueError(
                f"{self.path} holds ArrayRecord shards only, and {reader} reads TFRecord. Read "
                "it with tfrecord_pipe.grain, or convert again with --formats "
                "tfrecord,array_record to have both."
            )

    @property
    def files(self) -> tuple[str, ...]:
        """Every shard file, split after split."""
        return tuple(path for split in self.splits.values() for path in split.files)

    @property
    def record_counts(self) -> tuple[int, ...] | None:
        """Records per file of `files`; None unless every count is known."""
        counts = [split.record_counts for split in self.splits.values()]
        return None if None in counts else tuple(n for split in counts for n in split)

    @property
    def labels(self) -> tuple[str, ...] | None:
        """Label texts in index order, from the manifest."""
        return self.manifest.labels if self.manifest else None

    def split(self, name: str) -> Split:
        """The split `name` of a dataset folder.

        Raises:
          ValueError: a pattern (its files are read whatever their split), or no such split.
        """
        if self.is_pattern:
            raise ValueError(
                f"split={name!r} selects a split of a dataset folder, but {self.path} is a file "
                "pattern; drop split or pass the dataset folder."
            )
        if name not in self.splits:
            raise ValueError(naming.no_such_split(self.path, name, self.splits))
        return self.splits[name]

    def everything(self) -> Split:
        """All files as one Split, in path order (what a pattern reads)."""
        counts = self.record_counts
        digests = [digest for split in self.splits.values() for digest in split.digests]
        order = sorted(range(len(self.files)), key=lambda i: self.files[i])
        return Split(
            self.path,
            tuple(self.files[i] for i in order),
            None if counts is None else tuple(counts[i] for i in order),
            digests=tuple(digests[i] for i in order) if len(digests) == len(self.files) else (),
        )


def resolve(path: str, file_format: str | None = None) -> Dataset:
    """Finds what `path` holds.

    Args:
      path: a dataset folder or a file pattern (a str or a `pathlib.Path`).
      file_format: the shard format to read (naming.FILE_FORMATS); None: TFRecord where there
        is any, else ArrayRecord.

    Raises:
      ValueError: a folder without a manifest, a pattern that matches nothing, or no shards in
        `file_format`; the message says what to pass instead.
      FileNotFoundError: a bucket that does not exist, or is not ours to read.
      ConnectionError: the storage did not answer (an outage): not a missing dataset.
    """
    path = arguments.path("path", path)
    folder = paths.folder(path)
    try:
        is_dataset = tf.io.gfile.exists(paths.join(folder, naming.MANIFEST_NAME))
    except tf.errors.OpError as err:
        raise unreachable(path, err) from err
    if is_dataset:
        found = read_manifest(folder)
        chosen = _chosen(path, found.file_formats, file_format)
        present = {name for name, kind in _children(folder) if kind == FILE}
        splits = {
            name: Split(
                name,
                tuple(paths.join(folder, file) for file in info.files_of(chosen)),
                info.shard_lengths,
                tuple(paths.join(folder, f) for f in info.files_of(chosen) if f not in present),
                info.shard_digests,
            )
            for name, info in found.splits.items()
        }
        return Dataset(path, False, splits, found.compression, found, chosen)
    if tf.io.gfile.isdir(folder) and paths.is_remote(folder):
        # Not listed (a listing of a bucket's folder pages through all it holds): every case
        # said. It said "an empty folder" of one holding a stopped conversion's files.
        raise ValueError(
            f"{path} holds no {naming.MANIFEST_NAME}: not a finished tfrecord-pipe dataset. If "
            "a conversion into it was stopped, run it again (it clears what was left); if it "
            f"holds images, convert them first; to read shards anyway, pass a file pattern "
            f"(quoted in a shell) such as '{paths.join(folder, 'train-*')}', and the label "
            "offset."
        )
    if tf.io.gfile.isdir(folder):
        children = _children(folder)
        unfinished = [name for name, kind in children
                      if kind == FOLDER and name.startswith(naming.TEMP_PREFIX)]  # fmt: skip
        if unfinished and (naming.CLAIM_NAME, FILE) in children:
            raise ValueError(
                f"{path} holds no {naming.MANIFEST_NAME} yet: a conversion may still be writing "
                f"it ({unfinished[0]}). Wait for it to finish; if it stopped, run it again."
            )
        if unfinished:
            raise ValueError(
                f"{path} holds no {naming.MANIFEST_NAME} but what a conversion into it that did "
                f"not finish left ({unfinished[0]}): run that conversion again (it clears what "
                "was left and writes the dataset), then read it."
            )
        if not children:  # it suggested a pattern of shards it does not hold
            raise ValueError(f"{path} is an empty folder: not a dataset. Convert images into "
                             f"it first (tfrecord-pipe convert SRC {path}), and read that.")  # fmt: skip
        if not any(kind == FILE and _record_file(name) for name, kind in children):
            raise ValueError(
                f"{path} is a folder without {naming.MANIFEST_NAME} or shards: not a dataset. "
                f"If it holds images, convert it first (tfrecord-pipe convert {path} OUT), and "
                "read OUT."
            )
        raise ValueError(
            f"{path} is a folder without {naming.MANIFEST_NAME}: not a finished tfrecord-pipe "
            "dataset (the converter writes it last). To read its shards anyway, pass a file "
            f"pattern (quoted in a shell) such as '{paths.join(folder, 'train-*')}', and the "
            "label offset."
        )
    matched = tuple(sorted(match(path)))
    if not matched and not paths.is_remote(path) and os.path.lexists(path):
        raise ValueError(  # a pattern's match is never one: it is no shard to open
            f"{path} is not a file (a pipe, a device, a socket, or a link to nothing). Pass a "
            f"dataset folder (with {naming.MANIFEST_NAME}), or shard files or a pattern of them."
        )
    if not matched:
        # A path of no pattern "matched no files" read as if it were there and wrong.
        said = "matched no files" if paths.has_wildcard(path) else "does not exist"
        raise ValueError(
            f"{path} {said}. Pass a dataset folder (with {naming.MANIFEST_NAME}) or a "
            "pattern of TFRecord files such as gs://bucket/dataset/train-*."
        )
    formats = {naming.file_format_of(file) for file in matched}
    chosen = _chosen(path, tuple(f for f in naming.FILE_FORMATS if f in formats), file_format)
    files = tuple(file for file in matched if naming.file_format_of(file) == chosen)
    beside = _manifest_beside(files)
    if beside is not None and (others := [f for f in files if not _record_file(paths.basename(f))]):
        folder = paths.parent(others[0])
        raise ValueError(  # manifest.json, labels.txt, ...: read as records of a split "files"
            f"{path} matched files of a dataset that are no shards "
            f"({', '.join(map(paths.basename, others[:3]))}{', ...' if len(others) > 3 else ''}): "
            f"pass the dataset folder {folder}, or a pattern of its shards alone such as "
            f"{paths.join(folder, 'train-*-of-*')}."
        )
    if pictures := [file for file in matched if naming.is_image_name(paths.basename(file))]:
        raise ValueError(  # it was read as records: "corrupted record at 0", exit 1
            f"{path} matched {messages.some([paths.basename(f) for f in pictures], 3)}: images, "
            "not shards of records. Convert their folder first (tfrecord-pipe convert IMAGES "
            "OUT), then read OUT; or give a pattern of the shards alone."
        )
    counts, digests = _listed_in(beside, files)
    grouped: dict[str, list[int]] = {}
    for index, file in enumerate(files):
        grouped.setdefault(naming.split_of(file) or "files", []).append(index)
    splits = {
        name: Split(
            name,
            tuple(files[i] for i in indices),
            None if counts is None else tuple(counts[i] for i in indices),
            digests=tuple(digests[i] for i in indices) if digests else (),
        )
        for name, indices in sorted(grouped.items(), key=lambda item: naming.split_order(item[0]))
    }
    compression = beside.compression if beside else naming.compression_of(files)
    return Dataset(path, True, splits, compression, beside, chosen)


def _chosen(path: str, there: tuple[str, ...], asked: str | None) -> str:
    """The format to read of those `there`: `asked`, or the first."""
    if asked is None:
        return there[0]
    if asked not in naming.FILE_FORMATS:
        raise ValueError(f"file_format must be one of {naming.FILE_FORMATS}, got {asked!r}")
    if asked not in there:
        raise ValueError(
            f"{path} has no {asked} shards (it has {', '.join(there)}). Convert with "
            f"--formats {','.join(sorted({*there, asked}, key=naming.FILE_FORMATS.index))} "
            "to write both."
        )
    return asked


def match(pattern: str) -> list[str]:
    """The files `pattern` names. A part of it that exists as written is taken as written
    (a folder named `set[1]`); otherwise its `*`, `?` and `[...]` match names in that folder,
    as in a shell. Works alike for local paths and gs://."""
    scheme = pattern.split("://", 1)[0] + "://" if paths.is_remote(pattern) else ""
    rest = pattern[len(scheme) :]
    parts = [part for part in rest.split("/") if part]
    if scheme:  # gs://bucket: the bucket is no pattern
        found, parts = [scheme + parts[0]], parts[1:]
    else:
        found = ["/"] if rest.startswith("/") else [""]
    for depth, part in enumerate(parts):
        last = depth == len(parts) - 1
        found = [path for folder in found for path in _matching_children(folder, part, last)]
    return found


def _matching_children(folder: str, part: str, last: bool) -> list[str]:
    """The paths in `folder` that `part` names: files if it is the path's last part, else
    folders."""
    wanted = FILE if last else FOLDER
    literal = paths.join(folder, part) if folder else part
    if not paths.has_wildcard(part) or tf.io.gfile.exists(literal):
        return [literal] if _kind(literal) == wanted else []
    return [
        paths.join(folder, name) if folder else name
        for name, kind in _children(folder)
        if kind == wanted and fnmatch.fnmatchcase(name, part)
    ]


# What a folder holds. On local disk a file is a regular file (or a link to one): a FIFO or a
# socket named like a shard, OTHER, would block whoever opened it, for ever.
FOLDER, FILE, OTHER = "folder", "file", "other"


def _record_file(name: str) -> bool:
    """Whether a file's name is that of records: a shard's, or any *.tfrecord*, *.tfrec (as
    Kaggle names them) or *.array_record file."""
    suffixes = (".tfrecord", ".tfrec", ".array_record")
    return naming.split_of(name) is not None or any(suffix in name for suffix in suffixes)


def _children(folder: str) -> list[tuple[str, str]]:
    """(name, FOLDER, FILE or OTHER) of what `folder` holds, sorted; one listing, no call
    per name."""
    if not paths.is_remote(folder):
        try:
            return sorted((child.name, _entry_kind(child)) for child in os.scandir(folder or "."))
        except OSError:
            return []
    try:  # tf.io.gfile marks the "folders" of an object store with a trailing slash
        return sorted((name.rstrip("/"), FOLDER if name.endswith("/") else FILE)
                      for name in tf.io.gfile.listdir(folder))  # fmt: skip
    except tf.errors.NotFoundError:
        return []


def _kind_of(is_dir: bool, is_file: bool) -> str:
    return FOLDER if is_dir else FILE if is_file else OTHER


def _entry_kind(child: os.DirEntry) -> str:
    """A listed entry's kind; OTHER for one that cannot be followed (a link in a loop raises
    ELOOP), which hid the whole folder's listing: every shard beside it was "missing"."""
    try:
        return _kind_of(child.is_dir(), child.is_file())
    except OSError:
        return OTHER


def _kind(path: str) -> str | None:
    """What `path` is (as `_children` says); None where nothing is."""
    if not paths.is_remote(path):
        if not os.path.lexists(path):
            return None
        return _kind_of(os.path.isdir(path), os.path.isfile(path))
    if not tf.io.gfile.exists(path):
        return None
    return FOLDER if tf.io.gfile.isdir(path) else FILE


def _manifest_beside(files) -> manifest_lib.Manifest | None:
    """The manifest of the one folder holding all of `files`, if it has one."""
    folders = {paths.parent(file) for file in files}
    if len(folders) != 1:
        return None
    folder = folders.pop()
    if not tf.io.gfile.exists(paths.join(folder, naming.MANIFEST_NAME)):
        return None
    return read_manifest(folder)


def _listed_in(found, files) -> tuple[tuple[int, ...] | None, tuple[str, ...]]:
    """The manifest's record counts of `files` (None unless it lists every one), and their
    shard digests (`manifest.ShardPositions`; "" for one it has none of): a pattern's files
    read with the counts and positions their folder's are read with."""
    if found is None:
        return None, ()
    shards = {
        name: (length, info.shard_digests[place] if info.shard_digests else "")
        for info in found.splits.values()
        for file_format in naming.FILE_FORMATS
        for place, (name, length) in enumerate(zip(info.files_of(file_format), info.shard_lengths))
    }
    listed = [shards.get(paths.basename(file)) for file in files]
    if None in listed:
        return None, ()
    return tuple(length for length, _ in listed), tuple(digest for _, digest in listed)


def label_offset(found: Dataset, given: int | None) -> int:
    """The label offset to read `found` with: THE policy, see the module docstring.

    Raises:
      ValueError: `given` disagrees with the manifest, or there is no manifest and no `given`.
    """
    if problem := label_offset_problem(given):
        raise ValueError(problem)
    if found.manifest is not None:
        if given is not None and given != found.manifest.label_offset:
            raise ValueError(
                f"label_offset={given} was passed, but the manifest of {found.path} says its "
                f"labels were written with offset {found.manifest.label_offset}. Leave "
                "label_offset unset to use the manifest's."
            )
        return found.manifest.label_offset
    if given is None:
        raise ValueError(
            f"{found.path} has no manifest.json beside it, so the label offset is unknown. "
            "Pass label_offset (--label_offset on the command line): 1 for data written by "
            "tfrecord-pipe or the Cloud TPU scripts (labels start at 1), 0 for 0-based labels."
        )
    return given


def label_offset_problem(given: int | None) -> str | None:
    """What is wrong with a given label offset, or None: stored labels are 0 or more."""
    return f"label_offset must be >= 0, got {given}" if given is not None and given < 0 else None


def label_names(path: str) -> tuple[str, ...]:
    """The label texts of a dataset, in index order: what Keras calls `class_names`.

    Raises:
      ValueError: `path` has no manifest (a bare pattern), so the names are not known.
    """
    found = resolve(path)  # (a pathlib.Path too)
    if found.labels is None:
        raise ValueError(f"{path} has no manifest.json beside it: its label names are unknown.")
    return found.labels


def read_manifest(folder: str) -> manifest_lib.Manifest:
    """The manifest of a dataset folder.

    Raises:
      FileNotFoundError: the folder has no manifest.json (not a dataset, or an unfinished one).
      ValueError: manifest.json is not a valid manifest; the message names it.
    """
    folder = arguments.path("folder", folder)
    path = paths.join(folder, naming.MANIFEST_NAME)
    if not tf.io.gfile.exists(path):
        raise manifest_lib.not_a_dataset(folder)
    with tf.io.gfile.GFile(path) as f:
        text = f.read()
    try:
        return manifest_lib.Manifest.from_file_text(text, path)
    except ValueError as err:
        raise manifest_lib.edited(err) from err.__cause__


def write_manifest(folder: str, manifest: manifest_lib.Manifest) -> None:
    """Writes labels.txt, then manifest.json into `folder` (for datasets written by hand)."""
    for name, text in manifest_lib.files_of(manifest):
        with tf.io.gfile.GFile(paths.join(folder, name), "w") as f:
            f.write(text)


# TensorFlow's errors of a storage that did not answer, by name (retries given up).
_OUTAGES = ("UnavailableError", "DeadlineExceededError", "AbortedError",
            "ResourceExhaustedError")  # fmt: skip


def unreachable(path: str, err) -> OSError:
    """The error for a storage path TensorFlow could not look at: an outage is no missing
    dataset (a caller's `except FileNotFoundError` took one for it: a helper's trial)."""
    if type(err).__name__ in _OUTAGES:
        return ConnectionError(f"Cannot reach {path}: the storage did not answer "
                               f"({err.message}). Try again once it answers.")  # fmt: skip
    return FileNotFoundError(f"Cannot reach {path}: {err.message}")
