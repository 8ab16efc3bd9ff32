"""ConvertConfig: the conversion job's options, checked before anything runs.

The manifest records the configuration a dataset was written with (`to_record`), and `verify`
reads it back (`from_record`) to redo the conversion's decisions.
"""

from __future__ import annotations

import dataclasses

from beam_jobs import shard_plan
from tfrecord_pipe._core import arguments, images, naming, paths, schema

LAYOUTS = ("auto", "labels", "splits", "csv")
CSV_HEADERS = ("auto", "yes", "no")


@dataclasses.dataclass(frozen=True)
class ConvertConfig:
    """What the job converts and how.

    Attributes:
      source: input folder, or a CSV file of `path,label[,split]` lines. Local or gs://.
      output: dataset folder to write. Local or gs://.
      layout: "auto", "labels" (SRC/label/...), "splits" (SRC/split/label/...) or "csv".
      csv_header: whether a CSV's first line is a header: "yes", "no", or "auto" (the rule in
        `csv_lists.py`).
      validation_fraction: share of inputs put in the validation split when the input does not
        say; chosen by a stable hash of the relative path, so adding images never moves others.
      labels_file: fixes the label order (one per line); default: sorted label names.
      label_offset: added to label indices on write (1, as the Cloud TPU models expect).
      num_shards: shards per split; default: `shard_plan.num_shards`'s (a multiple of 64).
      shard_bytes: largest shard size when num_shards is not given.
      compress: write GZIP-compressed TFRecord shards (and zstd-compressed ArrayRecord ones).
      formats: the shard file formats to write (naming.FILE_FORMATS): each holds the same
        records in the same shards; ArrayRecord is what Grain and TFDS data sources read.
      overwrite: replace a dataset already in `output`.
      dedupe: of inputs with the same bytes, keep the first by path and reject the others
        (`duplicate_content`); without it they are all written, and reported.
      policy: image normalisation policy.
    """

    source: str
    output: str
    layout: str = "auto"
    csv_header: str = "auto"
    validation_fraction: float = 0.0
    labels_file: str | None = None
    label_offset: int = schema.DEFAULT_LABEL_OFFSET
    num_shards: int | None = None
    shard_bytes: int = shard_plan.DEFAULT_SHARD_BYTES
    compress: bool = False
    formats: tuple[str, ...] = (naming.TFRECORD,)
    overwrite: bool = False
    dedupe: bool = False
    policy: images.ImagePolicy = images.ImagePolicy()

    def __post_init__(self):
        problems = []
        if self.layout not in LAYOUTS:
            problems.append(f"layout must be one of {LAYOUTS}, got {self.layout!r}")
        if self.csv_header not in CSV_HEADERS:
            problems.append(f"csv_header must be one of {CSV_HEADERS}, got {self.csv_header!r}")
        if not 0.0 <= self.validation_fraction < 1.0:
            problems.append(f"validation_fraction must be in [0, 1), got {self.validation_fraction}")
        if not 0 <= self.label_offset <= schema.MAX_LABEL_OFFSET:
            problems.append(
                f"label_offset must be in 0..{schema.MAX_LABEL_OFFSET}, got {self.label_offset} "
                "(0 for 0-based labels, 1 as the Cloud TPU models expect)"
            )
        if self.num_shards is not None and self.num_shards < 1:
            problems.append(f"num_shards must be >= 1, got {self.num_shards}")
        if self.shard_bytes < 1:
            problems.append(f"shard_bytes must be >= 1, got {self.shard_bytes}")
        if naming.formats_problem(self.formats):
            problems.append(naming.formats_problem(self.formats))
        arguments.refuse("conversion options", problems)

    @property
    def source_root(self) -> str:
        """The folder relative paths are taken from (the CSV's folder for CSV input)."""
        if self.layout == "csv":
            return paths.parent(self.source)
        return paths.folder(self.source)

    def to_record(self) -> dict:
        """The configuration as plain JSON values, for the manifest. `formats` only when it
        is not TFRecord alone: a TFRecord dataset's manifest stays one 0.4.0 reads."""
        record = dataclasses.asdict(self)
        if self.formats == (naming.TFRECORD,):
            del record["formats"]
        return record

    @classmethod
    def from_record(cls, record: dict) -> ConvertConfig:
        """The configuration a manifest recorded (`to_record`).

        Raises:
          ValueError: the record lacks fields, or has fields this version does not know.
        """
        fields = dict(record)
        if "formats" in fields:  # a JSON list
            fields["formats"] = tuple(fields["formats"])
        policy = fields.pop("policy", None)
        if isinstance(policy, dict):
            # Recorded before colour profiles were kept (0.4.0): made without them.
            policy = {"keep_icc_profile": False, **policy}
        names = {field.name for field in dataclasses.fields(cls)} - {"policy"}
        policy_names = {field.name for field in dataclasses.fields(images.ImagePolicy)}
        missing = sorted({"source", "output"} - set(fields)) + ([] if policy else ["policy"])
        unknown = sorted(set(fields) - names) + sorted(set(policy or {}) - policy_names)
        if missing or unknown:
            raise ValueError(
                f"Not a recorded conversion configuration: missing {missing}, unknown {unknown} "
                "(written by another version of tfrecord-pipe?)"
            )
        return cls(**fields, policy=images.ImagePolicy(**policy))
