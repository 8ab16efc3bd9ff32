"""naming.py: shard file names are made and read back by the same rules."""

import pytest

from tfrecord_pipe._core import naming


def test_shard_names_follow_the_design_and_read_back():
    assert naming.shard_name("train", 3, 16, False) == "train-00003-of-00016.tfrecord"
    name = naming.shard_name("validation", 0, 2, True)
    assert name == "validation-00000-of-00002.tfrecord.gz"
    assert naming.split_of(f"gs://bucket/data/{name}") == "validation"
    assert naming.split_of("my-split-00000-of-00001.tfrecord") == "my-split"
    assert naming.split_of("gs://b/imagenet/train-00012-of-01024") == "train"  # Cloud TPU


@pytest.mark.parametrize(
    "name", ["train.tfrecord", "train-0-of-1.tfrecord", "notes.txt", "train-00000-of-00001.txt"]
)
def test_names_the_converter_does_not_make_have_no_split(name):
    assert naming.split_of(name) is None


def test_compression_is_gzip_only_when_every_name_says_so():
    assert naming.compression_of(["a.tfrecord.gz", "b.tfrecord.gz"]) == naming.GZIP
    assert naming.compression_of(["a.tfrecord.gz", "b.tfrecord"]) == ""
    assert naming.compression_of([]) == ""


@pytest.mark.parametrize("split", ["train", "val_2", "hold-out"])
def test_split_names_that_can_be_part_of_file_names_are_fine(split):
    assert naming.split_name_problem(split) is None


@pytest.mark.parametrize("split", ["../train", "train old", "", "tr/ain", "trаin"])  # Cyrillic а
def test_other_split_names_are_refused_saying_what_to_use(split):
    assert "letters, digits, '_' and '-' only" in naming.split_name_problem(split)


def test_splits_sort_train_validation_test_then_by_name():
    names = ["zeta", "test", "alpha", "validation", "train"]
    assert sorted(names, key=naming.split_order) == ["train", "validation", "test", "alpha", "zeta"]


def test_a_manifest_may_list_its_splits_shard_names_and_no_path():
    # --overwrite deletes what a manifest lists, and readers open it: an edited `../notes.txt`
    # was deleted outside the dataset. Split names of 0.1's first days (`val 2017`) still read.
    for split, file_format in (("train", naming.TFRECORD), ("val 2017", naming.ARRAY_RECORD)):
        names = [naming.shard_name(split, i, 3, False, file_format) for i in range(3)]
        assert naming.manifest_split_problem(split, names) is None
    assert naming.manifest_split_problem("train", ["train-00000-of-00001.tfrecord.gz"]) is None
    for split, name in (("train", "../notes.txt"), ("train", "/tmp/x"), ("a", "b-00000-of-00001"),
                        ("train", "validation-00000-of-00001.tfrecord"), ("x.y", "xzy-00000-of-00001"),
                        ("../up", "../up-00000-of-00001.tfrecord"), ("a\\b", "a\\b-00000-of-00001")):
        assert naming.manifest_split_problem(split, [name]) is not None, (split, name)


def test_a_missing_validation_split_says_how_to_convert_one():
    # A dataset converted without --validation_fraction has no validation split: "pass
    # split= one of those" offered train alone, to evaluate on what was trained on.
    said = naming.no_such_split("ds", "validation", ["train"])
    assert said.startswith("ds has no split 'validation'; it has ['train']: pass split=")
    assert "convert again with --validation_fraction" in said
    assert "convert again" not in naming.no_such_split("ds", "validation", ["train", "val"])
    assert "convert again" not in naming.no_such_split("ds", "test", ["train"])
