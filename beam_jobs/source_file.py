"""One listed input (`SourceFile`), and the rules every listing applies to what it names:
a split that can name shard files, a label that can be a line of labels.txt, the split a
path is given by hash, and the dead-letter line of an input that is not used."""

from __future__ import annotations

import dataclasses
import hashlib

from tfrecord_pipe._core import naming
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

    def as_tuple(self) -> tuple:
        """Its fields in order, from which `SourceFile(*fields)` makes it again: a plain tuple
        pickles at a fifth of a dataclass's cost, for the many sent between processes."""
        return self.path, self.relpath, self.label, self.split, self.problem

    @property
    def class_label(self) -> str | None:
        """The label this input brings to the dataset's list of labels: none where it was
        listed with a problem (a broken link in a folder of its own is no class)."""
        return self.label if self.problem is None else None


def rejection(source: SourceFile, reason: str, detail: str) -> Rejection:
    """A dead-letter line: what a user needs to find and fix the input."""
    return Rejection(source.path, source.relpath, source.split, reason, detail)


def split_by_hash(relpath: str, validation_fraction: float) -> str:
    """naming.TRAIN or naming.VALIDATION, from a stable hash of the relative path (of the
    bytes a name not UTF-8 has on disk: its input is rejected in that split)."""
    if validation_fraction <= 0:
        return naming.TRAIN
    name = relpath.encode("utf-8", "surrogateescape")  # as "utf-8" for every UTF-8 name
    value = int(hashlib.sha256(name).hexdigest()[:16], 16) / 16**16
    return naming.VALIDATION if value < validation_fraction else naming.TRAIN


def check_split_name(split: str, where: str, fix: str) -> None:
    """Raises ValueError unless `split` can be part of shard file names."""
    problem = naming.split_name_problem(split)
    if problem:
        raise ValueError(f"{where} {problem}; {fix}.")


def check_label(label: str | None, where: str, fix: str) -> None:
    """Raises ValueError unless `label` can be a line of labels.txt (the job stops at
    listing, before loading anything)."""
    problem = label and naming.label_problem(label)
    if problem:
        raise ValueError(f"{where} {problem}; {fix}.")
