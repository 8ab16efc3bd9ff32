"""Which files (or records) each input pipeline reads: one pipeline per host, or per
`tf.distribute.InputContext`.

Pipelines own whole files, dealt round-robin, so that each reads sequentially and no two read
the same record. With fewer files than pipelines some would get nothing: then every pipeline
reads every file and keeps every n-th record (correct, but each byte is read n times; the
reader warns).
"""

from __future__ import annotations

import dataclasses

from tfrecord_pipe.reading import dataset


@dataclasses.dataclass(frozen=True)
class PipelineShare:
    """The part of a split that one input pipeline reads.

    Attributes:
      files: the files this pipeline opens.
      record_counts: records per file in the file (not the share), or None when unknown.
      record_shard: (num_pipelines, index) when there are fewer files than pipelines: every
        pipeline opens every file and keeps every num_pipelines-th record from `index`.
        None when the pipeline owns whole files.
    """

    files: tuple[str, ...]
    record_counts: tuple[int, ...] | None
    record_shard: tuple[int, int] | None = None

    @property
    def num_examples(self) -> int | None:
        """Records this pipeline yields in one pass, when the counts are known."""
        if self.record_counts is None:
            return None
        if self.record_shard is None:
            return sum(self.record_counts)
        num, index = self.record_shard
        return sum(len(range(index, count, num)) for count in self.record_counts)


def share(split: dataset.Split, num_pipelines: int = 1, index: int = 0) -> PipelineShare:
    """What input pipeline `index` of `num_pipelines` reads of `split`'s files."""
    files, record_counts = split.files, split.record_counts
    if not 0 <= index < num_pipelines:
        raise ValueError(f"input pipeline {index} does not exist among {num_pipelines}")
    if len(files) >= num_pipelines:
        picked = range(index, len(files), num_pipelines)
        counts = None if record_counts is None else tuple(record_counts[i] for i in picked)
        return PipelineShare(files=tuple(files[i] for i in picked), record_counts=counts)
    return PipelineShare(files, record_counts, (num_pipelines, index))
