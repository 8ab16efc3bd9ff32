"""Listing the inputs: folders (labels from sub-folders), split folders, or CSV lists.

Listing uses Beam's file matching and text reading, so no list of every path is ever built on
the launching machine or embedded in the job graph.
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import posixpath

import apache_beam as beam
from apache_beam.io import fileio
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics

import beam_jobs
from beam_jobs import storage
from beam_jobs.config import ConvertConfig
from tfrecord_pipe.core import images, naming, paths


@dataclasses.dataclass(frozen=True)
class SourceFile:
    """One listed input.

    Attributes:
      path: where to read it (local path or URL).
      relpath: its path relative to the input root: the record's filename and sort key.
      label: the label text, or None when the input gave none.
      split: the split it belongs to.
    """

    path: str
    relpath: str
    label: str | None
    split: str


def resolve_layout(config: ConvertConfig) -> ConvertConfig:
    """Checks that the source exists, and fills in layout="auto" by looking at it.

    Raises:
      FileNotFoundError: no such CSV file, or no file under the folder; says what is expected.
    """
    is_csv = config.layout == "auto" and config.source.lower().endswith(".csv")
    if config.layout == "csv" or is_csv:
        if not FileSystems.exists(config.source):
            raise FileNotFoundError(f"CSV list {config.source} does not exist.")
        return dataclasses.replace(config, layout="csv")
    root = config.source_root
    if not storage.exists(root + "/**"):
        raise FileNotFoundError(
            f"No files found under {root}. Give a folder whose sub-folders are labels "
            "(SRC/daisy/1.jpg), a folder of split folders (SRC/train/daisy/1.jpg), or a CSV file."
        )
    if config.layout != "auto":
        return config
    has_splits = storage.exists(paths.join(root, naming.TRAIN, "**"))
    return dataclasses.replace(config, layout="splits" if has_splits else "labels")


def split_by_hash(relpath: str, validation_fraction: float) -> str:
    """naming.TRAIN or naming.VALIDATION, from a stable hash of the relative path."""
    if validation_fraction <= 0:
        return naming.TRAIN
    value = int(hashlib.sha256(relpath.encode("utf-8")).hexdigest()[:16], 16) / 16**16
    return naming.VALIDATION if value < validation_fraction else naming.TRAIN


def source_from_folder(
    path: str, root: str, layout: str, validation_fraction: float
) -> SourceFile:
    """Label (and split) of a listed file, from the folders between `root` and it."""
    relpath = path[len(root):].lstrip("/")
    parts = relpath.split("/")
    if layout == "splits":
        if len(parts) < 2:
            raise ValueError(
                f"{path} is not inside a split folder, but {root} holds split folders "
                f"({root}/train/<label>/...): move it into one, or out of {root}."
            )
        split = parts[0]
        _check_split_name(split, f"{root}: split folder", "rename the folder")
        label = parts[1] if len(parts) >= 3 else None
        return SourceFile(path, relpath, label, split)
    label = parts[0] if len(parts) >= 2 else None
    return SourceFile(path, relpath, label, split_by_hash(relpath, validation_fraction))


def source_from_csv_line(line: str, csv_path: str, validation_fraction: float) -> SourceFile | None:
    """A CSV line `path,label[,split]`, or None for a header or blank line."""
    row = next(csv.reader([line]), [])
    row = [cell.strip() for cell in row]
    if not row or not row[0] or row[0].lower() in ("path", "filename", "image"):
        return None
    path = row[0]
    label = row[1] if len(row) > 1 and row[1] else None
    if paths.is_remote(path) or path.startswith("/"):
        full, relpath = path, path.split("://", 1)[-1].lstrip("/")
    else:
        full, relpath = posixpath.join(posixpath.dirname(csv_path), path), path
    split = row[2] if len(row) > 2 and row[2] else split_by_hash(relpath, validation_fraction)
    _check_split_name(split, f"{csv_path}: line {line!r}: split", "change it")
    return SourceFile(full, relpath, label, split)


def _check_split_name(split: str, where: str, fix: str) -> None:
    """Raises ValueError unless `split` can be part of shard file names."""
    problem = naming.split_name_problem(split)
    if problem:
        raise ValueError(f"{where} {problem}; {fix}.")


class ListSources(beam.PTransform):
    """Lists the inputs as SourceFiles with Beam's file matching (scales to millions of files).

    A folder listing comes out of one step that runners cannot split: spread it (`Spread`)
    before any per-image work, or one worker thread would load every image (on Dataflow too).
    """

    def __init__(self, config: ConvertConfig):
        super().__init__()
        self._config = config

    def expand(self, pbegin):
        config = self._config
        if config.layout == "csv":
            return (
                pbegin
                | "ReadCsv" >> beam.io.ReadFromTextWithFilename(config.source)
                | "ParseCsv" >> beam.FlatMap(
                    lambda kv: filter(None, [
                        source_from_csv_line(kv[1], config.source, config.validation_fraction)
                    ])
                )
            )
        root = config.source_root
        return (
            pbegin
            | "MatchFiles" >> fileio.MatchFiles(root + "/**")
            # Folder markers (empty objects named "images/daisy/", which the Cloud console
            # creates for "Create folder") match too; they are folders, not inputs.
            | "FromFolders" >> beam.FlatMap(
                lambda meta: [] if meta.path.endswith("/") else [
                    source_from_folder(meta.path, root, config.layout, config.validation_fraction)
                ]
            )
        )


def rejection(source: SourceFile, reason: str, detail: str) -> dict:
    """A dead-letter line: what a user needs to find and fix the input."""
    return {
        "path": source.path,
        "relpath": source.relpath,
        "split": source.split,
        "reason": reason,
        "error": detail,
    }


def keep_one_per_path(path_and_sources):
    """Yields the one listing of a path that is kept, and rejections for the others.

    Which one is kept must not depend on the order Beam delivers them in: the smallest by
    (split, label, relpath) is kept, so re-runs write the same records.
    """
    path, sources = path_and_sources
    ordered = sorted(sources, key=lambda s: (s.split, s.label or "", s.relpath))
    kept = ordered[0]
    yield kept
    for other in ordered[1:]:
        Metrics.counter(beam_jobs.METRICS_NAMESPACE, "inputs_duplicate").inc()
        yield beam.pvalue.TaggedOutput(
            DropDuplicatePaths.REJECTED,
            rejection(
                other,
                images.DUPLICATE,
                f"{path} is listed {len(ordered)} times; kept the listing with label "
                f"{kept.label!r} in split {kept.split!r}. Remove the extra lines.",
            ),
        )


class DropDuplicatePaths(beam.PTransform):
    """Keeps one listing per path; the others go to the REJECTED output (reason "duplicate").

    CSV lists can name a file twice, sometimes with two labels or in two splits. Writing it
    twice would count it twice and could put the same image in train and validation.
    """

    REJECTED = "rejected"

    def expand(self, sources):
        return (
            sources
            | "KeyByPath" >> beam.Map(lambda source: (source.path, source))
            | "GroupByPath" >> beam.GroupByKey()
            | "KeepOne" >> beam.FlatMap(keep_one_per_path).with_outputs(
                self.REJECTED, main="sources"
            )
        )
