"""The inputs: folders (labels from sub-folders), split folders, or CSV lists.

`list_sources` gives every input the conversion job reads, in plain Python: `verify` lists
with it, and the job's `ListSources` runs the same functions inside the pipeline (so no list
of every path is ever built on the launching machine or embedded in the job graph). Every
input listed comes out: one that cannot be used carries its problem, and the job rejects it
with that reason.

Rules a user can rely on (docs/conversion.md, "What we guarantee"):
- Layout: `auto` takes a folder as split folders only when every folder in it is named
  train, validation or test (and no file lies beside them); as label folders when none is;
  anything in between is refused with what to pass.
- CSV: the first line, and only it, may be a header (`--csv_header`, default auto: it is one
  when its path cell is a plain name, no "/" or ".", that names no existing file). A UTF-8 BOM
  is ignored. Paths are normalised (`./a.jpg`, `x/../a.jpg`, `imgs//a.jpg` and the absolute
  path are one file, local symlinks resolved); a file listed twice is kept once, the other
  lines rejected as duplicates.
"""

from __future__ import annotations

import codecs
import csv
import dataclasses
import hashlib
import itertools
import operator
import os
import posixpath
import re
from collections.abc import Iterable, Iterator

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics

import beam_jobs
from beam_jobs import listing, spill, storage
from beam_jobs.config import ConvertConfig
from tfrecord_pipe._core import images, naming, paths
from tfrecord_pipe._core.rejection import Rejection


@dataclasses.dataclass(frozen=True)
class SourceFile:
    """One listed input.

    Attributes:
      path: where to read it (local path or URL), normalised.
      relpath: its path relative to the input root: the record's filename and sort key.
      label: the label text, or None when the input gave none.
      split: the split it belongs to.
      problem: (reason code, detail) when listing found it cannot be an input; None if fine.
    """

    path: str
    relpath: str
    label: str | None
    split: str
    problem: tuple[str, str] | None = None


def resolve_layout(config: ConvertConfig) -> ConvertConfig:
    """Checks that the source exists; fills in layout="auto" and csv_header="auto".

    Raises:
      FileNotFoundError: no such CSV file, or no file under the folder; says what is expected.
      ValueError: a folder whose layout is ambiguous; says what to pass.
    """
    is_csv = config.layout == "auto" and config.source.lower().endswith(".csv")
    if config.layout == "csv" or is_csv:
        if not FileSystems.exists(config.source):
            raise FileNotFoundError(f"CSV list {config.source} does not exist.")
        # Read whole here, once, streaming: a bad byte is found before the job starts.
        lines = (line for _, line in csv_lines(config.source))
        first = next(lines, "")
        header = config.csv_header
        if header == "auto":
            header = "yes" if _is_a_header(first, config.source) else "no"
        data_lines = sum(1 for line in lines if any(_cells(line)))
        data_lines += header == "no" and any(_cells(first))
        if not data_lines:
            raise ValueError(
                f"CSV list {config.source} lists no inputs (it is empty, blank, or only a "
                "header). Give lines `path,label[,split]`."
            )
        return dataclasses.replace(config, layout="csv", csv_header=header)
    root = config.source_root
    try:
        folders, files = storage.children(root)
    except NotADirectoryError as err:
        wanted = "a folder of images, or a CSV list (*.csv)"
        if config.layout != "auto":
            wanted = f"a source of the {config.layout} layout (a folder)"
        raise ValueError(f"{err}: give {wanted}.") from err
    has_files = bool(files)
    if not folders and not has_files:
        raise FileNotFoundError(
            f"No files found under {root}. Give a folder whose sub-folders are labels "
            "(SRC/daisy/1.jpg), a folder of split folders (SRC/train/daisy/1.jpg), or a CSV file."
        )
    if config.layout != "auto":
        return config
    splits = sorted(folders & set(naming.SPLIT_ORDER))
    if not splits:
        return dataclasses.replace(config, layout="labels")
    if folders <= set(naming.SPLIT_ORDER) and not has_files:
        return dataclasses.replace(config, layout="splits")
    others = sorted(folders - set(naming.SPLIT_ORDER))[:5] + (["files"] if has_files else [])
    raise ValueError(
        f"{root} holds folders named like splits ({', '.join(splits)}) beside other things "
        f"({', '.join(others)}): is {splits[0]!r} a label or a split? Pass --layout labels "
        "(every folder is a label) or --layout splits (SRC/<split>/<label>/...)."
    )


def list_sources(config: ConvertConfig) -> Iterator[SourceFile]:
    """Every input of a resolved config (layout and csv_header decided), in plain Python."""
    if config.layout == "csv":
        for number, line in csv_lines(config.source):
            if number > 1 or config.csv_header != "yes":
                yield from sources_of_csv_line(line, config)
        return
    for entry in listing.walk(config.source_root):
        yield source_of_entry(entry, config)


def split_by_hash(relpath: str, validation_fraction: float) -> str:
    """naming.TRAIN or naming.VALIDATION, from a stable hash of the relative path."""
    if validation_fraction <= 0:
        return naming.TRAIN
    value = int(hashlib.sha256(relpath.encode("utf-8")).hexdigest()[:16], 16) / 16**16
    return naming.VALIDATION if value < validation_fraction else naming.TRAIN


def source_of_entry(entry: listing.Entry, config: ConvertConfig) -> SourceFile:
    """Label (and split) of a listed file, from the folders between the root and it.

    Raises:
      ValueError: with split folders, a file outside them or a split folder's name that
        cannot name shard files; a label folder's name that cannot be a line of labels.txt
        (the job stops at listing, before loading anything).
    """
    parts = entry.relpath.split("/")
    if config.layout == "splits":
        root = config.source_root
        if len(parts) < 2:
            raise ValueError(
                f"{entry.path} is not inside a split folder, but {root} holds split folders "
                f"({root}/train/<label>/...): move it into one, or out of {root}."
            )
        split = parts[0]
        _check_split_name(split, f"{root}: split folder", "rename the folder")
        label = parts[1] if len(parts) >= 3 else None
    else:
        label = parts[0] if len(parts) >= 2 else None
        split = split_by_hash(entry.relpath, config.validation_fraction)
    if not _is_utf8(entry.relpath):
        return _not_utf8(entry, label, split)
    _check_label(label, f"{entry.path}: its", "rename the folder")
    return SourceFile(entry.path, entry.relpath, label, split, entry.problem)


def _is_utf8(text: str) -> bool:
    """Whether a name Python read from the filesystem was valid UTF-8 (else it holds
    surrogate escapes, which no record, manifest or Beam coder can carry)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _escaped(text: str) -> str:
    """A name's bytes, undecodable ones written as \\xNN: `caf\\xe9.jpg`."""
    return os.fsencode(text).decode("utf-8", "backslashreplace")


def _not_utf8(entry: listing.Entry, label: str | None, split: str) -> SourceFile:
    """A file whose name is not UTF-8 (common in old archives): one rejection, named with its
    bytes escaped, never the end of the job."""
    relpath = _escaped(entry.relpath)
    return SourceFile(
        _escaped(entry.path), relpath, label and _escaped(label), split,
        (images.UNREADABLE, f"its name is not valid UTF-8 ({relpath}): rename it"),
    )  # fmt: skip


_PLAIN_NAME = re.compile(r"[\w -]+")
_LINE_END = re.compile(rb"\r\n|\r|\n")


def csv_lines(csv_path: str) -> Iterator[tuple[int, str]]:
    """(line number, text without its line end) of a CSV list, read as UTF-8 (a BOM ignored);
    lines may end in \\r\\n, \\n or \\r alone (old Mac spreadsheets).

    Raises:
      ValueError: not a regular file (a FIFO or /dev/zero would never end), a line over
        MAX_CSV_LINE_BYTES, text that is not UTF-8, or a NUL byte (a binary file or UTF-16);
        names the file and the line, and says what to do.
    """
    save_as = "Save it as UTF-8 text (spreadsheets: \"CSV UTF-8\")."
    if not paths.is_remote(csv_path) and not os.path.isfile(csv_path):
        raise ValueError(f"CSV list {csv_path} is not a regular file (a pipe or a device?).")
    with FileSystems.open(csv_path) as f:
        for number, raw in enumerate(_raw_lines(f, csv_path), start=1):
            if number == 1 and raw.startswith(codecs.BOM_UTF8):
                raw = raw[len(codecs.BOM_UTF8) :]
            if number == 1 and raw.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
                raise ValueError(f"CSV list {csv_path} is UTF-16 text, not UTF-8. {save_as}")
            if b"\0" in raw:
                raise ValueError(
                    f"CSV list {csv_path} line {number} holds a NUL byte: it is a binary file "
                    f"or UTF-16 text, not a UTF-8 CSV. {save_as}"
                )
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise ValueError(
                    f"CSV list {csv_path} line {number} is not UTF-8 text (byte "
                    f"{err.start + 1}: {err.reason}). {save_as}"
                ) from None
            yield number, text


MAX_CSV_LINE_BYTES = 1 << 16  # a path and a label; far more is no CSV list
_BLOCK_BYTES = 1 << 20


def _raw_lines(f, csv_path: str) -> Iterator[bytes]:
    """The lines of a binary file, read a block at a time, without their ends."""
    rest = b""
    while block := f.read(_BLOCK_BYTES):
        data = rest + block
        held = b"\r" if data.endswith(b"\r") else b""  # maybe the first half of \r\n
        *lines, rest = _LINE_END.split(data[: len(data) - len(held)])
        yield from lines
        rest += held
        if len(rest) > MAX_CSV_LINE_BYTES:
            raise ValueError(
                f"CSV list {csv_path} has a line over {MAX_CSV_LINE_BYTES} bytes: it is not a "
                "list of `path,label[,split]` lines."
            )
    if rest.rstrip(b"\r"):
        yield rest.rstrip(b"\r")


def _is_a_header(first: str, csv_path: str) -> bool:
    """The auto rule: a header's path cell is a plain name that names no existing file."""
    cells = _cells(first)
    if not cells or not cells[0] or not _PLAIN_NAME.fullmatch(cells[0]):
        return False
    return not FileSystems.exists(_resolved(cells[0], csv_path)[0])


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in next(csv.reader([line]), [])]  # csv_lines took the BOM


def sources_of_csv_line(line: str, config: ConvertConfig) -> list[SourceFile]:
    """The input of a data line `path,label[,split]`; none for a blank line.

    A line without a path comes out with its problem, so that it is rejected, not dropped.

    Raises:
      ValueError: a split that cannot name shard files, or a label that cannot be a line of
        labels.txt (the job stops at listing).
    """
    cells = _cells(line)
    if not any(cells):
        return []
    path, relpath = _resolved(cells[0], config.source) if cells[0] else ("", line)
    label = cells[1] if len(cells) > 1 and cells[1] else None
    split = cells[2] if len(cells) > 2 and cells[2] else None
    if split is None:
        split = split_by_hash(relpath, config.validation_fraction)
    _check_split_name(split, f"{config.source}: line {line!r}: split", "change it")
    _check_label(label, f"{config.source}: line {line!r}: its", "write it without them")
    problem = None if cells[0] else (images.UNREADABLE, f"the line has no path: {line!r}")
    return [SourceFile(path, relpath, label, split, problem)]


def _resolved(path: str, csv_path: str) -> tuple[str, str]:
    """(full path, path relative to the CSV's folder) of a CSV cell, normalised: `./a.jpg`,
    `x/../a.jpg`, `imgs//..//a.jpg` and the absolute path are one `a.jpg`. A path outside the
    CSV's folder keeps its whole path, without the scheme, as its relative path."""
    base = posixpath.dirname(csv_path)
    if not paths.is_remote(path) and not path.startswith("/"):
        path = posixpath.join(base, path) if base else path
    full, folder = _normalised(path), _normalised(base)
    if full.startswith(folder.rstrip("/") + "/"):
        return full, full[len(folder.rstrip("/")) + 1 :]
    return full, full.split("://", 1)[-1].lstrip("/")


def _normalised(path: str) -> str:
    """One spelling of a path: without ".", ".." and doubled slashes; local paths absolute."""
    if paths.is_remote(path):
        scheme, rest = path.split("://", 1)
        return f"{scheme}://{posixpath.normpath(rest)}"
    return os.path.abspath(path)


def identity(source: SourceFile) -> str:
    """What makes two listings the same file: the real path of a local file, else the path."""
    if paths.is_remote(source.path) or not source.path:
        return source.path or source.relpath
    return os.path.realpath(source.path)


def _check_split_name(split: str, where: str, fix: str) -> None:
    """Raises ValueError unless `split` can be part of shard file names."""
    problem = naming.split_name_problem(split)
    if problem:
        raise ValueError(f"{where} {problem}; {fix}.")


def _check_label(label: str | None, where: str, fix: str) -> None:
    """Raises ValueError unless `label` can be a line of labels.txt (the job stops at
    listing, before loading anything)."""
    problem = label and naming.label_problem(label)
    if problem:
        raise ValueError(f"{where} {problem}; {fix}.")


class ListSources(beam.PTransform):
    """The inputs of a resolved config, listed on a worker by `list_sources`, the function
    `verify` lists with: a folder walked (`listing.walk`), or a CSV's lines read in order.

    The listing comes out of one step that runners cannot split: spread it (`Spread`) before
    any per-image work, or one worker thread would load every image (on Dataflow too).
    """

    def __init__(self, config: ConvertConfig):
        super().__init__()
        self._config = config

    def expand(self, pbegin):
        config = self._config
        return (
            pbegin
            | "Start" >> beam.Create([config.source])
            | "Walk" >> beam.FlatMap(lambda _: list_sources(config))
        )


def rejection(source: SourceFile, reason: str, detail: str) -> Rejection:
    """A dead-letter line: what a user needs to find and fix the input."""
    return Rejection(source.path, source.relpath, source.split, reason, detail)


def one_per_file(listings: list[SourceFile]) -> tuple[SourceFile, list[SourceFile]]:
    """The listing of a file that is kept, and the others, each with its DUPLICATE problem.

    Which one is kept must not depend on the order the listings come in: the smallest by
    (split, label, relpath) is kept, so re-runs write the same records.
    """
    ordered = sorted(listings, key=lambda s: (s.split, s.label or "", s.relpath))
    kept = ordered[0]
    detail = (
        f"the same file as {kept.relpath} is listed {len(ordered)} times; kept the listing "
        f"{kept.relpath!r} with label {kept.label!r} in split {kept.split!r}. Remove the extra "
        "lines."
    )
    return kept, [dataclasses.replace(s, problem=(images.DUPLICATE, detail)) for s in ordered[1:]]


def kept_once(listed: Iterable[SourceFile], spill_dir: str) -> Iterator[SourceFile]:
    """Every listing, each file's kept one (`one_per_file`) then its others marked as
    duplicates; grouped through a sort on local disk in `spill_dir`, so memory stays flat
    however long the list (the local engine and `verify`; Beam groups with
    `DropDuplicatePaths`)."""
    by_file = spill.SortedSpill(spill_dir, key=operator.itemgetter(0))
    for source in listed:
        by_file.add((identity(source), source))
    for _, same in itertools.groupby(by_file.sorted(), key=operator.itemgetter(0)):
        kept, others = one_per_file([source for _, source in same])
        yield kept
        yield from others


def _keep_one_per_file(identity_and_sources):
    """The kept listing, and the others as rejections (DropDuplicatePaths.REJECTED)."""
    kept, duplicates = one_per_file(list(identity_and_sources[1]))
    yield kept
    for duplicate in duplicates:
        Metrics.counter(beam_jobs.METRICS_NAMESPACE, "inputs_duplicate").inc()
        yield beam.pvalue.TaggedOutput(
            DropDuplicatePaths.REJECTED, rejection(duplicate, *duplicate.problem)
        )


class DropDuplicatePaths(beam.PTransform):
    """Keeps one listing per file; the others go to the REJECTED output (reason "duplicate").

    CSV lists can name a file twice, sometimes with two labels or in two splits, or under two
    spellings of its path. Writing it twice would count it twice and could put the same image
    in train and validation.
    """

    REJECTED = "rejected"

    def expand(self, sources):
        return (
            sources
            | "KeyByFile" >> beam.Map(lambda source: (identity(source), source))
            | "GroupByFile" >> beam.GroupByKey()
            | "KeepOne" >> beam.FlatMap(_keep_one_per_file).with_outputs(
                self.REJECTED, main="sources"
            )
        )
