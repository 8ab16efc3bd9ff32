"""CSV lists of inputs (`path,label[,split]` lines): read as UTF-8 text a block at a time,
the header rule, paths normalised, and a file listed twice kept once.

Rules a user can rely on (docs/conversion.md, "What we guarantee"): the first line, and only
it, may be a header (`--csv_header`, default auto: it is one when its path cell is a plain
name, no "/" or ".", that names no existing file). A UTF-8 BOM is ignored. Paths are
normalised (`./a.jpg`, `x/../a.jpg`, `imgs//a.jpg` and the absolute path are one file, local
symlinks resolved); a file listed twice is kept once, the other lines rejected as duplicates.
"""

from __future__ import annotations

import codecs
import csv
import dataclasses
import itertools
import operator
import os
import posixpath
import re
from collections.abc import Container, Iterable, Iterator

from beam_jobs import spill, storage
from beam_jobs.config import ConvertConfig
from beam_jobs.source_file import SourceFile, check_label, check_split_name, split_by_hash
from tfrecord_pipe._core import images, manifest, messages, paths


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
    if not paths.is_remote(csv_path) and os.path.isdir(csv_path):
        raise ValueError(f"{csv_path} is a folder, not a CSV list: give the CSV file that lists "
                         "the images.")  # fmt: skip
    if not paths.is_remote(csv_path) and not os.path.isfile(csv_path):
        raise ValueError(f"CSV list {csv_path} is not a regular file (a pipe or a device?): it "
                         "is read twice (checked, then listed); write it to a file and give "
                         "that.")  # fmt: skip
    with storage.open_to_read(csv_path, by_name=True) as f:  # list.csv.gz is read too
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
    rest, given = b"", 0
    while block := f.read(_BLOCK_BYTES):
        data = rest + block
        held = b"\r" if data.endswith(b"\r") else b""  # maybe the first half of \r\n
        *lines, rest = _LINE_END.split(data[: len(data) - len(held)])
        # Every line, not only one cut by a block's end (lines within a block went through);
        # a line's end held back is not of the line.
        if max(len(rest), max(map(len, lines), default=0)) > MAX_CSV_LINE_BYTES:
            at = next(i for i, line in enumerate([*lines, rest]) if len(line) > MAX_CSV_LINE_BYTES)
            raise ValueError(
                f"CSV list {csv_path} line {given + at + 1} is over {MAX_CSV_LINE_BYTES} "
                "bytes: it is not a list of `path,label[,split]` lines."
            )
        rest += held
        given += len(lines)
        yield from lines
    if rest.rstrip(b"\r"):
        yield rest.rstrip(b"\r")


def is_a_header(first: str, csv_path: str) -> bool:
    """The auto rule: a header's path cell is a plain name that names no existing file (a
    folder of that name, as `images,label` beside images/, does not make it data)."""
    cells = cells_of(first)
    if not cells or not cells[0] or not _PLAIN_NAME.fullmatch(cells[0]):
        return False
    return not storage.exists(_resolved(cells[0], csv_path)[0])


def cells_of(line: str) -> list[str]:
    return [cell.strip() for cell in next(csv.reader([line]), [])]  # csv_lines took the BOM


def column_problem(cells: list[str], number: int, line: str, csv_path: str) -> str | None:
    """What is wrong with a data line of more columns than `path,label[,split]`: a list such
    as `path,label,width,height` had its widths taken for splits, the rest ignored. Empty
    cells after the split, as spreadsheets write them, are no columns."""
    if not any(cells[3:]):
        return None
    header = " If it is a header, pass --csv_header yes." if number == 1 else ""
    return (
        f"CSV list {csv_path} line {number} has {len(cells)} columns ({messages.quoted(line)}"
        "); its lines are path,label[,split]: keep those columns only, and write a path that "
        f"holds a comma in double quotes.{header}"
    )


def line_problem(number: int, line: str, header: str | None, csv_path: str) -> str | None:
    """What makes a line read otherwise than its writer meant, or None; a new conversion
    refuses it (verify reads such lines as the job that wrote them did). `header`: the
    first line's text, where it is a header."""
    problem = None
    if line.startswith(_BOM):
        problem = ("starts with a byte-order mark (U+FEFF), as where CSV files were joined (cat "
                   "a.csv b.csv): remove it, and a header line repeated there.")  # fmt: skip
    elif header is not None and line.strip() == header.strip():
        problem = "repeats the header of line 1 (CSV files joined?): remove it."
    elif '"' in line:
        problem = _quoting_problem(line)
    return problem and f"CSV list {csv_path} line {number} ({messages.quoted(line)}) {problem}"


def _quoting_problem(line: str) -> str | None:
    if any(_SPACE_BEFORE_QUOTE.match(cell) for cell in next(csv.reader([line]), [])):
        return ("has a space before a double-quoted cell: CSV readers keep the quotes in the "
                "value then. Remove the space before the quote.")  # fmt: skip
    try:
        next(csv.reader([line], strict=True), [])
    except csv.Error as err:
        if "unexpected end of data" in str(err):
            return ("opens a double quote that the line does not close: a path or label cannot "
                    "hold a line break (a spreadsheet cell with Alt+Enter). Remove the line "
                    "break from that cell.")  # fmt: skip
    return None


_BOM = codecs.BOM_UTF8.decode("utf-8")
_SPACE_BEFORE_QUOTE = re.compile(r'[ \t]+"')  # a cell as read: ' "cat"' kept its quotes

# Column names a header may give, by the column they name (spelt in lower case, "_" for
# spaces and dashes): a header naming them in another order than path,label,split is refused.
_COLUMN_NAMES = {
    "path": {"path", "paths", "file", "files", "filename", "file_name", "filepath",
             "file_path", "image", "images", "image_path", "image_file", "img", "img_path",
             "uri", "url"},
    "label": {"label", "labels", "class", "classes", "class_name", "category", "target"},
    "split": {"split", "subset", "partition"},
}  # fmt: skip


_COLUMN_OF = {name: column for column, names in _COLUMN_NAMES.items() for name in names}
# A third column that flags a split rather than naming it (fastai's is_valid).
_FLAG_COLUMNS = {"is_valid", "is_validation", "is_val", "valid", "is_test", "is_train"}


def _column_name(cell: str) -> str:
    """A header cell as the tables above spell it: `Image Path` is image_path."""
    return re.sub(r"[ -]", "_", cell.lower())


def index_column_problem(first: str, csv_path: str) -> str | None:
    """A first line `,path,label`: pandas' `to_csv` writes its index as a first column with
    no name, and every column was then read one place off (the index as the path)."""
    cells = cells_of(first)
    if len(cells) > 1 and not cells[0] and _column_name(cells[1]) in _COLUMN_OF:
        return (
            f"CSV list {csv_path} line 1 ({messages.quoted(first)}) starts with a column with no "
            "name, as pandas writes its index: write the CSV with to_csv(..., index=False), or "
            "drop that column (cut -d, -f2-)."
        )
    return None


def header_problem(line: str, csv_path: str) -> str | None:
    """A header line that names its columns in another order than `path,label[,split]`
    (`path,split,label` made splits of the labels and labels of the splits), or None."""
    cells = cells_of(line)
    if len(cells) > 2 and _column_name(cells[2]) in _FLAG_COLUMNS:
        return (
            f"CSV list {csv_path}'s header (line 1: {messages.quoted(line)}) names column 3 "
            f"{cells[2]!r}, a flag; that column is read as the split, and its True/False would "
            "be split names. Write train or validation in it instead."
        )
    for place, (column, cell) in enumerate(zip(_COLUMN_NAMES, cells), start=1):
        other = _COLUMN_OF.get(_column_name(cell))
        if other and other != column:
            return (
                f"CSV list {csv_path}'s header (line 1: {messages.quoted(line)}) names column "
                f"{place} {cell!r}, which is read as the {column}: its lines are read as "
                "path,label[,split]. Put the columns in that order."
            )
    return None


def sources_of_csv_line(line: str, config: ConvertConfig, number: int) -> list[SourceFile]:
    """The input of a data line `path,label[,split]` (line `number` of the list, for
    messages); none for a blank line.

    A line without a path comes out with its problem, so that it is rejected, not dropped.

    Raises:
      ValueError: a split that cannot name shard files, or a label that cannot be a line of
        labels.txt (the job stops at listing).
    """
    cells = cells_of(line)
    if not any(cells):
        return []
    path, relpath = _resolved(cells[0], config.source) if cells[0] else ("", line)
    label = cells[1] if len(cells) > 1 and cells[1] else None
    split = cells[2] if len(cells) > 2 and cells[2] else None
    if split is None:
        hashed = named_before_0_5(relpath) if cells[0] else relpath  # each file keeps its split
        split = split_by_hash(hashed, config.validation_fraction)
    where = f"CSV list {config.source} line {number} ({messages.quoted(line)}):"
    check_split_name(split, f"{where} split", "change it")
    check_label(label, f"{where} its", "write it without them")
    problem = None if cells[0] else (images.UNREADABLE, f"the line has no path: {line!r}")
    if problem is None and len(cells) == 1:  # said as a folder's file without a label was
        other = next((sep for sep in (";", "\t", "|") if sep in cells[0]), None)
        separated = f"; CSV lists are comma-separated, and it holds {other!r}" if other else ""
        problem = (images.NO_LABEL, f"the line has no label (no second column): {line!r}"
                                    f"{separated}")  # fmt: skip
    return [SourceFile(path, relpath, label, split, problem)]


def _resolved(path: str, csv_path: str) -> tuple[str, str]:
    """(full path, path relative to the CSV's folder) of a CSV cell, normalised: `./a.jpg`,
    `x/../a.jpg`, `imgs//..//a.jpg` and the absolute path are one `a.jpg`. A path outside the
    CSV's folder is its own relative path, whole: no relative path starts with "/" or holds
    "//", so no two files have one name."""
    base = posixpath.dirname(csv_path)
    if not paths.is_remote(path) and not path.startswith("/"):
        path = posixpath.join(base, path) if base else path
    full, folder = _normalised(path), _normalised(base)
    if full.startswith(folder.rstrip("/") + "/"):
        return full, full[len(folder.rstrip("/")) + 1 :]
    return full, full


WHOLE_OUTSIDE_SINCE = (0, 5)  # the version that names a file outside the CSV's folder whole


def named_before_0_5(relpath: str) -> str:
    """A listed file's relative path as converters before 0.5 named it: one outside the CSV's
    folder without its scheme and leading "/", which could be another file's name (`/x/a.jpg`
    beside a CSV in `/d` was `x/a.jpg`, as `/d/x/a.jpg` is)."""
    return relpath.split("://", 1)[-1].lstrip("/")


def names_outside_whole(found: manifest.Manifest) -> bool:
    """Whether the converter of `found` named a file outside the CSV's folder whole; `verify`
    lists an older dataset's files with `named_as_before_0_5`."""
    return found.written_since(WHOLE_OUTSIDE_SINCE)


def named_as_before_0_5(source: SourceFile) -> SourceFile:
    """`source` with the relative path a converter before 0.5 gave it (`named_before_0_5`)."""
    if not source.path:  # a line without a path is named by its text
        return source
    return dataclasses.replace(source, relpath=named_before_0_5(source.relpath))


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


LABELLED_FIRST_SINCE = (0, 5)  # the version whose `one_per_file` keeps a usable listing first


def labelled_first(found: manifest.Manifest) -> bool:
    """Whether the converter of `found` kept a usable listing first (`one_per_file`)."""
    return found.written_since(LABELLED_FIRST_SINCE)


def labels_ranked_by(found: manifest.Manifest, config) -> frozenset[str] | None:
    """The labels file's labels the converter of `found` ranked listings by (`one_per_file`),
    or None: no labels file, or a converter before that rule."""
    if config.labels_file is None or not labelled_first(found):
        return None
    return frozenset(found.labels)


def one_per_file(listings: list[SourceFile], labelled_first: bool = True,
                 labels: Container[str] | None = None
                 ) -> tuple[SourceFile, list[SourceFile]]:  # fmt: skip
    """The listing of a file that is kept, and the others, each with its DUPLICATE problem.

    Which one is kept must not depend on the order the listings come in: the smallest by
    (split, label, relpath) is kept, so re-runs write the same records. With
    `labelled_first` (from 0.5; `verify` asks for an older dataset's rule), a listing that
    the dataset can use comes before one that gives no label, or a label not among the
    `labels` a labels file fixed: that one would have the file rejected (`no_label`,
    `unknown_label`) and the usable line rejected as a duplicate of it.
    """
    if len(listings) == 1:
        return listings[0], []

    def order(s: SourceFile) -> tuple:
        unknown = labels is not None and s.class_label not in labels
        first = (s.class_label is None, s.problem is not None, unknown) if labelled_first else ()
        return (*first, s.split, s.label or "", s.relpath)

    ordered = sorted(listings, key=order)
    kept = ordered[0]
    def detail(dropped: SourceFile) -> str:  # its own label too: a multi-label list loses it
        return (
            f"the same file as {kept.relpath} is listed {len(ordered)} times; this listing "
            f"(label {dropped.label!r}, split {dropped.split!r}) is dropped; kept the listing "
            f"{kept.relpath!r} with label {kept.label!r} in split {kept.split!r}. Remove the "
            "extra lines."
        )

    return kept, [dataclasses.replace(s, problem=(images.DUPLICATE, detail(s)))
                  for s in ordered[1:]]  # fmt: skip


def kept_once(listed: Iterable[SourceFile], spill_dir: str, labelled_first: bool = True,
              labels: Container[str] | None = None) -> Iterator[SourceFile]:
    """Every listing, each file's kept one (`one_per_file`) then its others marked as
    duplicates; grouped through a sort on local disk in `spill_dir`, so memory stays flat
    however long the list (the local engine and `verify`; Beam groups with
    `pipeline.DropDuplicatePaths`)."""
    by_file = spill.SortedSpill(spill_dir, key=operator.itemgetter(0))
    for source in listed:
        by_file.add((identity(source), source))
    for _, same in itertools.groupby(by_file.sorted(), key=operator.itemgetter(0)):
        kept, others = one_per_file([source for _, source in same], labelled_first, labels)
        yield kept
        yield from others
