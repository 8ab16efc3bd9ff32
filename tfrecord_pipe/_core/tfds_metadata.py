"""The metadata TensorFlow Datasets reads, made from our manifest, so that
`tfds.builder_from_directory(OUT)` loads a converted dataset with its label names.

The manifest stays the source of truth: these files are derived from it when it is written,
and `verify` checks that they still say the same. The JSON is what TFDS's own
`write_metadata` writes (its DatasetInfo and FeaturesDict protos as JSON), made here without
TensorFlow, as the conversion's launcher has none.

With a label offset, TFDS's ClassLabel still counts from 0: the indices below the offset get
placeholder names (`offset_0`, ...), so that `names[label]` is the label's name.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from tfrecord_pipe._core import naming, schema

if TYPE_CHECKING:  # the manifest module writes these files (`manifest.files_of`)
    from tfrecord_pipe._core.manifest import Manifest

DATASET_INFO = "dataset_info.json"
FEATURES = "features.json"
# TFDS keeps a ClassLabel's names beside the features, in a file named after its feature key.
LABEL_NAMES = schema.LABEL.replace("/", ".") + ".labels.txt"
FILES = (LABEL_NAMES, FEATURES, DATASET_INFO)  # in writing order: TFDS opens DATASET_INFO first

_CLASS = "tensorflow_datasets.core.features."  # where TFDS's feature classes live

# The shard names of `naming.shard_name`, in TFDS's template language.
FILEPATH_TEMPLATE = "{SPLIT}-{SHARD_X_OF_Y}.{FILEFORMAT}"


def tfds_formats(found: Manifest) -> list[str]:
    """The shard formats TFDS can open, the one `as_dataset` reads first: TFRecord unless
    GZIP-compressed (TFDS does not read those), and ArrayRecord (`as_data_source`)."""
    return [
        f for f in found.file_formats
        if not (f == naming.TFRECORD and found.compression)
    ]  # fmt: skip


def problem(found: Manifest) -> str | None:
    """Why TFDS could not read this dataset as written, or None."""
    if not tfds_formats(found):
        return "its shards are GZIP-compressed, which TFDS does not read"
    for label in found.labels:  # converted by an older version, which let such labels in
        if naming.label_problem(label):
            return naming.label_problem(label)
    for split in found.splits:
        if naming.split_name_problem(split):
            return f"split {split!r} cannot be named in TFDS's file template"
    return None


def class_names(found: Manifest) -> list[str]:
    """The ClassLabel's names, indexed by the stored label: placeholders below the offset."""
    names = list(found.labels)
    taken, placeholders = set(names), []  # sets: a list made this quadratic in the offset
    for index in range(found.label_offset):
        name = f"offset_{index}"
        while name in taken:
            name = "_" + name
        taken.add(name)
        placeholders.append(name)
    return placeholders + names


def files(found: Manifest) -> list[tuple[str, str]]:
    """(name, text) of TFDS's metadata files, in writing order; none when `problem` says so."""
    if problem(found):
        return []
    names = class_names(found)
    return [
        (LABEL_NAMES, "".join(name + "\n" for name in names)),
        (FEATURES, json.dumps(_features(len(names)), indent=2, sort_keys=True) + "\n"),
        (DATASET_INFO, json.dumps(_dataset_info(found), indent=2, sort_keys=True) + "\n"),
    ]


def _features(num_classes: int) -> dict:
    """A FeaturesDict with one feature per key of the record format (`schema.FEATURES`)."""
    text = {"pythonClassName": _CLASS + "text_feature.Text", "text": {}}
    scalar = {
        "pythonClassName": _CLASS + "tensor_feature.Tensor",
        "tensor": {"dtype": "int64", "encoding": "none", "shape": {}},
    }
    special = {
        schema.ENCODED: {
            "pythonClassName": _CLASS + "image_feature.Image",
            "image": {
                "dtype": "uint8",
                "encodingFormat": "jpeg",
                "shape": {"dimensions": ["-1", "-1", str(schema.STORED_CHANNELS)]},
            },
        },
        schema.LABEL: {
            "pythonClassName": _CLASS + "class_label_feature.ClassLabel",
            "classLabel": {"numClasses": str(num_classes)},
        },
    }
    kinds = {schema.BYTES: text, schema.INT64: scalar}
    return {
        "pythonClassName": _CLASS + "features_dict.FeaturesDict",
        "featuresDict": {
            "features": {key: special.get(key, kinds[kind]) for key, kind in schema.FEATURES.items()}
        },
    }


def _dataset_info(found: Manifest) -> dict:
    formats = tfds_formats(found)
    return {
        "description": (
            f"Images with {len(found.labels)} labels, converted by tfrecord-pipe "
            f"{found.tool_version}. Its manifest.json is the source of truth."
        ),
        "fileFormat": formats[0],
        **({"alternativeFileFormats": formats[1:]} if formats[1:] else {}),
        "version": "1.0.0",
        "splits": [
            {
                "name": name,
                "filepathTemplate": FILEPATH_TEMPLATE,
                "numBytes": str(info.num_bytes),  # of every format: TFDS shows it as size
                "shardLengths": [str(n) for n in info.shard_lengths],
            }
            for name, info in found.splits.items()
            if info.num_examples  # a split whose every input was rejected has no shard
        ],
    }
