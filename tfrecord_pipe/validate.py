"""Checks that a dataset is ready for a TPU, and a quick look inside TFRecord shards.

`check_tpu_ready` is for tests (ours and users'): XLA compiles one program per input shape, so
a dynamic dimension, a batch that is not the requested size, or a dtype the TPU cannot take
would fail far from the input pipeline, or recompile every step. It lists every problem at once.

`inspect_records` reads a few records and reports what they hold, for a person to look at.
"""

from __future__ import annotations

import collections
import dataclasses
import posixpath

import tensorflow as tf

from tfrecord_pipe import manifest as manifest_lib
from tfrecord_pipe import schema

# What TPU infeed and XLA on TPU take. int64 and float64 are not among them (cast to int32 /
# float32), nor float16 (use bfloat16), nor strings (decode on the host).
TPU_DTYPES = (tf.float32, tf.bfloat16, tf.int32, tf.uint32, tf.int8, tf.uint8, tf.bool)
_DTYPE_ADVICE = {
    tf.int64: "cast to int32",
    tf.float64: "cast to float32",
    tf.float16: "use bfloat16",
    tf.string: "decode on the host",
}
IMAGE_LAYOUTS = ("NHWC", "HWCN")


class NotTpuReadyError(ValueError):
    """A dataset's elements cannot go to a TPU as they are; the message lists why."""


def check_tpu_ready(
    dataset: tf.data.Dataset | object, batch_size: int, image_layout: str = "NHWC"
) -> None:
    """Raises NotTpuReadyError unless every component is static, batched and TPU-typed.

    Args:
      dataset: a tf.data.Dataset, or its `element_spec`.
      batch_size: the batch every component must have: dimension 0, or the last dimension of
        rank-4 images when `image_layout` is "HWCN".
      image_layout: "NHWC", or "HWCN" for transposed image batches.

    Raises:
      NotTpuReadyError: listing each component that has a dynamic dimension, the wrong batch
        size, or a dtype TPUs do not take.
    """
    if image_layout not in IMAGE_LAYOUTS:
        raise ValueError(f"image_layout must be one of {IMAGE_LAYOUTS}, got {image_layout!r}")
    spec = dataset.element_spec if isinstance(dataset, tf.data.Dataset) else dataset
    paths_and_specs = _flatten_with_paths(spec)
    problems = []
    if not paths_and_specs:
        problems.append("the elements have no tensors")
    for path, component in paths_and_specs:
        if not isinstance(component, tf.TensorSpec):
            problems.append(f"{path}: {type(component).__name__} is not a dense tensor")
            continue
        shape = component.shape
        if shape.rank is None:
            problems.append(f"{path}: unknown rank")
            continue
        if not shape.is_fully_defined():
            problems.append(f"{path}: shape {shape} has dynamic dimensions (None)")
        if shape.rank == 0:
            problems.append(f"{path}: a scalar has no batch dimension; batch the dataset")
        else:
            axis = -1 if (image_layout == "HWCN" and shape.rank == 4) else 0
            if shape[axis] is not None and shape[axis] != batch_size:
                where = "last" if axis == -1 else "first"
                problems.append(
                    f"{path}: {where} (batch) dimension is {shape[axis]}, expected {batch_size}"
                )
        if component.dtype not in TPU_DTYPES:
            advice = _DTYPE_ADVICE.get(component.dtype, "cast to a TPU type")
            problems.append(f"{path}: dtype {component.dtype.name} is not TPU-ready ({advice})")
    if problems:
        raise NotTpuReadyError(
            "Dataset is not TPU-ready:\n  "
            + "\n  ".join(problems)
            + "\nBatch with drop_remainder=True and give every image a fixed size."
        )


def _flatten_with_paths(spec, path="element"):
    """(path, leaf) pairs of a nested element spec: element[0], element['image'], ..."""
    if isinstance(spec, dict):
        items = [(f"{path}[{key!r}]", value) for key, value in sorted(spec.items())]
    elif isinstance(spec, (tuple, list)):
        items = [(f"{path}[{index}]", value) for index, value in enumerate(spec)]
    else:
        return [(path, spec)]
    return [pair for sub_path, value in items for pair in _flatten_with_paths(value, sub_path)]


@dataclasses.dataclass(frozen=True)
class RecordReport:
    """What a few records of some shards hold.

    Attributes:
      files: the shard files found.
      records_read: how many records were looked at (from the first files).
      keys: feature keys and their types, over the records read.
      stored_labels: smallest and largest stored label (before any offset is removed).
      label_texts: stored label to its text, over the records read.
      heights: smallest and largest image height.
      widths: smallest and largest image width.
      problems: records that do not parse, or whose image does not decode to its stated shape.
    """

    files: tuple[str, ...]
    records_read: int
    keys: dict[str, str]
    stored_labels: tuple[int, int] | None
    label_texts: dict[int, str]
    heights: tuple[int, int] | None
    widths: tuple[int, int] | None
    problems: tuple[str, ...]

    def __str__(self):
        lines = [f"{len(self.files)} files; read {self.records_read} records"]
        lines += [f"  {key}: {kind}" for key, kind in sorted(self.keys.items())]
        if self.stored_labels:
            lines.append(
                f"stored labels {self.stored_labels[0]}..{self.stored_labels[1]}: "
                + ", ".join(f"{k}={v}" for k, v in sorted(self.label_texts.items()))
            )
        if self.heights and self.widths:
            lines.append(
                f"image height {self.heights[0]}..{self.heights[1]}, "
                f"width {self.widths[0]}..{self.widths[1]}"
            )
        lines += [f"PROBLEM {problem}" for problem in self.problems]
        return "\n".join(lines)


def shard_files(path: str) -> tuple[tuple[str, ...], str, manifest_lib.Manifest | None]:
    """Shard files of a dataset folder (every split) or a file pattern, their compression, and
    the folder's manifest (None for a pattern or a folder without one).

    Raises:
      ValueError: nothing matches; the message says what was expected.
    """
    folder = path.rstrip("/") or path
    if tf.io.gfile.exists(posixpath.join(folder, manifest_lib.MANIFEST_NAME)):
        found = manifest_lib.read(folder)
        files = tuple(
            posixpath.join(folder, name) for info in found.splits.values() for name in info.files
        )
        return files, found.compression, found
    if tf.io.gfile.isdir(folder):
        pattern = posixpath.join(folder, "*.tfrecord*")
    else:
        pattern = path
    files = tuple(sorted(tf.io.gfile.glob(pattern)))
    if not files:
        raise ValueError(
            f"No TFRecord files at {path}: give a dataset folder, a folder of *.tfrecord files, "
            "or a file pattern that matches some."
        )
    return files, manifest_lib.compression_of(files), None


def inspect_records(path: str, num_records: int = 32) -> RecordReport:
    """Reads the first `num_records` records of a dataset folder or file pattern.

    Records are parsed with the record format (`schema.decode_example`) and their images decoded
    with `tf.io.decode_jpeg`, exactly as the reader will; anything that fails is a problem in the
    report, not an exception.
    """
    files, compression, _ = shard_files(path)
    keys: dict[str, str] = {}
    labels: dict[int, str] = {}
    heights, widths, problems = [], [], []
    read = 0
    records = tf.data.TFRecordDataset(list(files), compression_type=compression)
    try:
        for serialized in records.take(num_records):
            read += 1
            raw = serialized.numpy()
            keys.update(_feature_kinds(raw))
            try:
                record = schema.decode_example(raw, label_offset=0)
            except ValueError as err:
                problems.append(f"record {read}: {err}")
                continue
            labels[record.label_index] = record.label_text
            shape = tuple(tf.io.decode_jpeg(record.encoded, channels=3).shape)
            if shape != (record.height, record.width, 3):
                problems.append(
                    f"record {read} ({record.filename}): image decodes to {shape}, the record "
                    f"says {record.height}x{record.width}x3"
                )
            heights.append(record.height)
            widths.append(record.width)
    except tf.errors.OpError as err:
        problems.append(f"reading stopped after {read} records: {err.message}")
    return RecordReport(
        files=files,
        records_read=read,
        keys=keys,
        stored_labels=(min(labels), max(labels)) if labels else None,
        label_texts=labels,
        heights=(min(heights), max(heights)) if heights else None,
        widths=(min(widths), max(widths)) if widths else None,
        problems=tuple(problems),
    )


def _feature_kinds(serialized: bytes) -> dict[str, str]:
    example = tf.train.Example()
    try:
        example.ParseFromString(serialized)
    except Exception:  # not an Example: decode_example reports it
        return {}
    kinds = collections.OrderedDict()
    for key, feature in example.features.feature.items():
        kinds[key] = feature.WhichOneof("kind") or "empty"
    return dict(kinds)
