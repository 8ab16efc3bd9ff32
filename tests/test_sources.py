"""sources.py and csv_lists.py: what the job takes as its inputs, and the rules a user can
rely on (layout, CSV headers, one record per file however its path is spelled); `verify`
lists the same way."""

import collections
import functools
import json
import os
import socket
import subprocess
import tempfile
from concurrent import futures

import pytest

from beam_jobs import convert, csv_lists, record_reader, sources, storage
from beam_jobs.config import ConvertConfig
from beam_jobs.source_file import split_by_hash
from tfrecord_pipe._core import images, naming, schema
from tfrecord_pipe._tools import verify

from helpers import (COLOURS, IN_PROCESS, jpeg_bytes, open_under, run_cli, verified_both_ways,
                     write_image_folder)


def convert_(*argv):
    return convert.run([str(arg) for arg in argv] + IN_PROCESS)


def rejected_lines(out) -> list[dict]:
    return [json.loads(line) for f in sorted(out.glob("rejected/*.jsonl")) for line in f.open()]


def resolved(source, **options) -> ConvertConfig:
    return sources.resolve_layout(ConvertConfig(source=str(source), output="unused", **options))


@pytest.mark.parametrize(
    "first_line, header",
    [("path,label", "yes"), ("file_name,class", "yes"), ("\ufeffimage path,category", "yes"),
     ("a.jpg,red", "no"), ("missing.jpg,red", "no"), ("imgs/x,red", "no"), ("a,red", "no"),
     ("images,label", "yes")],
)  # fmt: skip
def test_only_a_first_line_that_names_no_file_and_looks_like_a_name_is_a_header(
    tmp_path, first_line, header
):
    (tmp_path / "a.jpg").write_bytes(jpeg_bytes())
    (tmp_path / "a").write_bytes(jpeg_bytes())  # a file named like a column
    (tmp_path / "images").mkdir()  # a folder named like one: `images,label` was taken for data
    (tmp_path / "list.csv").write_text(first_line + "\na.jpg,green\n", encoding="utf-8")
    config = resolved(tmp_path / "list.csv")
    assert config.csv_header == header
    # The job's first line says which line it took for a header (the line is not an input,
    # nor a rejection, and was dropped unseen), and how to read it as data.
    said = sources.layout_said(config, asked_header="auto")
    if header == "yes":
        assert said == (f"csv layout; line 1 ({first_line.lstrip(chr(0xFEFF))!r}) read as a "
                        "header: --csv_header no if it lists an input")  # fmt: skip
    else:
        assert said == "csv layout"
    told = resolved(tmp_path / "list.csv", csv_header="yes")
    assert sources.layout_said(told, asked_header="yes") == "csv layout"


def test_a_long_first_line_taken_for_a_header_is_shown_cut(tmp_path):
    # A 60 KB header was one 60 KB log line.
    (tmp_path / "a.jpg").write_bytes(jpeg_bytes())
    (tmp_path / "list.csv").write_text("path" + "_" * 60000 + ",label\na.jpg,red\n")
    said = sources.layout_said(resolved(tmp_path / "list.csv"), asked_header="auto")
    assert said.startswith("csv layout; line 1 ('path____") and "'...) read as a header" in said
    assert len(said) < 200


@pytest.mark.slow
def test_a_bom_a_header_and_data_lines_named_like_columns(tmp_path):
    # A BOM and an unexpected header used to become a class of their own; a data line whose
    # path is "image" used to vanish.
    for name in ("image", "a.jpg", "b.jpg"):
        (tmp_path / name).write_bytes(jpeg_bytes(8, 8, COLOURS["red"]))
    lines = ["file_name,class", "a.jpg,red", "image,red", "b.jpg,green", "path,green"]
    (tmp_path / "list.csv").write_bytes(("\ufeff" + "\n".join(lines) + "\n").encode())
    result = convert_(tmp_path / "list.csv", tmp_path / "out")
    assert result.labels == ("green", "red")
    assert result.splits["train"].num_examples == 3  # a.jpg, image, b.jpg
    (line,) = rejected_lines(tmp_path / "out")  # "path": a data line, and no such file
    assert line["relpath"] == "path" and line["reason"] == images.UNREADABLE
    assert result.conversion["csv_header"] == "yes"
    assert run_cli("verify", tmp_path / "list.csv", tmp_path / "out").returncode == 0


@pytest.mark.slow
def test_one_file_spelled_five_ways_is_one_record_and_four_rejections(tmp_path):
    (tmp_path / "imgs" / "x").mkdir(parents=True)
    (tmp_path / "imgs" / "a.jpg").write_bytes(jpeg_bytes(8, 8, COLOURS["red"]))
    spellings = ["imgs/a.jpg", "./imgs/a.jpg", "imgs/x/../a.jpg", "imgs//a.jpg",
                 str(tmp_path / "imgs" / "a.jpg")]  # fmt: skip
    lines = [f"{path},red,{split}" for path, split in zip(spellings, ["train", "validation"] * 3)]
    (tmp_path / "list.csv").write_text("\n".join(lines) + "\n")
    result = convert_(tmp_path / "list.csv", tmp_path / "out")
    written = sum(info.num_examples for info in result.splits.values())
    assert written == 1 and result.splits["train"].num_examples == 1  # train kept
    assert result.rejected_reasons == {images.DUPLICATE: 4}
    assert {line["relpath"] for line in rejected_lines(tmp_path / "out")} == {"imgs/a.jpg"}
    verified = run_cli("verify", tmp_path / "list.csv", tmp_path / "out")
    assert verified.returncode == 0, verified.stdout


@pytest.mark.parametrize("first", [True, False])
def test_of_a_file_listed_with_and_without_a_label_the_labelled_line_is_kept(tmp_path, first):
    # `b.jpg,,train` sorted before `b.jpg,x,train`: the file was rejected no_label and the
    # line that labels it rejected as a duplicate of that one.
    lines = ["b.jpg,,train", "b.jpg,x,train"]
    (tmp_path / "b.jpg").write_bytes(jpeg_bytes())
    (tmp_path / "list.csv").write_text("\n".join(lines if first else lines[::-1]) + "\n")
    config = resolved(tmp_path / "list.csv", csv_header="no")
    listed = list(csv_lists.kept_once(sources.list_sources(config), str(tmp_path)))
    assert [(s.label, s.problem and s.problem[0]) for s in listed] == [
        ("x", None), (None, images.DUPLICATE)
    ]  # fmt: skip


@pytest.mark.parametrize("beam_args", [[], IN_PROCESS], ids=["local_engine", "beam"])
def test_of_a_file_listed_with_a_label_the_labels_file_has_not_that_listing_is_dropped(
    tmp_path, beam_args
):
    # `b.jpg,a,train` sorted before `b.jpg,x,train`: with "a" not in the labels file, the
    # file was rejected unknown_label and the usable line rejected as a duplicate of it.
    (tmp_path / "b.jpg").write_bytes(jpeg_bytes())
    (tmp_path / "list.csv").write_text("b.jpg,x,train\nb.jpg,a,train\n")
    (tmp_path / "labels.txt").write_text("x\n")
    result = convert.run([str(tmp_path / "list.csv"), str(tmp_path / "out"), "--labels_file",
                          str(tmp_path / "labels.txt"), *beam_args])  # fmt: skip
    assert result.splits["train"].num_examples == 1
    assert [(line["reason"], line["error"]) for line in rejected_lines(tmp_path / "out")] == [
        (images.DUPLICATE, "the same file as b.jpg is listed 2 times; this listing (label 'a', "
         "split 'train') is dropped; kept the listing 'b.jpg' with label 'x' in split 'train'. "
         "Remove the extra lines.")
    ]  # fmt: skip
    if beam_args:  # one engine is enough for verify: it judges the dataset, not the engine
        report = verified_both_ways(tmp_path / "list.csv", tmp_path / "out")
        assert report.ok, report.problems


def test_a_line_without_a_path_is_rejected_not_dropped(tmp_path):
    (tmp_path / "list.csv").write_text("a.jpg,red\n,red\n\n")
    listed = list(sources.list_sources(resolved(tmp_path / "list.csv", csv_header="no")))
    assert [(s.relpath, s.problem and s.problem[0]) for s in listed] == [
        ("a.jpg", None), (",red", images.UNREADABLE)
    ]  # the blank line is no data


@pytest.mark.parametrize("names", [("train", "validation"), ("train",), ("train", "test"),
                                   ("train", "val"), ("train", "valid", "test1")])
def test_split_folders_are_taken_as_splits_only_when_every_folder_is_one(tmp_path, names):
    # Imagenette's train/ and val/ were refused as "is 'train' a label or a split?".
    for name in names:
        write_image_folder(tmp_path / "src" / name, per_label=1)
    assert resolved(tmp_path / "src").layout == "splits"
    assert {s.split for s in sources.list_sources(resolved(tmp_path / "src"))} == set(names)


def test_a_flat_split_beside_labelled_ones_is_converted_with_its_images_rejected(tmp_path):
    # ImageNet: train/<synset>/*.JPEG beside val/*.JPEG (labels in another file); an
    # unlabelled test/ beside train/ and validation/. The labelled splits are converted, the
    # flat one's images rejected `no_label` (and a warning says its split has no record).
    write_image_folder(tmp_path / "train", per_label=1, labels=("n01440764",))
    (tmp_path / "val").mkdir()
    (tmp_path / "val" / "ILSVRC2012_val_00000001.JPEG").write_bytes(jpeg_bytes())
    assert resolved(tmp_path).layout == "splits"
    listed = {s.relpath: s.label for s in sources.list_sources(resolved(tmp_path))}
    assert listed == {"train/n01440764/000.jpg": "n01440764",
                      "val/ILSVRC2012_val_00000001.JPEG": None}  # fmt: skip


def test_a_label_folders_own_sub_folders_are_part_of_it(tmp_path):
    # As docs/conversion.md says, and Keras's image_dataset_from_directory does.
    for relpath in ("cats/1.jpg", "cats/kittens/2.jpg", "cats/a/b/3.jpg", "dogs/4.jpg"):
        (tmp_path / "in" / relpath).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "in" / relpath).write_bytes(jpeg_bytes())
    listed = {s.relpath: s.label for s in sources.list_sources(resolved(tmp_path / "in"))}
    assert listed == {"cats/1.jpg": "cats", "cats/kittens/2.jpg": "cats",
                      "cats/a/b/3.jpg": "cats", "dogs/4.jpg": "dogs"}  # fmt: skip
    (tmp_path / "in").rename(tmp_path / "train")
    (tmp_path / "in").mkdir()
    (tmp_path / "train").rename(tmp_path / "in" / "train")
    listed = {s.relpath: (s.label, s.split)
              for s in sources.list_sources(resolved(tmp_path / "in"))}  # fmt: skip
    assert listed["train/cats/kittens/2.jpg"] == listed["train/cats/a/b/3.jpg"] == ("cats", "train")


def test_a_label_named_like_a_split_among_others_is_refused_with_what_to_pass(tmp_path):
    # It used to switch to split folders, reject every image and exit 0 with nothing written.
    write_image_folder(tmp_path / "src", per_label=1, labels=("train", "cats", "dogs"))
    with pytest.raises(ValueError, match="is 'train' a label or a split.*--layout labels"):
        resolved(tmp_path / "src")
    assert resolved(tmp_path / "src", layout="labels").layout == "labels"


@pytest.mark.parametrize("make", [lambda tmp: tmp / "photo.jpg", lambda tmp: tmp / "none"])
def test_a_source_that_is_a_file_or_missing_says_what_to_give(tmp_path, make):
    (tmp_path / "photo.jpg").write_bytes(jpeg_bytes())
    with pytest.raises((ValueError, FileNotFoundError), match="folder"):
        resolved(make(tmp_path))


@pytest.mark.slow
def test_brackets_in_paths_are_characters_everywhere(tmp_path):
    # `convert 'set[1]' OUT` used to convert the sibling folder set1, and an OUT with brackets
    # crashed after loading everything.
    write_image_folder(tmp_path / "set[1]", per_label=2)
    write_image_folder(tmp_path / "set1", per_label=5)
    out = tmp_path / "out[2]"
    result = convert_(tmp_path / "set[1]", out)
    assert result.splits["train"].num_examples == 6
    assert convert_(tmp_path / "set[1]", out, "--overwrite").splits["train"].num_examples == 6
    assert run_cli("verify", tmp_path / "set[1]", out).returncode == 0
    inspected = run_cli("inspect", out, "--check")
    assert inspected.returncode == 0 and "train: 6 records" in inspected.stdout
    pattern = run_cli("inspect", f"{out}/train-*")
    assert pattern.returncode == 0 and "train: 6 records" in pattern.stdout


@pytest.mark.slow
def test_symlinks_broken_links_and_fifos_in_a_folder_conversion(tmp_path):
    # Linked label folders and broken links used to be left out without a word, and a FIFO
    # hung the job.
    write_image_folder(tmp_path / "elsewhere", per_label=2, labels=("green",))
    src = write_image_folder(tmp_path / "src", per_label=2, labels=("red",))
    os.symlink(tmp_path / "elsewhere" / "green", src / "green")
    os.symlink(tmp_path / "gone.jpg", src / "red" / "broken.jpg")
    os.mkfifo(src / "red" / "pipe.jpg")
    result = convert_(src, tmp_path / "out")
    assert result.labels == ("green", "red")
    assert result.splits["train"].num_examples == 4
    assert result.rejected_reasons == {images.UNREADABLE: 1, images.NOT_A_FILE: 1}
    assert run_cli("verify", src, tmp_path / "out").returncode == 0


def test_a_split_folder_linking_to_a_listed_one_is_rejected_as_a_duplicate(tmp_path):
    # The job stopped: "src/validation is not inside a split folder, but src holds split
    # folders ... move it into one" (a helper's trial).
    src = tmp_path / "src"
    write_image_folder(src / "train", per_label=2, labels=("green", "red"))
    (src / "validation").symlink_to("train")
    out = tmp_path / "out"
    result = convert_(src, out)
    assert result.splits["train"].num_examples == 4
    assert result.rejected_reasons == {images.DUPLICATE: 1}
    assert [(line["path"], line["error"]) for line in rejected_lines(out)] == [
        (f"{src}/validation", "a link to a folder listed already (train); not followed again")]
    assert run_cli("verify", src, out).returncode == 0
    # A FIFO or a broken link beside the split folders is no split folder: refused as a file
    # there is (a reviewer: they became splits of their names).
    for odd in ("fifo", "link"):
        os.mkfifo(src / odd) if odd == "fifo" else (src / odd).symlink_to(tmp_path / "nowhere")
        with pytest.raises(ValueError, match=f"{src}/{odd} is not inside a split folder"):
            convert_(src, tmp_path / f"out-{odd}", "--layout", "splits")
        (src / odd).unlink()


def test_a_temporary_folder_inside_the_input_folder_is_refused(tmp_path, monkeypatch):
    # TMPDIR inside SRC: the conversion took its own progress and sockets folders for labels
    # (warned of only as labels with no record), and verify failed a good dataset on its own
    # sort files (a helper's trial).
    src = write_image_folder(tmp_path / "src", per_label=1, odd=())
    convert_(src, tmp_path / "out")
    (src / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(src / "tmp"))
    said = f"^The temporary folder {src / 'tmp'} \\(TMPDIR\\) is inside the input folder {src}: "
    with pytest.raises(ValueError, match=said):
        convert_(src, tmp_path / "again")
    with pytest.raises(ValueError, match=said):
        verify.verify(str(src), str(tmp_path / "out"))
    assert not (tmp_path / "again").exists()
    # Reached through a link in the input: the job's sockets and progress files were listed
    # (rejected as empty files and sockets), or, at the top, made a label (a check of mine).
    (src / "tmp").rmdir()
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "elsewhere"))
    (src / "scratch").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(ValueError, match=f"{src}/scratch in the input folder is a link to "
                                         f".*, which holds the temporary folder"):  # fmt: skip
        convert_(src, tmp_path / "again")
    # A link to images kept inside the temporary folder is read.
    (src / "scratch").unlink()
    write_image_folder(tmp_path / "elsewhere" / "kept", per_label=1, labels=("blue",), odd=())
    (src / "kept").symlink_to(tmp_path / "elsewhere" / "kept" / "blue")
    assert "kept" in convert_(src, tmp_path / "linked").labels


def can_open(path: str) -> bool:
    """Whether this process may open `path` (root without CAP_SYSLOG may not open /proc/kmsg,
    although its mode says it may; opening reads nothing)."""
    try:
        os.close(os.open(path, os.O_RDONLY | os.O_NONBLOCK))
        return True
    except OSError:
        return False


@pytest.mark.slow
def test_special_files_and_files_over_the_cap_are_not_read(tmp_path):
    (tmp_path / "big.jpg").write_bytes(jpeg_bytes(64, 64, COLOURS["red"]))
    (tmp_path / "ok.jpg").write_bytes(jpeg_bytes(8, 8, COLOURS["red"]))
    # Kernel files say 0 bytes: /proc/kmsg used to end in "'NoneType' has no len()" (or to take
    # the kernel's messages from the system log), /proc/self/status to be read.
    # A socket listed by name used to be `unreadable`, with the system's "No such device".
    listening = socket.socket(socket.AF_UNIX)
    listening.bind(str(tmp_path / "sock.jpg"))
    (tmp_path / "list.csv").write_text(
        "/dev/zero,red\nbig.jpg,red\nok.jpg,red\n/proc/self/status,red\n/proc/kmsg,red\n"
        "sock.jpg,red\n"
    )
    size = (tmp_path / "big.jpg").stat().st_size
    with listening:
        result = convert_(tmp_path / "list.csv", tmp_path / "out", "--max_file_mb",
                          size / 2**20 - 1e-6)  # fmt: skip
    kmsg = images.EMPTY_FILE if can_open("/proc/kmsg") else images.UNREADABLE
    reasons = collections.Counter([images.NOT_A_FILE, images.FILE_TOO_LARGE, images.EMPTY_FILE,
                                   kmsg, images.NOT_A_FILE])  # fmt: skip
    assert result.rejected_reasons == dict(reasons)
    assert result.splits["train"].num_examples == 1
    said = (tmp_path / "out" / naming.rejected_name("train")).read_text()
    assert "kernel file" in said


def test_an_input_is_read_whole_up_to_the_cap_whatever_its_size_says(tmp_path, monkeypatch):
    # A file is read as the size it reports, plus a byte to see whether there is more: one that
    # grew since, or a filesystem that reports less than it holds, is still read whole.
    data = bytes(range(256)) * 40
    path = tmp_path / "a.jpg"
    path.write_bytes(data)
    assert storage.read_input(str(path), max_bytes=len(data)) == data
    with pytest.raises(images.Rejected, match="over the cap"):
        storage.read_input(str(path), max_bytes=len(data) - 1)
    real_fstat = os.fstat

    def under_reported(fd):
        found = real_fstat(fd)
        return os.stat_result((*found[:6], 100, *found[7:]))  # st_size 100

    monkeypatch.setattr(os, "fstat", under_reported)
    assert storage.read_input(str(path), max_bytes=len(data)) == data
    with pytest.raises(images.Rejected, match="over the cap"):
        storage.read_input(str(path), max_bytes=len(data) - 1)
    # One read gives at most 2 GiB: a larger file is read whole all the same.
    monkeypatch.setattr(os, "fstat", real_fstat)
    monkeypatch.setattr(storage, "_MOST_PER_READ", 1000)
    assert storage.read_input(str(path), max_bytes=len(data)) == data
    # Nor is a read that gives less than asked the end, before the file's size is in (a FUSE
    # mount may give 4 KiB at a time): the image was cut, and its record refused as changed.
    real_read = os.read
    monkeypatch.setattr(storage, "_MOST_PER_READ", 1 << 30)
    monkeypatch.setattr(os, "read", lambda handle, n: real_read(handle, min(n, 4096)))
    assert storage.read_input(str(path), max_bytes=len(data)) == data


@pytest.mark.parametrize(
    "content, says",
    [
        (b"path,label\na.jpg,caf\xe9\n", "line 2 is not UTF-8"),  # latin-1
        ("path,label\na.jpg,red\n".encode("utf-16"), "is UTF-16 text"),
        (b"a.jpg,red\n\x00\x01binary\n", "line 2 holds a NUL byte"),
        (b"", "lists no inputs"),
        (b"\n ,\n\n", "lists no inputs"),
        (b"path,label\n", "lists no inputs"),  # only a header
    ],
)
def test_a_csv_that_is_not_a_list_of_inputs_is_refused_before_the_job(tmp_path, content, says):
    # These used to give a codec error naming no file, a traceback from inside the job, or
    # "No such file: _summary.json" after the job had run.
    (tmp_path / "a.jpg").write_bytes(jpeg_bytes())
    (tmp_path / "list.csv").write_bytes(content)
    ran = run_cli("convert", tmp_path / "list.csv", tmp_path / "out", *IN_PROCESS)
    assert ran.returncode == 2
    assert ran.stderr.startswith(f"error: CSV list {tmp_path / 'list.csv'}") and says in ran.stderr
    assert "Traceback" not in ran.stderr and not (tmp_path / "out").exists()


def test_a_folder_of_empty_folders_writes_nothing_and_says_so(tmp_path):
    (tmp_path / "src" / "cat").mkdir(parents=True)
    (tmp_path / "src" / "dog").mkdir()
    ran = run_cli("convert", tmp_path / "src", tmp_path / "out", *IN_PROCESS)
    assert ran.returncode == 2 and "no input was found under" in ran.stderr
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_a_labels_file_that_is_not_utf8_and_an_output_that_cannot_be_made(tmp_path):
    write_image_folder(tmp_path / "src", per_label=1)
    (tmp_path / "labels.txt").write_bytes(b"caf\xe9\nred\n")
    ran = run_cli("convert", tmp_path / "src", tmp_path / "out",
                  "--labels_file", tmp_path / "labels.txt", *IN_PROCESS)  # fmt: skip
    assert ran.returncode == 2 and "labels.txt is not UTF-8 text" in ran.stderr
    (tmp_path / "file").write_text("x")
    ran = run_cli("convert", tmp_path / "src", tmp_path / "file" / "out", *IN_PROCESS)
    assert ran.returncode == 2 and ran.stderr.startswith("error: Cannot write into")


@pytest.mark.parametrize("suffix, compress", [(".gz", "gzip"), (".bz2", "bz2")])
def test_a_compressed_csv_list_and_labels_file_are_read_by_their_names(tmp_path, suffix, compress):
    # Beam's filesystems decompress a file by its name; local files no longer go through
    # them, and list.csv.gz was read as binary ("holds a NUL byte").
    import importlib

    pack = importlib.import_module(compress).compress
    for name, colour in (("a.jpg", "red"), ("b.jpg", "green")):
        (tmp_path / name).write_bytes(jpeg_bytes(8, 8, COLOURS[colour]))
    listed = tmp_path / f"list.csv{suffix}"
    listed.write_bytes(pack(b"a.jpg,red\nb.jpg,green\n"))
    labels = tmp_path / f"labels.txt{suffix}"
    labels.write_bytes(pack(b"red\ngreen\n"))  # not sorted: the file's order is kept
    out = tmp_path / "out"
    ran = run_cli("convert", listed, out, "--layout", "csv", "--labels_file", labels)
    assert ran.returncode == 0, ran.stderr
    assert (out / naming.LABELS_NAME).read_text().split() == ["red", "green"]
    assert run_cli("verify", listed, out).returncode == 0


def test_a_labels_file_from_a_pipe_is_read_and_a_folder_is_said_to_be_one(tmp_path):
    src = write_image_folder(tmp_path / "src", per_label=1, labels=("red", "green"))
    (tmp_path / "folder").mkdir()
    ran = run_cli("convert", src, tmp_path / "out", "--labels_file", tmp_path / "folder")
    assert ran.returncode == 2 and "labels.txt" not in ran.stderr
    assert f"Labels file {tmp_path / 'folder'} is a folder" in ran.stderr
    fifo = tmp_path / "labels.fifo"  # as a shell's <(printf 'green\nred\n') gives it
    os.mkfifo(fifo)
    writer = subprocess.Popen(["sh", "-c", f"printf 'green\\nred\\n' > {fifo}"])
    try:
        ran = run_cli("convert", src, tmp_path / "out", "--labels_file", fifo)
    finally:
        writer.kill()
        writer.wait()
    assert ran.returncode == 0, ran.stderr
    assert (tmp_path / "out" / naming.LABELS_NAME).read_text().split() == ["green", "red"]


def test_a_csv_whose_lines_end_in_cr_alone_is_read_line_by_line(tmp_path):
    # Old Mac spreadsheets end lines in \r: it used to end in a csv.Error traceback.
    for name in ("a.jpg", "b.jpg"):
        (tmp_path / name).write_bytes(jpeg_bytes(8, 8 + len(name), COLOURS["red"]))
    (tmp_path / "list.csv").write_bytes(b"path,label\ra.jpg,red\rb.jpg,green\r")
    config = resolved(tmp_path / "list.csv")
    assert config.csv_header == "yes"
    assert [(s.relpath, s.label) for s in sources.list_sources(config)] == [
        ("a.jpg", "red"), ("b.jpg", "green")
    ]  # fmt: skip


def test_a_csv_separated_by_semicolons_is_said_so_not_taken_for_a_folder(tmp_path):
    # Every line was rejected `no_label` "the input gives no label", and the job ended saying
    # to put the images in label sub-folders.
    (tmp_path / "a.jpg").write_bytes(jpeg_bytes(8, 8, COLOURS["red"]))
    (tmp_path / "list.csv").write_text("a.jpg;red;train\nb.jpg;green;train\n")
    [first, _] = sources.list_sources(resolved(tmp_path / "list.csv"))
    assert first.problem == (images.NO_LABEL, "the line has no label (no second column): "
                             "'a.jpg;red;train'; CSV lists are comma-separated, and it holds "
                             "';'")  # fmt: skip
    ran = run_cli("convert", tmp_path / "list.csv", tmp_path / "out")
    assert ran.returncode == 2 and ran.errors[0].endswith(
        "list.csv gave a label: write each as path,label[,split], comma-separated."
    ), ran.stderr


def test_a_csv_that_never_ends_is_refused_not_read_forever(tmp_path):
    # A link to /dev/zero or a FIFO named *.csv used to hang at the header check; a file with
    # no line end held its whole content as one line.
    (tmp_path / "zero.csv").symlink_to("/dev/zero")
    os.mkfifo(tmp_path / "fifo.csv")
    for name in ("zero.csv", "fifo.csv"):
        with pytest.raises(ValueError, match="not a regular file"):
            resolved(tmp_path / name)
    (tmp_path / "one.csv").write_bytes(b"a" * (csv_lists.MAX_CSV_LINE_BYTES + 1))
    with pytest.raises(ValueError, match="one.csv line 1 is over 65536 bytes"):
        resolved(tmp_path / "one.csv")
    # The same limit for a line that ends inside a read block (only one cut by a block's end
    # was measured).
    long_line = b"b" * (csv_lists.MAX_CSV_LINE_BYTES + 1) + b",red"
    (tmp_path / "inside.csv").write_bytes(b"a.jpg,red\n" + long_line + b"\nc.jpg,blue\n")
    with pytest.raises(ValueError, match="inside.csv line 2 is over"):
        list(csv_lists.csv_lines(str(tmp_path / "inside.csv")))
    # Counted on over read blocks: the line a person looks for.
    (tmp_path / "later.csv").write_bytes(b"a.jpg,red\n" * 150_000 + long_line)
    with pytest.raises(ValueError, match="later.csv line 150001 is over"):
        list(csv_lists.csv_lines(str(tmp_path / "later.csv")))


def test_line_ends_split_across_read_blocks_are_one_line_end(tmp_path, monkeypatch):
    monkeypatch.setattr(csv_lists, "_BLOCK_BYTES", 3)  # "\r" and "\n" in different blocks
    (tmp_path / "list.csv").write_bytes(b"a.jpg,red\r\nb.jpg,green\r\n\rc.jpg,blue")
    lines = list(csv_lists.csv_lines(str(tmp_path / "list.csv")))
    assert lines == [(1, "a.jpg,red"), (2, "b.jpg,green"), (3, ""), (4, "c.jpg,blue")]
    # A line of the longest length whose "\r" ends a block: its line end, not a byte over.
    monkeypatch.setattr(csv_lists, "MAX_CSV_LINE_BYTES", 5)
    (tmp_path / "edge.csv").write_bytes(b"a.jpg\r\nb.jpg\r\n")
    assert list(csv_lists.csv_lines(str(tmp_path / "edge.csv"))) == [(1, "a.jpg"), (2, "b.jpg")]


def _outcome(read, path):
    """What a read gives: the bytes, or the error it raises (its type, and reason if any)."""
    try:
        return read(path, 100)
    except Exception as err:  # noqa: BLE001
        return type(err).__name__, getattr(err, "reason", None)


def test_reading_ahead_passes_over_what_cannot_be_read_without_waiting(tmp_path):
    # Inputs are asked into the kernel's cache, and kept open, before they are read: that must
    # never block (a FIFO nobody writes to) nor fail (a missing file, a folder, a socket), and
    # each read from there must end as reading the unchanged file afresh ends, saying what is
    # wrong.
    os.mkfifo(tmp_path / "pipe.jpg")
    (tmp_path / "folder").mkdir()
    (tmp_path / "ok.jpg").write_bytes(b"x" * 10)
    (tmp_path / "big.jpg").write_bytes(b"x" * 101)
    (tmp_path / "empty.jpg").write_bytes(b"")
    open_before = open_under(tmp_path)
    with socket.socket(socket.AF_UNIX) as listening:
        listening.bind(str(tmp_path / "sock.jpg"))
        names = ["missing.jpg", "pipe.jpg", "folder", "sock.jpg", "ok.jpg", "big.jpg",
                 "empty.jpg", "ok.jpg", "nul\0.jpg"]  # fmt: skip
        afresh = [_outcome(storage.read_input, str(tmp_path / name)) for name in names]
        assert afresh[4] == b"x" * 10 and afresh[5] == ("Rejected", images.FILE_TOO_LARGE)
        with storage.ReadAhead(str(tmp_path / name) for name in names) as ahead:
            assert [_outcome(ahead.read, str(tmp_path / name)) for name in names] == afresh
            # Read again (one file opened ahead per listing of it): read afresh, the same.
            assert _outcome(ahead.read, str(tmp_path / "ok.jpg")) == b"x" * 10
        with storage.ReadAhead(str(tmp_path / name) for name in names) as ahead:
            pass  # none read: each closed at the end
        assert _outcome(ahead.read, str(tmp_path / "ok.jpg")) == b"x" * 10  # after: afresh
    assert open_under(tmp_path) == open_before


def test_files_read_ahead_are_each_read_once_from_many_threads(tmp_path):
    # The checks read a batch on several threads: a file opened ahead goes to one reader,
    # and every read gets its own file's bytes.
    names = [f"{i % 50}.jpg" for i in range(200)]  # each listed four times
    for i in range(50):
        (tmp_path / f"{i}.jpg").write_bytes(bytes([i]) * (1000 + i))
    open_before = open_under(tmp_path)
    with futures.ThreadPoolExecutor(8) as pool:
        for _ in range(20):
            with storage.ReadAhead(str(tmp_path / name) for name in names) as ahead:
                got = list(pool.map(lambda name: ahead.read(str(tmp_path / name), 1 << 20), names))
            assert got == [(tmp_path / name).read_bytes() for name in names]
    assert open_under(tmp_path) == open_before


def test_files_held_open_ahead_stay_few_whatever_the_number_of_batches_at_once(tmp_path):
    # Many threads each reading a batch ahead (Beam's multi-threaded local runner) must not
    # reach the limit of open files, where every other open fails: past HELD_AT_MOST a file
    # is asked for and closed, and read afresh.
    names = [f"{i}.jpg" for i in range(64 * 6)]
    for i, name in enumerate(names):
        (tmp_path / name).write_bytes(i.to_bytes(2, "big") * 50)
    open_count = functools.partial(open_under, tmp_path)
    before = open_count()
    batches = [names[i : i + 64] for i in range(0, len(names), 64)]
    aheads = [storage.ReadAhead(str(tmp_path / name) for name in batch) for batch in batches]
    assert open_count() - before == storage.HELD_AT_MOST < len(names)
    for ahead, batch in zip(aheads, batches):
        assert [ahead.read(str(tmp_path / name), 1000) for name in batch] == [
            (tmp_path / name).read_bytes() for name in batch
        ]
        ahead.close()
    assert open_count() == before
    with storage.ReadAhead(str(tmp_path / name) for name in names[:64]) as ahead:
        assert open_count() - before == 64  # what the others held is free again


@pytest.mark.parametrize("layout", ["labels", "splits"])
def test_a_records_name_leads_to_the_source_the_listing_lists_under_it(tmp_path, layout):
    # verify reads each record's source where its name says it is, and uses that check only
    # for a source listed the same (verify_beside): every plain input must be found so.
    root = tmp_path / "src"
    top = root / "train" if layout == "splits" else root
    for name in ("red/1.jpg", "red/a [b] c.jpg", "green/x/deep.jpg", "blue/é.jpg"):
        (top / name).parent.mkdir(parents=True, exist_ok=True)
        (top / name).write_bytes(jpeg_bytes())
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "2.jpg").write_bytes(jpeg_bytes())
    (top / "linked").symlink_to(tmp_path / "elsewhere")  # a label folder through a link
    config = resolved(root, validation_fraction=0.5) if layout == "labels" else resolved(root)
    assert config.layout == layout
    listed = list(sources.list_sources(config))
    assert len(listed) == 5 and {s.split for s in listed} >= {naming.TRAIN}
    find = sources.source_finder(config)
    for source in listed:
        assert find(source.relpath) == source


def test_no_source_is_looked_for_outside_the_folder_or_in_a_csv_list(tmp_path):
    (tmp_path / "src" / "red").mkdir(parents=True)
    (tmp_path / "src" / "red" / "1.jpg").write_bytes(jpeg_bytes())
    (tmp_path / "outside.jpg").write_bytes(jpeg_bytes())
    find = sources.source_finder(resolved(tmp_path / "src"))
    for name in ("../outside.jpg", "red/../../outside.jpg", "/etc/passwd", "red//1.jpg",
                 "./red/1.jpg", "", "red/", "red/1.jpg\x00x"):  # fmt: skip
        assert find(name) is None, name
    assert find("red/1.jpg").path == str(tmp_path / "src/red/1.jpg")
    (tmp_path / "list.csv").write_text("src/red/1.jpg,red\n")
    assert sources.source_finder(resolved(tmp_path / "list.csv")) is None


def as_written_by_0_4(out) -> None:
    """The dataset's manifest as 0.4 wrote it: its version, without what 0.4 did not write
    (and TFDS's metadata made from it)."""
    from tfrecord_pipe._core import manifest
    from tfrecord_pipe._reading import dataset

    written = json.loads((out / "manifest.json").read_text())
    written["tool_version"] = "0.4.0"
    for info in written["splits"].values():
        del info["label_counts"], info["shard_digests"], info["file_bytes"]
    dataset.write_manifest(str(out), manifest.Manifest.from_json(json.dumps(written)))


def filenames_in(out) -> list[str]:
    return sorted(schema.decode_example(r, label_offset=1).filename
                  for shard in out.glob("train-*") for r in record_reader.records(str(shard)))


def outside_and_its_look_alike_inside(tmp_path) -> tuple[str, str]:
    """A CSV list naming a file outside its folder and one inside that 0.4 named alike."""
    outside = tmp_path / "elsewhere" / "a.jpg"
    inside = tmp_path / "csv" / str(outside).lstrip("/")
    for path, side in ((outside, 9), (inside, 10)):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(jpeg_bytes(side, side))
    (tmp_path / "csv" / "list.csv").write_text(f"{outside},x\n{inside},y\n")
    return str(outside), str(outside).lstrip("/")


@pytest.mark.parametrize("beam_args", [[], IN_PROCESS], ids=["local_engine", "beam"])
@pytest.mark.slow  # over a second of CPU: out of the fast subset
def test_a_file_outside_the_csvs_folder_is_named_by_its_whole_path(tmp_path, beam_args):
    # It was named without its leading "/", which is also the name of a file inside the
    # folder: two records of one name, and verify failed the untouched dataset.
    outside, inside = outside_and_its_look_alike_inside(tmp_path)
    convert.run([str(tmp_path / "csv" / "list.csv"), str(tmp_path / "out"), *beam_args])
    assert filenames_in(tmp_path / "out") == sorted([outside, inside])
    report = verified_both_ways(tmp_path / "csv" / "list.csv", tmp_path / "out")
    assert report.ok, report.problems


def test_a_file_outside_the_csvs_folder_keeps_the_split_it_had(tmp_path):
    # Its split is hashed from the name 0.4 gave it: no file moves between train and
    # validation when a dataset is converted again.
    (tmp_path / "csv").mkdir()
    lines = []
    for i in range(40):
        (tmp_path / f"{i}.jpg").write_bytes(jpeg_bytes())
        lines.append(f"{tmp_path / f'{i}.jpg'},x")
    (tmp_path / "csv" / "list.csv").write_text("\n".join(lines))
    config = resolved(tmp_path / "csv" / "list.csv", validation_fraction=0.5)
    listed = list(sources.list_sources(config))
    assert [s.relpath for s in listed] == [line.split(",")[0] for line in lines]
    assert [s.split for s in listed] == [
        split_by_hash(s.relpath.lstrip("/"), 0.5) for s in listed
    ] and {s.split for s in listed} == {naming.TRAIN, naming.VALIDATION}


def test_verify_judges_a_file_outside_the_csvs_folder_by_the_name_its_version_gave(
    tmp_path, monkeypatch
):
    from tfrecord_pipe._tools import verify

    (tmp_path / "csv").mkdir()
    (tmp_path / "a.jpg").write_bytes(jpeg_bytes())
    (tmp_path / "csv" / "list.csv").write_text(f"{tmp_path / 'a.jpg'},x\n")
    old = csv_lists.named_as_before_0_5
    monkeypatch.setattr(sources, "list_sources", lambda config, list_=sources.list_sources: map(
        old, list_(config)))  # the converter of 0.4  # fmt: skip
    convert_(tmp_path / "csv" / "list.csv", tmp_path / "out")
    monkeypatch.undo()
    assert filenames_in(tmp_path / "out") == [str(tmp_path / "a.jpg").lstrip("/")]
    assert not verify.verify(str(tmp_path / "csv" / "list.csv"), str(tmp_path / "out")).ok
    as_written_by_0_4(tmp_path / "out")
    report = verified_both_ways(tmp_path / "csv" / "list.csv", tmp_path / "out")
    assert report.ok, report.problems


def test_verify_judges_a_file_listed_with_and_without_a_label_by_the_rule_of_its_version(
    tmp_path, monkeypatch
):
    # 0.4 kept the listing without a label (it sorted first): its datasets still verify.
    from tfrecord_pipe._tools import verify

    (tmp_path / "b.jpg").write_bytes(jpeg_bytes())
    (tmp_path / "c.jpg").write_bytes(jpeg_bytes(9, 9))
    (tmp_path / "list.csv").write_text("b.jpg,,train\nb.jpg,x,train\nc.jpg,x,train\n")
    before = functools.partial(csv_lists.kept_once, labelled_first=False)
    monkeypatch.setattr(csv_lists, "kept_once", before)  # the converter of 0.4
    convert_(tmp_path / "list.csv", tmp_path / "out")
    monkeypatch.undo()
    assert not verify.verify(str(tmp_path / "list.csv"), str(tmp_path / "out")).ok
    as_written_by_0_4(tmp_path / "out")
    report = verified_both_ways(tmp_path / "list.csv", tmp_path / "out")  # both drivers
    assert report.ok, report.problems


@pytest.mark.parametrize(
    "lines, says",
    [
        # A cell holding a line break (Alt+Enter in a spreadsheet) was read as two lines: the
        # file got the label's first half, and the second half became an input of its own.
        (['b.jpg,"golden', 'retriever"'], "line 2 ('b.jpg,\"golden') opens a double quote"),
        # A space before a quoted cell kept the quotes in the label: '"cat"' beside 'cat'.
        (['b.jpg, "cat"', "c.jpg,dog"], "line 2 ('b.jpg, \"cat\"') has a space before"),
        # cat train.csv validation.csv: the second file's BOM and header became data.
        (["\ufeffb.jpg,cat", "c.jpg,dog"], "line 3 ('\\ufeffb.jpg,cat') starts with a byte-order"),
        (["c.jpg,dog", "path,label", "b.jpg,cat"], "line 3 ('path,label') repeats the header"),
        # A header naming its columns in another order made labels of the splits.
        (["c.jpg,dog,train"], "names column 2 'split', which is read as the label"),
        (["c.jpg,train,dog"], "names column 1 'label', which is read as the path"),
        (["c.jpg,dog,False"], "names column 3 'is_valid', a flag; that column is read as"),
        # pandas' to_csv writes its index first: the index was read as the paths.
        (["0,c.jpg,dog"], "line 1 (',path,label') starts with a column with no name, as pandas"),
    ],
)
def test_a_csv_read_otherwise_than_its_writer_meant_is_refused_naming_the_line(
    tmp_path, lines, says
):
    (tmp_path / "b.jpg").write_bytes(jpeg_bytes())
    headers = {"c.jpg,dog,train": "path,split,label", "c.jpg,train,dog": "label,Image Path,split",
               "0,c.jpg,dog": ",path,label", "c.jpg,dog,False": "name,label,is_valid"}  # fmt: skip
    header = headers.get(lines[0], "path,label")
    if lines[0].startswith("\ufeff"):
        lines = ["a.jpg,cat", *lines]
    (tmp_path / "list.csv").write_text("\n".join([header, *lines]) + "\n", encoding="utf-8")
    with pytest.raises(ValueError) as refused:
        resolved(tmp_path / "list.csv")
    assert says in str(refused.value), str(refused.value)
    # verify reads such a list as the job that wrote the dataset did.
    sources.resolve_layout(ConvertConfig(source=str(tmp_path / "list.csv"), output="o"), False)


def test_quoted_cells_as_csv_writers_write_them_are_taken(tmp_path):
    # What Python's csv.writer writes for a comma and quotes in a path or label: a space
    # before the doubled quote inside a quoted cell is no space before a quote.
    (tmp_path / "list.csv").write_text(
        'path,label\n"photos/Smith, ""Bob"".jpg",cat\nb.jpg,"dog, ""big"""\nc.jpg,"a, b",train\n'
    )
    assert resolved(tmp_path / "list.csv").csv_header == "yes"


def test_a_validation_fraction_no_input_would_take_is_refused(tmp_path):
    (tmp_path / "list.csv").write_text("a.jpg,cat,train\nb.jpg,dog,validation\n")
    with pytest.raises(ValueError, match="--validation_fraction 0.5 does nothing here: .*every "
                                         "line of it names its split"):  # fmt: skip
        resolved(tmp_path / "list.csv", validation_fraction=0.5)
    (tmp_path / "list.csv").write_text("a.jpg,cat,train\nb.jpg,dog\n")  # b's split is drawn
    assert resolved(tmp_path / "list.csv", validation_fraction=0.5).layout == "csv"


def test_a_url_no_filesystem_here_reads_is_refused_saying_what_to_give(tmp_path):
    # Beam's own words ("Unable to get filesystem ... pip install apache-beam[gcp]") came for
    # file:// and http:// alike, for SRC and OUT; in a CSV list each such line was rejected.
    from beam_jobs import finalise

    (tmp_path / "a.jpg").write_bytes(jpeg_bytes())
    local = f"file://{tmp_path}/a.jpg"
    cases = ((local, f"is a file:// URL: give it as a local path ({tmp_path}/a.jpg)"),
             ("http://example.com/b.jpg", "nothing here reads http:// URLs"))  # fmt: skip
    for line, says in cases:
        (tmp_path / "list.csv").write_text(f"a.jpg,cat\n{line},dog\n")
        with pytest.raises(ValueError, match=f"line 2: its path '{line}'"):
            resolved(tmp_path / "list.csv")
        with pytest.raises(ValueError) as refused:
            resolved(tmp_path / "list.csv")
        assert says in str(refused.value)
    with pytest.raises(ValueError, match="SRC 'file:///data' is a file:// URL"):
        resolved("file:///data")
    with pytest.raises(ValueError, match="OUT 'ftp://host/out': nothing here reads ftp://"):
        finalise.check_output(ConvertConfig(source=str(tmp_path), output="ftp://host/out"))
    # It said Beam's Cloud Storage filesystem was not installed (a helper's trial).
    with pytest.raises(ValueError, match=r"SRC 'GS://b/imgs': write its scheme in lower case "
                                         r"\(gs://b/imgs\)\.$"):  # fmt: skip
        resolved("GS://b/imgs")
    with pytest.raises(ValueError, match=r"SRC 'gs://b//imgs' has an empty folder name \('//'\): "
                                         r"did you mean gs://b/imgs\?"):  # fmt: skip
        resolved("gs://b//imgs")  # it said "No files found" (a helper's trial)
    ran = run_cli("verify", f"file://{tmp_path}", tmp_path / "out")
    assert ran.returncode == 2 and f"'file://{tmp_path}' is a file:// URL" in ran.stderr


def test_a_mistyped_url_is_refused_naming_the_url_meant_not_taken_for_a_folder(tmp_path):
    # `convert imgs gs:/bucket/x` wrote the dataset into ./gs:/bucket/x and said "Converted
    # into gs:/bucket/x", exit 0; the reader said only that gs:/bucket/ds matched no files.
    from beam_jobs import finalise
    from tfrecord_pipe import grain, reader

    src = write_image_folder(tmp_path / "src", per_label=1)
    for typed, meant in (("gs:/bucket/x", "gs://bucket/x"), ("gs:bucket/x", "gs://bucket/x"),
                         ("gs//bucket/x", "gs://bucket/x"), ("S3:/b/x", "s3://b/x")):  # fmt: skip
        said = f"OUT '{typed}' is not a URL \\(did you mean {meant}\\?\\)"
        with pytest.raises(ValueError, match=said):
            finalise.check_output(ConvertConfig(source=str(src), output=typed))
    with pytest.raises(ValueError, match=r"SRC 'gs:/b/imgs' is not a URL \(did you mean gs://b/"):
        resolved("gs:/b/imgs")
    for tool in ("inspect", "bench"):
        ran = run_cli(tool, "gs:/b/ds")
        assert ran.returncode == 2 and "did you mean gs://b/ds?" in ran.stderr, ran.stderr
    ran = run_cli("verify", src, "gs:/b/ds")
    assert ran.returncode == 2 and "did you mean gs://b/ds?" in ran.stderr, ran.stderr
    with pytest.raises(ValueError, match="'gs:/b/ds/' is not a URL \\(did you mean gs://b/ds/"):
        reader.make_input_fn("gs:/b/ds/", is_training=False, image_size=8, batch_size=2)
    with pytest.raises(ValueError, match="'gs:/b/ds' is not a URL"):
        grain.make_dataset("gs:/b/ds", is_training=False, image_size=8, batch_size=2)
    assert not os.path.exists("gs:")  # nothing written where the test runs


def test_split_named_folders_holding_images_themselves_are_told_to_be_listed(tmp_path):
    # Kaggle's dogs-vs-cats: train/cat.0.jpg beside test1/. The error offered --layout
    # labels, which made "train" and "test1" the classes, with verify passing.
    for path in ("train/cat.0.jpg", "train/dog.0.jpg", "test1/1.jpg"):
        (tmp_path / path).parent.mkdir(exist_ok=True)
        (tmp_path / path).write_bytes(jpeg_bytes())
    with pytest.raises(ValueError, match=f"{tmp_path / 'train'} holds images itself, not label "
                                         "folders: neither --layout labels"):  # fmt: skip
        resolved(tmp_path)
    (tmp_path / "train" / "cat.0.jpg").unlink()
    (tmp_path / "train" / "dog.0.jpg").rename(tmp_path / "train" / ".DS_Store")
    (tmp_path / "train" / "dog").mkdir()
    assert resolved(tmp_path).layout == "splits"  # train/dog/ labelled, test1/ to reject
    (tmp_path / "cats").mkdir()
    with pytest.raises(ValueError, match="is 'train' a label or a split"):  # as before
        resolved(tmp_path)
