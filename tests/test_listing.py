"""listing.py: every file under a folder, once, literally; what cannot be read says why."""

import os

import pytest

from beam_jobs import listing
from tfrecord_pipe._core import images

from helpers import jpeg_bytes


def entries(root) -> dict[str, tuple | None]:
    """relpath -> (reason, detail) or None, of everything listed under `root`."""
    found = list(listing.walk(str(root)))
    assert len({entry.relpath for entry in found}) == len(found), "a path listed twice"
    return {entry.relpath: entry.problem for entry in found}


def write(path, data=b"x"):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def test_links_to_folders_and_files_are_followed(tmp_path):
    outside = tmp_path / "elsewhere"
    write(outside / "cats" / "1.jpg")
    write(outside / "solo.jpg")
    root = tmp_path / "src"
    write(root / "dogs" / "1.jpg")
    os.symlink(outside / "cats", root / "cats")  # a label folder that is a link
    os.symlink(outside / "solo.jpg", root / "dogs" / "2.jpg")
    assert entries(root) == {"cats/1.jpg": None, "dogs/1.jpg": None, "dogs/2.jpg": None}


def test_a_broken_link_and_a_fifo_are_listed_with_their_problem(tmp_path):
    root = tmp_path / "src"
    write(root / "dogs" / "1.jpg")
    os.symlink(tmp_path / "gone.jpg", root / "dogs" / "2.jpg")
    os.mkfifo(root / "dogs" / "3.jpg")
    os.symlink("5.jpg", root / "dogs" / "4.jpg")  # two links to each other: said as a loop
    os.symlink("4.jpg", root / "dogs" / "5.jpg")
    found = entries(root)
    assert found["dogs/1.jpg"] is None
    assert found["dogs/2.jpg"][0] == images.UNREADABLE and "broken symlink" in found["dogs/2.jpg"][1]
    assert found["dogs/3.jpg"] == (images.NOT_A_FILE, "a FIFO, not a regular file: not read")
    assert found["dogs/4.jpg"] == (
        images.UNREADABLE, "a symlink to '5.jpg' in a loop of links: not read"
    )


def test_a_cycle_is_listed_once_and_said(tmp_path):
    root = tmp_path / "src"
    write(root / "dogs" / "1.jpg")
    os.symlink(root, root / "dogs" / "again")  # back to the top
    os.symlink(root / "dogs", root / "alias")  # a second way into dogs/
    found = entries(root)
    assert found["dogs/1.jpg"] is None
    assert found["dogs/again"][0] == images.DUPLICATE
    assert "the input folder itself" in found["dogs/again"][1]
    assert found["alias"] == (images.DUPLICATE, "a link to a folder listed already (dogs); not followed again")
    assert len(found) == 3


def test_a_file_reached_twice_is_kept_once_where_it_lies(tmp_path):
    root = tmp_path / "src"
    write(root / "dogs" / "1.jpg")
    write(tmp_path / "outside.jpg")
    os.symlink(root / "dogs" / "1.jpg", root / "dogs" / "0-link.jpg")  # sorts first
    os.symlink(tmp_path / "outside.jpg", root / "dogs" / "a.jpg")
    os.symlink(tmp_path / "outside.jpg", root / "dogs" / "b.jpg")
    found = entries(root)
    assert found["dogs/1.jpg"] is None and found["dogs/a.jpg"] is None
    assert found["dogs/0-link.jpg"][0] == images.DUPLICATE
    assert "the same file as dogs/1.jpg" in found["dogs/0-link.jpg"][1]
    assert found["dogs/b.jpg"][0] == images.DUPLICATE and "dogs/a.jpg is kept" in found["dogs/b.jpg"][1]


def test_names_are_literal_never_patterns(tmp_path):
    write(tmp_path / "set[1]" / "cats" / "a.jpg")
    write(tmp_path / "set1" / "cats" / "b.jpg")  # what the pattern set[1] would match
    write(tmp_path / "set[1]" / "cats" / "*.jpg")
    assert entries(tmp_path / "set[1]") == {"cats/a.jpg": None, "cats/*.jpg": None}


def test_the_listing_is_the_same_every_time(tmp_path):
    root = tmp_path / "src"
    for name in ("b", "a", "c"):
        write(root / name / "1.jpg", jpeg_bytes())
    first = [entry.relpath for entry in listing.walk(str(root))]
    assert first == sorted(first) == [entry.relpath for entry in listing.walk(str(root) + "/")]


@pytest.mark.slow
def test_a_gcs_folder_is_listed_literally_without_folder_markers(gcs):
    from google.cloud import storage

    bucket = storage.Client().bucket(gcs.bucket)
    for name in ("list/set[1]/cats/a.jpg", "list/set1/cats/b.jpg", "list/set[1]/cats/"):
        bucket.blob(name).upload_from_string(b"x" if not name.endswith("/") else b"")
    found = list(listing.walk(gcs.url("list", "set[1]")))
    assert [entry.relpath for entry in found] == ["cats/a.jpg"]


@pytest.mark.slow
def test_a_gcs_folder_streams_page_by_page_the_entries_beam_lists(gcs, monkeypatch):
    # gs:// is listed a page at a time (ten million objects listed whole would hold
    # gigabytes); what comes out must be what Beam's whole listing gives, markers left out.
    from google.cloud import storage

    bucket = storage.Client().bucket(gcs.bucket)
    names = ["b/z.jpg", "a/1.jpg", "a/10.jpg", "a/2.jpg", "a/ü.jpg", "a/", "c d/e[1].jpg"]
    for name in names:
        bucket.blob(f"pages/{name}").upload_from_string(b"" if name.endswith("/") else b"xy")
    monkeypatch.setattr(listing, "GCS_PAGE", 2)
    root = gcs.url("pages")
    streamed = [(e.path, e.relpath) for e in listing.walk(root)]
    whole = sorted((m.path, m.path[len(root) + 1:])
                   for m in listing.matching_below(root) if not m.path.endswith("/"))  # fmt: skip
    assert streamed == whole and len(streamed) == 6


def test_a_gcs_listing_that_fails_midway_is_a_storage_error_naming_the_folder(monkeypatch):
    # Pages are fetched as the walk goes on: an outage or an expired token hours into a run
    # must read as the storage failing (OSError, as Beam's listing raised), not crash with
    # the client library's own error types. (The failure is staged: a real outage cannot be.)
    import google.api_core.exceptions

    from beam_jobs import storage

    class Blob:
        name, size = "pages/a.jpg", 3

    class Client:
        def list_blobs(self, bucket, prefix, page_size, retry=None):
            yield Blob()
            raise google.api_core.exceptions.ServiceUnavailable("try again later")

    monkeypatch.setattr(storage, "gcs_client", Client)
    walked = listing.walk("gs://bucket/pages")
    assert next(walked).relpath == "a.jpg"
    with pytest.raises(OSError, match="Listing gs://bucket/pages failed: ServiceUnavailable"):
        next(walked)
