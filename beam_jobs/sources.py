"""The inputs: folders (labels from sub-folders), split folders, or CSV lists.

`list_sources` gives every input the conversion job reads, in plain Python: `verify` lists
with it, and the Beam job's `pipeline.ListSources` runs the same functions inside the pipeline (so no list
of every path is ever built on the launching machine or embedded in the job graph). Every
input listed comes out: one that cannot be used carries its problem, and the job rejects it
with that reason.

Rules a user can rely on (docs/conversion.md, "What we guarantee"):
- Layout: `auto` takes a folder as split folders only when every folder in it is named
  train, validation or test (and no file lies beside them); as label folders when none is;
  anything in between is refused with what to pass.
- Folders: walked literally (`listing.walk`); a label folder's name must be able to be a
  line of labels.txt, a split folder's to name shard files; a name that is not UTF-8 is
  rejected, escaped.
- CSV lists: `csv_lists.py`.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import os
import re
import tempfile
from collections.abc import Callable, Iterator

from beam_jobs import finalise, listing, storage
from beam_jobs.config import ConvertConfig
from beam_jobs.csv_lists import (
    cells_of,
    column_problem,
    csv_lines,
    header_problem,
    index_column_problem,
    is_a_header,
    line_problem,
    sources_of_csv_line,
)
from beam_jobs.source_file import SourceFile, check_label, check_split_name, split_by_hash
from tfrecord_pipe._core import images, manifest, messages, naming, paths

log = logging.getLogger(__name__)


def layout_said(config: ConvertConfig, asked_header: str) -> str:
    """The resolved layout in words, for the job's first line: with the header the auto rule
    found, so that a first data line taken for one is not dropped unseen."""
    if config.layout != "csv" or asked_header != "auto" or config.csv_header != "yes":
        return f"{config.layout} layout"
    first = next(csv_lines(config.source))[1]
    return (f"csv layout; line 1 ({messages.quoted(first)}) read as a header: --csv_header no "
            "if it lists an input")  # fmt: skip


def _a_dataset(root: str) -> str | None:
    """What to say where `root` is a dataset this tool wrote, not images (the arguments
    swapped: every file was rejected `no_label`, and the error said only that)."""
    found = finalise.dataset_in(root)
    if found is None:  # (another tool's file of that name: the images decide)
        return None
    made_from = found.conversion.get("source")
    return (f"{root} is a dataset (its {naming.MANIFEST_NAME}), not a folder of images: give the "
            "images first, then the dataset's folder (convert SRC OUT)"
            + (f"; it was converted from {made_from}." if made_from else "."))  # fmt: skip


def resolve_layout(config: ConvertConfig, converting: bool = True) -> ConvertConfig:
    """Checks that the source exists; fills in layout="auto" and csv_header="auto".

    `converting`: also the rules a new conversion's source must meet, which older versions
    did not ask (no fourth CSV column, no split names alike); verify passes False, so that a
    dataset they wrote can still be verified.

    Raises:
      FileNotFoundError: no such CSV file, or no file under the folder; says what is expected.
      ValueError: a folder whose layout is ambiguous, or a source that breaks those rules;
        says what to pass or change.
    """
    if problem := storage.scheme_problem(config.source, "SRC"):
        raise ValueError(problem)
    is_csv = config.layout == "auto" and config.source.lower().endswith(".csv")
    if config.layout == "csv" or is_csv:
        if not storage.exists_at_all(config.source):
            raise FileNotFoundError(f"CSV list {config.source} does not exist.")
        # Read whole here, once, streaming: a bad byte is found before the job starts.
        lines = csv_lines(config.source)
        number, first = next(lines, (1, ""))
        if converting and (problem := index_column_problem(first, config.source)):
            raise ValueError(problem)
        header = config.csv_header
        if header == "auto":
            header = "yes" if is_a_header(first, config.source) else "no"
        data = lines if header == "yes" else itertools.chain([(number, first)], lines)
        if converting and header == "yes" and (problem := header_problem(first, config.source)):
            raise ValueError(problem)
        header_line = first if header == "yes" else None
        data_lines, hashed, splits, schemes = 0, 0, set(), set()
        for number, line in data:
            if converting and (problem := line_problem(number, line, header_line, config.source)):
                raise ValueError(problem)
            cells = cells_of(line)
            if not any(cells):
                continue
            if converting and "://" in cells[0] and (scheme := cells[0].partition("://")[0]) \
                    not in schemes:  # fmt: skip
                where = f"CSV list {config.source} line {number}: its path"
                if problem := storage.scheme_problem(cells[0], where):
                    raise ValueError(problem)
                storage.reach(cells[0], where)
                schemes.add(scheme)
            data_lines += 1
            if converting and (problem := column_problem(cells, number, line, config.source)):
                raise ValueError(problem)
            if len(cells) > 2 and cells[2]:
                splits.add(cells[2])
            else:  # hashed into train or validation
                hashed += 1
                splits.update(naming.SPLIT_ORDER[: 2 if config.validation_fraction else 1])
        if not data_lines:
            raise ValueError(
                f"CSV list {config.source} lists no inputs (it is empty, blank, or only a "
                "header). Give lines `path,label[,split]`."
            )
        if converting:
            _refuse_look_alike(splits, "fix the CSV lines")
            if not hashed:
                _refuse_fraction(config, "every line of it names its split")
        return dataclasses.replace(config, layout="csv", csv_header=header)
    root = config.source_root
    temp = tempfile.gettempdir()
    if not paths.is_remote(root) and paths.is_inside(temp, root):
        raise ValueError(
            f"The temporary folder {temp} (TMPDIR) is inside the input folder {root}: the "
            "job's own temporary files would be listed as inputs, and their folders taken for "
            f"labels. Set TMPDIR to a folder outside {root}."
        )
    try:
        folders, files = storage.children(root)
    except NotADirectoryError as err:
        wanted = "a folder of images, or a CSV list (*.csv; another name with --layout csv)"
        if config.layout != "auto":
            wanted = f"a source of the {config.layout} layout (a folder)"
        raise ValueError(f"{err}: give {wanted}.") from err
    if converting and naming.MANIFEST_NAME in files and (problem := _a_dataset(root)):
        raise ValueError(problem)
    has_files = bool(files)
    if not folders and not has_files:
        missing = not paths.is_remote(root) and not os.path.lexists(root)
        found = f"{root} does not exist" if missing else f"No files found under {root}"
        raise FileNotFoundError(
            f"{found}. Give a folder whose sub-folders are labels (SRC/daisy/1.jpg), a folder "
            "of split folders (SRC/train/daisy/1.jpg), or a CSV file."
        )
    if config.layout == "splits" and converting:
        _refuse_look_alike(folders, "rename the split folders")
        _refuse_fraction(config, "its split folders decide every input's split")
    if config.layout != "auto":
        return config
    splits = sorted(folders & set(naming.SPLIT_ORDER))
    if not splits:
        return dataclasses.replace(config, layout="labels")
    others = sorted(folders - set(naming.SPLIT_ORDER))[:5] + (["files"] if has_files else [])
    if folders <= naming.SPLIT_LIKE:
        # Every folder named like a split (ImageNet's and Imagenette's val/, Kaggle's test1/).
        # Where none holds label folders (Kaggle's train/cat.0.jpg beside test1/), neither
        # layout gives any image a label. One flat split beside labelled ones (an unlabelled
        # test/, ImageNet's val/) has its images rejected `no_label`, the others converted.
        # (A `train/` beside `cats/` may be a label.)
        named = sorted(folders, key=naming.split_order)
        held = {name: storage.children(paths.join(root, name)) for name in named}
        flat = [name for name in named if not held[name][0]
                and any(not file.startswith(".") for file in held[name][1])]  # (.DS_Store)
        if flat and not any(sub_folders for sub_folders, _ in held.values()):
            raise ValueError(
                f"{root} holds folders named like splits ({', '.join(named)}), and "
                f"{paths.join(root, flat[0])} holds images itself, not label folders: neither "
                "--layout labels (the split folders would be classes) nor --layout splits "
                "gives them labels. List them with their labels in a CSV file "
                "(path,label[,split])."
            )
        if not has_files:
            if converting:
                _refuse_fraction(config, "its split folders decide every input's split")
            return dataclasses.replace(config, layout="splits")
    raise ValueError(
        f"{root} holds folders named like splits ({', '.join(splits)}) beside other things "
        f"({', '.join(others)}): is {splits[0]!r} a label or a split? Pass --layout labels "
        "(every folder is a label) or --layout splits (SRC/<split>/<label>/...)."
    )


def empty_label_folders(config: ConvertConfig, labels) -> list[str]:
    """The local label folders (SRC/<label>, SRC/<split>/<label>) that hold no file at any
    depth, and so are no label: a folder whose every file was rejected is one, and keeps its
    index, so an empty folder's silence read as if it were one too (a new user's trial).
    Hidden folders (`.ipynb_checkpoints`) are left out."""
    if config.layout == "csv" or paths.is_remote(config.source_root):
        return []
    return [
        f"{split}/{name}" if split else name
        for split, folder, names in _label_folders(config)
        for name in sorted(names - set(labels))
        if not any(files for _, _, files in os.walk(os.path.join(folder, name)))
    ]


def _label_folders(config: ConvertConfig) -> list[tuple[str, str, set[str]]]:
    """(split, its folder, the label folders in it) of a folder layout: the source's own
    label folders, or those of each split folder ("" for no split). Hidden folders
    (`.ipynb_checkpoints`) are left out."""
    root = config.source_root
    splits = sorted(storage.children(root)[0]) if config.layout == "splits" else [""]
    places = [(split, paths.join(root, split) if split else root) for split in splits]
    return [(split, folder, {name for name in storage.children(folder)[0]
                             if not name.startswith(".")})
            for split, folder in places]  # fmt: skip


def read_labels_file(path: str, warn: bool = True) -> tuple[str, ...]:
    """The labels a labels file (`--labels_file`) lists, in index order; `warn`: of lines
    that look numbered.

    Raises:
      FileNotFoundError, ValueError: no such file, a folder, or not UTF-8 text; said.
    """
    if not storage.exists_at_all(path):  # a pipe (`<(...)`) is read, as a file is
        raise FileNotFoundError(f"Labels file {path} does not exist.")
    if not paths.is_remote(path) and os.path.isdir(path):
        raise ValueError(f"Labels file {path} is a folder: give the text file that lists the "
                         "labels, one per line.")  # fmt: skip
    data = storage.read_bytes(path, by_name=True)  # labels.txt.gz is read too
    try:
        labels = manifest.parse_labels(data.decode("utf-8-sig"), path)
    except UnicodeDecodeError as err:
        raise ValueError(
            f"Labels file {path} is not UTF-8 text (byte {err.start + 1}: {err.reason}). Save "
            "it as UTF-8, one label per line."
        ) from None
    if warn and all(_NUMBERED_LABEL.fullmatch(label) for label in labels):  # all unknown_label?
        log.warning(
            "Labels file %s's lines look numbered (%r): it lists one label per line, a label's "
            "index being its line's place. If the numbers are not part of the labels' names, "
            "write the names alone, in index order.", path, labels[0])  # fmt: skip
    return labels


_NUMBERED_LABEL = re.compile(r"[0-9]+[ \t]*[,;:\t ][ \t]*\S.*")


def refuse_labels_alike(config: ConvertConfig, labels: tuple[str, ...]) -> None:
    """Refuses label folders that the labels file lists in another form (case, Unicode form,
    invisible characters): each of their images would be rejected `unknown_label`, naming a
    label that prints the same as one listed (a helper's trial)."""
    if config.layout == "csv":
        return
    folders = {name for _, _, names in _label_folders(config) for name in names}
    if alike := naming.alike_to(folders, labels):
        said = "; ".join(f"folder {ascii(name)}, listed as {ascii(listed)}"
                         for name, listed in alike)  # fmt: skip
        raise ValueError(
            f"Label folders that {config.labels_file} lists in another form (case, Unicode "
            f"form or invisible characters: {said}): their images would be rejected as of no "
            "listed label. Write each line of the labels file as the folder's name is written, "
            "or rename the folder."
        )


def _refuse_fraction(config: ConvertConfig, because: str) -> None:
    """--validation_fraction where no input's split is drawn would be ignored."""
    if config.validation_fraction > 0:
        raise ValueError(
            f"--validation_fraction {config.validation_fraction} does nothing here: "
            f"{config.source}: {because}. Drop the flag; or, to carve a validation split, give "
            "inputs without one (the label folders of one split, CSV lines without a split)."
        )


def _refuse_look_alike(splits, fix: str) -> None:
    """Split names that print alike (`Train` beside `train`) would be separate splits whose
    shard files are one file on a case-insensitive disk (macOS, Windows)."""
    if alike := naming.look_alike(sorted(splits)):
        raise ValueError(
            f"Split names that print alike ({alike}: another case or Unicode form, invisible "
            "characters or another kind of space): each would be a "
            "split of its own, and their shard files one file on a disk that ignores case "
            f"(macOS, Windows). Give each split one name: {fix}."
        )


def list_sources(config: ConvertConfig) -> Iterator[SourceFile]:
    """Every input of a resolved config (layout and csv_header decided), in plain Python."""
    if config.layout == "csv":
        for number, line in csv_lines(config.source):
            if number > 1 or config.csv_header != "yes":
                yield from sources_of_csv_line(line, config, number)
        return
    for entry in listing.walk(config.source_root, config.output):
        yield source_of_entry(entry, config)


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
        # (A split folder that could not be listed, or a link to one listed already, is an
        # entry with its problem: rejected with it. Not a file's: a FIFO or a broken link
        # there made splits of their names.)
        folder = entry.problem is not None and os.path.isdir(entry.path)
        if len(parts) < 2 and not folder:
            raise ValueError(
                f"{entry.path} is not inside a split folder, but {root} holds split folders "
                f"({root}/train/<label>/...): move it into one, or out of that folder."
            )
        split = parts[0]
        check_split_name(split, f"{root}: split folder", "rename the folder")
        label = parts[1] if len(parts) >= 3 else None
    else:
        label = parts[0] if len(parts) >= 2 else None
        split = split_by_hash(entry.relpath, config.validation_fraction)
    if not _is_utf8(entry.relpath):
        return _not_utf8(entry, label, split)
    if label and naming.label_problem(label):
        check_label(label, f"{messages.printable(entry.path)}: its", "rename the folder")
    return SourceFile(entry.path, entry.relpath, label, split, entry.problem)


def source_finder(config: ConvertConfig) -> Callable[[str], SourceFile | None] | None:
    """Where a record's name says its source is (verify reads the two side by side): a
    function from a relative path to the input a walk of the local source folder lists
    under it, if it can list one there; None for a CSV list or a remote folder, whose
    records' names lead to no path. A guess only: the walk may list that file otherwise
    (through a link, with a problem), or not at all."""
    if config.layout not in ("labels", "splits") or paths.is_remote(config.source_root):
        return None
    root = paths.folder(config.source_root)
    prefix = root if root.endswith("/") else root + "/"  # as os.scandir's names join

    def find(relpath: str) -> SourceFile | None:
        parts = relpath.split("/")
        if "" in parts or "." in parts or ".." in parts or "\0" in relpath:
            return None  # no walk lists it: never a path outside the folder, nor a NUL
        try:
            return source_of_entry(listing.Entry(prefix + relpath, relpath), config)
        except ValueError:  # a file outside split folders, a label the listing refuses
            return None

    return find


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
