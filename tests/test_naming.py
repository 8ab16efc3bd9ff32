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
