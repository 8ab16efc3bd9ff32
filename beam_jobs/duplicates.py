"""Exact content duplicates: inputs with the same bytes under different names.

The same picture in two classes, or in train and validation, silently inflates validation
accuracy. Every loaded input's bytes are hashed already (the record keeps the hash), so the
job groups the loaded inputs by that hash: each group of more than one is a line of
`duplicates.jsonl`, groups across splits first. With `dedupe`, the first input of a group
by path is kept and the others are rejected as `duplicate_content`, naming the one kept.

Only the small `Checked` entries are grouped (the shard writer reads the images again), so
the grouping moves a few hundred bytes per input, not the images.
"""

from __future__ import annotations

from beam_jobs.source_file import SourceFile, rejection
from tfrecord_pipe._core import images


def _ordered(split_checked_list) -> list:
    return sorted(split_checked_list, key=lambda split_checked: split_checked[1].relpath)


def group_row(sha256: str, records) -> dict | None:
    """The report row of a group of (split, Checked) with the same bytes; None for one input."""
    records = list(records)  # Beam gives an iterable
    if len(records) < 2:  # nearly every group: no sort for it
        return None
    return report_row(sha256, [(c.relpath, split, c.label_text) for split, c in _ordered(records)])


def report_row(sha256: str, files: list[tuple[str, str, str]]) -> dict:
    """duplicates.jsonl's line for the inputs with these bytes, (relpath, split, label) in path
    order: what the job writes and `verify` expects."""
    rows = [{"relpath": relpath, "split": split, "label": label} for relpath, split, label in files]
    return {
        "sha256": sha256,
        "cross_split": len({row["split"] for row in rows}) > 1,
        "cross_label": len({row["label"] for row in rows}) > 1,
        "files": rows,
    }


def keep_first(records) -> tuple[tuple, list]:
    """Of a group of (split, Checked) with the same bytes: the first by path, kept, and the
    others' rejections, naming it."""
    first, *others = _ordered(records)
    detail = f"the same bytes as {first[1].relpath} (--dedupe keeps the first by path)"
    return first, [
        rejection(SourceFile(checked.path, checked.relpath, checked.label_text, split),
                  images.DUPLICATE_CONTENT, detail)  # fmt: skip
        for split, checked in others
    ]


def totals(row: dict):
    """(what, n) pairs of one group, summed into the manifest's `duplicates`."""
    yield "groups", 1
    yield "copies", len(row["files"]) - 1  # inputs beyond the first of each group
    yield "cross_split_groups", int(row["cross_split"])
    yield "cross_label_groups", int(row["cross_label"])


def report_order(row: dict) -> tuple:
    """Groups across splits first, then across labels, then by their first path."""
    return (not row["cross_split"], not row["cross_label"], row["files"][0]["relpath"])
