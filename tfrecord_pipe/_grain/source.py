"""A split's ArrayRecord shards as Grain reads them: found from the manifest, opened as one
random-access source of serialized records, checked against the manifest's counts; a damaged
shard is an error that names it."""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import os

from tfrecord_pipe._core import array_records, extras, naming
from tfrecord_pipe._core import manifest as manifest_lib


def grain_module():
    try:
        import grain
    except ImportError as err:
        raise ImportError(
            f"The Grain path needs Grain and array-record: {extras.how_to_install('grain')}."
        ) from err
    return grain


@dataclasses.dataclass(frozen=True)
class Split:
    """A split's ArrayRecord shards, as the manifest lists them.

    Attributes:
      name: the split's name.
      files: local paths of its ArrayRecord shards, in shard order.
      shard_lengths: records in each, by the manifest.
      label_offset: subtracted from stored labels.
      num_classes: the dataset's number of labels.
      positions: which input is at each place (`manifest.SplitInfo.positions`); "" unknown.
    """

    name: str
    files: tuple[str, ...]
    shard_lengths: tuple[int, ...]
    label_offset: int
    num_classes: int
    positions: str = ""

    @property
    def num_examples(self) -> int:
        """Records in all its shards."""
        return sum(self.shard_lengths)


def find_split(data: str, split: str) -> Split:
    """The ArrayRecord shards of `split` of the dataset folder `data`.

    Raises:
      ValueError: no dataset there, no such split, or no ArrayRecord shards; the message says
        what to do.
    """
    if "://" in data:
        raise ValueError(
            f"{data}: the array-record package reads local files only. Copy the dataset to "
            "local disk, or mount the bucket (Cloud Storage FUSE) and pass the mounted path."
        )
    path = os.path.join(data, naming.MANIFEST_NAME)
    if not os.path.exists(data):
        raise ValueError(f"{data} does not exist: pass a dataset folder the converter wrote.")
    if not os.path.exists(path):
        raise ValueError(
            f"{data} has no {naming.MANIFEST_NAME}: pass a dataset folder the converter finished."
        )
    with open(path, encoding="utf-8") as file:
        found = manifest_lib.Manifest.from_file_text(file.read(), path)
    if split not in found.splits:
        raise ValueError(naming.no_such_split(data, split, found.splits))
    info = found.splits[split]
    if naming.ARRAY_RECORD not in found.file_formats:
        raise ValueError(
            f"{data} has no ArrayRecord shards, which Grain reads. Convert with --formats "
            "tfrecord,array_record (the same records in both formats), or read it with "
            "tfrecord_pipe.reader."
        )
    if not info.num_examples:
        raise ValueError(
            f"Split {split!r} of {data} has no records: every input was rejected "
            f"({os.path.join(data, naming.rejected_name(split))} says why)."
        )
    files = tuple(os.path.join(data, name) for name in info.array_record_files)
    missing = [file for file in files if not os.path.exists(file)]
    if missing:
        raise ValueError(
            f"{len(missing)} ArrayRecord shard(s) of split {split!r} that the manifest lists are "
            f"missing: {', '.join(missing[:3])}. Restore them (tfrecord-pipe verify finds them)."
        )
    if cut := info.size_problems(data, naming.ARRAY_RECORD):
        raise ValueError(manifest_lib.sizes_said(cut, f"ArrayRecord shard(s) of split {split!r}")
                         + " (tfrecord-pipe verify finds them).")  # fmt: skip
    return Split(split, files, info.shard_lengths, found.label_offset, len(found.labels),
                 info.positions)  # fmt: skip


def shard_of(split: Split, key: int) -> str:
    """The shard file holding record `key` of the split."""
    return split.files[bisect.bisect_right(list(itertools.accumulate(split.shard_lengths)), key)]


def source(split: Split):
    """A random-access source of the split's serialized records, checked against the
    manifest's count: a shard that reads short is an error, never a smaller epoch.

    Raises:
      ValueError: a shard that is not a whole ArrayRecord file (named), or other counts.
    """
    grain = grain_module()
    try:
        records = grain.sources.ArrayRecordDataSource(list(split.files))
    except RuntimeError as err:  # the package's, for a damaged file: find which
        for file in split.files:
            try:
                array_records.count(file)
            except OSError as damaged:
                raise ValueError(f"{damaged}. Run tfrecord-pipe verify on the dataset.") from err
        raise
    if len(records) != split.num_examples:
        raise ValueError(
            f"The ArrayRecord shards of split {split.name!r} hold {len(records)} records; the "
            f"manifest lists {split.num_examples}. Run tfrecord-pipe verify on the dataset."
        )
    return records


class Keyed:
    """A source whose records come with their number in the split: (key, serialized). A
    record that cannot be read (a chunk damaged since the source opened) is an error that
    names its shard."""

    def __init__(self, records, split: Split):
        self._records = records
        self._split = split

    def __len__(self) -> int:
        return len(self._records)

    def __getitem__(self, key: int):
        try:
            return key, self._records[key]
        except RuntimeError as err:
            raise ValueError(
                f"Record {key} of split {self._split.name!r} cannot be read from "
                f"{shard_of(self._split, key)}: {err}. Run tfrecord-pipe verify on the dataset."
            ) from err
