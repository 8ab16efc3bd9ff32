"""paths.py: local and remote paths by the same rules."""

import os

import pytest

from tfrecord_pipe._core import paths


@pytest.mark.parametrize(
    "path, remote",
    [("gs://b/x", True), ("s3://b/x", True), ("hdfs://n/x", True), ("/data/x", False),
     ("data/x", False), ("c:/x", False), ("./gs://x", False)],
)  # fmt: skip
def test_a_path_is_remote_when_it_names_a_scheme(path, remote):
    assert paths.is_remote(path) is remote


@pytest.mark.parametrize(
    "path, folder",
    [("out/", "out"), ("out//", "out"), ("/data/", "/data"), ("/", "/"), ("///", "/"),
     ("gs://b/d/", "gs://b/d"), ("gs://b/", "gs://b"), ("gs://", "gs://"), ("", "")],
)  # fmt: skip
def test_folder_drops_trailing_slashes_but_keeps_a_root(path, folder):
    assert paths.folder(path) == folder


def test_join_puts_one_slash_between_parts():
    assert paths.join("gs://b/d/", "x", "y.txt") == "gs://b/d/x/y.txt"
    assert paths.join("out", "manifest.json") == "out/manifest.json"


def test_inside_compares_whole_folder_names_and_follows_symlinks(tmp_path):
    (tmp_path / "images").mkdir()
    (tmp_path / "images2").mkdir()
    os.symlink(tmp_path / "images", tmp_path / "link")
    assert paths.is_inside(str(tmp_path / "images" / "out"), str(tmp_path / "images"))
    assert paths.is_inside(str(tmp_path / "link" / "out"), str(tmp_path / "images/"))
    assert not paths.is_inside(str(tmp_path / "images2"), str(tmp_path / "images"))
    # A folder elsewhere, reached through a link inside the parent: a listing gets to it.
    os.symlink(tmp_path / "images2", tmp_path / "images" / "away")
    assert paths.is_inside(str(tmp_path / "images" / "away"), str(tmp_path / "images"))
    assert paths.is_inside("gs://b/images/out", "gs://b/images/")
    assert not paths.is_inside("gs://b/images2", "gs://b/images")


def test_only_local_folders_are_made(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    paths.make_local_folder("a/b")
    paths.make_local_folder("s3://bucket/dataset")  # an object store has no folders
    assert (tmp_path / "a" / "b").is_dir()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a"]  # no local "s3:" folder
