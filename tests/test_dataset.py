"""dataset.py: what a dataset folder or a file pattern holds, worked out once for every tool."""

import dataclasses
import pathlib

import pytest
import tensorflow as tf

from tfrecord_pipe._core import manifest, naming
from tfrecord_pipe._reading import dataset

from dataset_factory import write_dataset


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """train: 2 shards (3 + 2 records); validation: 1 shard (2 records); GZIP."""
    path = str(tmp_path_factory.mktemp("dataset") / "ds")
    write_dataset(path, {"train": [[0, 1, 2], [1, 0]], "validation": [[2, 2]]}, compression="GZIP")
    return path


def test_a_folder_is_its_manifests_splits_files_and_counts(folder):
    found = dataset.resolve(folder + "/")
    assert not found.is_pattern
    assert list(found.splits) == ["train", "validation"]
    train = found.splits["train"]
    assert train.files == (
        f"{folder}/train-00000-of-00002.tfrecord.gz", f"{folder}/train-00001-of-00002.tfrecord.gz"
    )
    assert train.record_counts == (3, 2) and train.num_examples == 5
    assert found.compression == "GZIP" and found.labels == ("red", "green", "blue")
    assert found.manifest.label_offset == 1
    assert len(found.files) == 3 and found.record_counts == (3, 2, 2)


def test_a_pattern_groups_its_files_by_split_and_takes_counts_from_the_manifest_beside(folder):
    found = dataset.resolve(f"{folder}/*.tfrecord.gz")
    assert found.is_pattern
    assert {name: split.record_counts for name, split in found.splits.items()} == {
        "train": (3, 2), "validation": (2,)
    }
    assert found.everything().num_examples == 7
    with pytest.raises(ValueError, match="drop split or pass the dataset folder"):
        found.split("train")


def test_a_pattern_of_files_from_several_folders_has_no_counts(tmp_path):
    for name in ("a", "b"):
        write_dataset(str(tmp_path / name), {"train": [[0, 1]]})
    found = dataset.resolve(f"{tmp_path}/*/train-*")
    assert len(found.files) == 2 and found.record_counts is None and found.manifest is None
    assert found.compression == ""


def test_a_link_in_a_loop_beside_the_shards_hides_none_of_them(tmp_path):
    # Listing the folder raised ELOOP at the link, and the whole listing was dropped: every
    # shard was "missing", and a pattern "matched no files" (a helper's trial).
    write_dataset(str(tmp_path), {"train": [[0, 1], [2]]})
    (tmp_path / "x1").symlink_to("x2")
    (tmp_path / "x2").symlink_to("x1")
    assert dataset.resolve(str(tmp_path)).splits["train"].record_counts == (2, 1)
    assert len(dataset.resolve(f"{tmp_path}/train-*").files) == 2
    # The job's listing (verify's check for stray shards, a conversion's output) raised there.
    from beam_jobs import storage

    assert storage.children(str(tmp_path))[1] >= {"x1", "x2", "manifest.json"}


def test_files_named_otherwise_are_one_group(tmp_path):
    write_dataset(str(tmp_path), {"train": [[0]]})
    (tmp_path / "train-00000-of-00001.tfrecord").rename(tmp_path / "mine.tfrecord")
    assert list(dataset.resolve(f"{tmp_path}/*.tfrecord").splits) == ["files"]


def test_the_label_offset_is_the_manifests_or_given_never_guessed(folder, tmp_path):
    with_manifest = dataset.resolve(folder)
    assert dataset.label_offset(with_manifest, None) == 1
    assert dataset.label_offset(with_manifest, 1) == 1
    with pytest.raises(ValueError, match="says its labels were written with offset 1"):
        dataset.label_offset(with_manifest, 0)
    write_dataset(str(tmp_path), {"train": [[0]]}, label_offset=0)
    tf.io.gfile.remove(f"{tmp_path}/manifest.json")
    bare = dataset.resolve(f"{tmp_path}/train-*")
    assert dataset.label_offset(bare, 0) == 0
    with pytest.raises(ValueError, match="label offset is unknown. Pass label_offset"):
        dataset.label_offset(bare, None)


def test_label_names_are_the_manifests(folder, tmp_path):
    assert dataset.label_names(folder) == ("red", "green", "blue")
    as_path = pathlib.Path(folder)  # failed at a string method ("no attribute 'rstrip'")
    assert dataset.label_names(as_path) == ("red", "green", "blue")
    assert dataset.resolve(as_path) == dataset.resolve(folder)
    assert dataset.read_manifest(as_path) == dataset.read_manifest(folder)
    write_dataset(str(tmp_path), {"train": [[0]]})
    tf.io.gfile.remove(f"{tmp_path}/manifest.json")
    with pytest.raises(ValueError, match="label names are unknown"):
        dataset.label_names(f"{tmp_path}/train-*")


@pytest.mark.parametrize(
    "make, message",
    [(lambda tmp: str(tmp), "is an empty folder: not a dataset. Convert images into it"),
     (lambda tmp: (tmp / "train-00000-of-00001.tfrecord").touch() or str(tmp),
      "not a finished tfrecord-pipe dataset"),
     (lambda tmp: f"{tmp}/train-*", "matched no files"),
     # A path of no pattern "matched no files"; an image was read as records, "corrupted
     # record at 0" (a helper's trials).
     (lambda tmp: f"{tmp}/nothing", "nothing does not exist. Pass a dataset folder"),
     (lambda tmp: (tmp / "2.JPG").touch() or f"{tmp}/2.JPG",
      "matched 2.JPG: images, not shards of records. Convert their folder first")],
)  # fmt: skip
def test_what_is_not_a_dataset_says_what_to_pass(tmp_path, make, message):
    with pytest.raises(ValueError, match=message):
        dataset.resolve(make(tmp_path))


def test_a_folder_a_conversion_did_not_finish_says_to_run_it_again(tmp_path):
    # A new user's trial: `inspect` there advised reading its shards by a file pattern.
    write_dataset(str(tmp_path), {"train": [[0]]})
    tf.io.gfile.remove(f"{tmp_path}/manifest.json")
    (tmp_path / f"{naming.TEMP_PREFIX}1234").mkdir()
    with pytest.raises(ValueError, match=r"what a conversion into it that did not finish left "
                       r"\(\.tmp-1234\): run that conversion again"):  # fmt: skip
        dataset.resolve(str(tmp_path))
    (tmp_path / naming.CLAIM_NAME).write_text("{}")  # one still writing it, perhaps
    with pytest.raises(ValueError, match="a conversion may still be writing it"):
        dataset.resolve(str(tmp_path))


def test_manifests_of_version_0_1_read_with_their_flags_as_the_conversion(folder):
    found = dataset.read_manifest(folder)
    legacy = found.to_json().replace('"conversion": {}', '"options": {"jpeg_quality": 90}')
    read = manifest.Manifest.from_json(legacy)
    assert read.conversion == {"flags": {"jpeg_quality": 90}}
    assert dataclasses.replace(read, conversion={}) == found


def test_a_manifest_of_many_labels_writes_each_splits_counts_on_one_line():
    # One count a line made 20,000 lines a split at 20,000 labels, between the facts a
    # person opens manifest.json for.
    labels = tuple(f"class {i}" for i in range(20_000))
    splits = {split: manifest.SplitInfo(20_000, (20_000,), 1, 20_000, 0,
                                        (f"{split}-00000-of-00001.tfrecord",),
                                        label_counts=(1,) * 20_000)  # fmt: skip
              for split in ("train", "validation")}
    found = manifest.Manifest(labels=labels, label_offset=1, compression="", splits=splits,
                              tool_version="0.5.0")
    text = found.to_json()
    assert manifest.Manifest.from_json(text) == found
    counts = [line for line in text.splitlines() if '"label_counts"' in line]
    assert counts == ['      "label_counts": [' + ", ".join(["1"] * 20_000) + "],"] * 2
    assert len(text.splitlines()) < len(labels) + 100  # a line per label, and the facts
