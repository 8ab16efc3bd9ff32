"""The job's small results, written by the pipeline into its temporary folder as
`_summary.json` and read by `finalise` to make the manifest: the shards written, the counts
per split, the label list, the duplicate totals and the records per split and label."""

from __future__ import annotations

import dataclasses
import json

from tfrecord_pipe._core import naming


@dataclasses.dataclass(frozen=True)
class ShardWritten:
    """One shard file the job wrote.

    Attributes:
      split, index, shards: the shard's split, its number and the split's shard count.
      count: records in it.
      bytes: its size.
      file: its name in the dataset folder.
      file_format: its format (naming.FILE_FORMATS); a shard in two formats is two files.
      digest: which input each record holds (`manifest.ShardPositions`).
    """

    split: str
    index: int
    shards: int
    count: int
    bytes: int
    file: str
    file_format: str = naming.TFRECORD
    digest: str = ""


@dataclasses.dataclass(frozen=True)
class SplitCount:
    """Inputs of one split listed (`reason` None) or rejected for `reason`: `n` of them."""

    split: str
    reason: str | None
    n: int


@dataclasses.dataclass(frozen=True)
class Summary:
    """Attributes:
    shards: every shard written, by split and index.
    counts: listed and rejected inputs, by split and reason.
    labels: the dataset's labels, when any input had one.
    duplicates: totals of the inputs with the same bytes (`duplicates.totals`).
    label_counts: (split, label, records) of every split and label some record holds,
      sorted (absent from summaries before 0.5): at most splits x labels rows, however many
      records.
    """

    shards: tuple[ShardWritten, ...] = ()
    counts: tuple[SplitCount, ...] = ()
    labels: tuple[str, ...] = ()
    duplicates: dict[str, int] = dataclasses.field(default_factory=dict)
    label_counts: tuple[tuple[str, str, int], ...] = ()

    @classmethod
    def of(cls, shards, counts, labels=(), duplicates=None, label_counts=()) -> Summary:
        """In a fixed order, whatever order the pipeline delivered the rows in."""
        return cls(
            shards=tuple(sorted(shards, key=lambda s: (s.split, s.index, s.file_format))),
            counts=tuple(sorted(counts, key=lambda c: (c.split, c.reason or ""))),
            labels=tuple(labels),
            duplicates=dict(sorted((duplicates or {}).items())),
            label_counts=tuple(sorted(tuple(row) for row in label_counts)),
        )

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Summary:
        """Also reads the summaries of tfrecord-pipe before 0.4.0, which a killed run may have
        left (count rows {"what": "listed" or "rejected:REASON"}, the labels in a list of
        one, duplicate totals as rows)."""
        data = json.loads(text)
        counts = [_count(row) for row in data["counts"]]
        labels = data["labels"]
        if labels and isinstance(labels[0], list):
            (labels,) = labels
        duplicates = data["duplicates"]
        if isinstance(duplicates, list):
            duplicates = {row["what"]: row["n"] for row in duplicates}
        return cls(
            shards=tuple(ShardWritten(**row) for row in data["shards"]),
            counts=tuple(counts),
            labels=tuple(labels),
            duplicates=duplicates,
            label_counts=tuple(tuple(row) for row in data.get("label_counts", ())),
        )


def _count(row: dict) -> SplitCount:
    if "what" in row:  # before 0.4.0
        what = row["what"]
        reason = None if what == "listed" else what.removeprefix("rejected:")
        return SplitCount(row["split"], reason, row["n"])
    return SplitCount(**row)
