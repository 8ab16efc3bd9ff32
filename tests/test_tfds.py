"""Datasets we write are readable by TensorFlow Datasets, with the real package: the metadata
it reads is made from our manifest (`core.tfds_metadata`) when a dataset is finalised."""

import json

import pytest
import tensorflow_datasets as tfds

from beam_jobs import convert
from tfrecord_pipe._core import tfds_metadata
from tfrecord_pipe._core.manifest import Manifest, SplitInfo
from tfrecord_pipe._reading import dataset

from helpers import IN_PROCESS, run_cli, write_image_folder

LABEL = "image/class/label"


def read_with_tfds(folder) -> dict[str, list[tuple[str, str]]]:
    """Per split, (file name, label name) of every record, as TFDS yields them."""
    builder = tfds.builder_from_directory(str(folder))
    names = builder.info.features[LABEL]
    return {
        split: sorted(
            (example["image/filename"].decode(), names.int2str(int(example[LABEL])))
            for example in tfds.as_numpy(builder.as_dataset(split=split))
        )
        for split in builder.info.splits
    }


def expected_records(src) -> list[tuple[str, str]]:
    return sorted((f"{p.parent.name}/{p.name}", p.parent.name) for p in src.rglob("*.jpg"))


@pytest.mark.slow
@pytest.mark.parametrize("offset", ["1", "0", "3"])
def test_tfds_reads_every_record_of_every_split_with_its_label_name(tmp_path, offset):
    src = write_image_folder(tmp_path / "src", per_label=4)
    out = tmp_path / "out"
    written = convert.run([str(src), str(out), "--validation_fraction", "0.4",
                           "--label_offset", offset, "--num_shards", "2", *IN_PROCESS])  # fmt: skip
    by_split = read_with_tfds(out)
    assert set(by_split) == {"train", "validation"}
    for split, records in by_split.items():
        assert len(records) == written.splits[split].num_examples
    assert sorted(r for records in by_split.values() for r in records) == expected_records(src)
    builder = tfds.builder_from_directory(str(out))
    assert builder.info.features[LABEL].names[int(offset):] == list(written.labels)
    assert builder.info.splits["train"].shard_lengths == list(written.splits["train"].shard_lengths)
    assert run_cli("verify", src, out).returncode == 0


@pytest.mark.slow
def test_metadata_edited_or_gone_is_found_by_verify_and_overwrite_leaves_none_stale(tmp_path):
    src = write_image_folder(tmp_path / "src", per_label=2)
    out = tmp_path / "out"
    convert.run([str(src), str(out), *IN_PROCESS])
    info = json.loads((out / tfds_metadata.DATASET_INFO).read_text())
    info["splits"][0]["shardLengths"] = ["1"]
    (out / tfds_metadata.DATASET_INFO).write_text(json.dumps(info))
    (out / tfds_metadata.LABEL_NAMES).unlink()
    report = run_cli("verify", src, out)
    assert report.returncode == 1
    assert f"{tfds_metadata.DATASET_INFO}: does not say what manifest.json says" in report.stdout
    assert f"{tfds_metadata.LABEL_NAMES}: missing" in report.stdout
    # Replaced by a GZIP dataset, which TFDS cannot read: no metadata of the old one is left.
    convert.run([str(src), str(out), "--overwrite", "--compress", *IN_PROCESS])
    assert not any((out / name).exists() for name in tfds_metadata.FILES)
    assert run_cli("verify", src, out).returncode == 0


def manifest_of(labels, offset=1, compression="", splits=("train",)) -> Manifest:
    info = SplitInfo(num_examples=2, shard_lengths=(2,), num_bytes=10, listed=2, rejected=0,
                     files=("train-00000-of-00001.tfrecord",))  # fmt: skip
    return Manifest(labels=tuple(labels), label_offset=offset, compression=compression,
                    splits={split: info for split in splits})  # fmt: skip


def test_placeholder_names_below_the_offset_never_take_a_label_name():
    names = tfds_metadata.class_names(manifest_of(["offset_0", "cat"], offset=2))
    assert names == ["_offset_0", "offset_1", "offset_0", "cat"]
    assert len(set(names)) == len(names)


@pytest.mark.parametrize(
    "found, why",
    [(manifest_of(["cat"], compression="GZIP"), "GZIP"),
     (manifest_of(["cat ", "dog"]), "spaces at its ends"),
     (manifest_of(["x\ry", "z"]), "line break"),  # TFDS would read names x, y, z
     (manifest_of(["\ufeffcat", "dog"]), "byte-order mark")],
)  # fmt: skip
def test_what_tfds_cannot_read_gets_no_metadata_and_a_reason(found, why):
    assert why in tfds_metadata.problem(found)
    assert tfds_metadata.files(found) == []


def test_a_dataset_written_by_hand_is_readable_by_tfds_too(tmp_path):
    # dataset.write_manifest writes the same descriptions as the converter.
    from dataset_factory import write_dataset

    write_dataset(str(tmp_path), {"train": [[0, 1], [2]], "validation": [[1]]})
    found = dataset.read_manifest(str(tmp_path))
    by_split = read_with_tfds(tmp_path)
    assert {split: len(r) for split, r in by_split.items()} == {"train": 3, "validation": 1}
    assert sorted(label for _, label in by_split["train"]) == sorted(
        found.labels[i] for i in (0, 1, 2)
    )


@pytest.mark.slow
def test_a_test_split_keeps_its_place_and_verify_agrees(tmp_path):
    # The manifest's JSON sorts keys (test, train, validation); the metadata written in split
    # order then differed from the one made from a manifest read back, and verify failed.
    for split in ("train", "validation", "test"):
        write_image_folder(tmp_path / "src" / split, per_label=2)
    out = tmp_path / "out"
    convert.run([str(tmp_path / "src"), str(out), *IN_PROCESS])
    assert list(dataset.read_manifest(str(out)).splits) == ["train", "validation", "test"]
    assert run_cli("verify", tmp_path / "src", out).returncode == 0
    assert len(read_with_tfds(out)["test"]) == 6
