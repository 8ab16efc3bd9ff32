"""The conversion job end to end, driven through run(argv) as a user drives it."""

import dataclasses
import hashlib
import json
import logging
import os
import pathlib
import shutil

import apache_beam as beam
import pytest
import tensorflow as tf
from google.cloud import storage

from beam_jobs import convert, finalise, pipeline, shard_plan, sources
from tfrecord_pipe._core import manifest, schema
from tfrecord_pipe._reading import dataset
from tfrecord_pipe._tools import cli

from helpers import IN_PROCESS, RGB, jpeg_bytes, run_cli, write_image_folder

ODD = ("truncated_jpeg.jpg", "monkey12.jpg", "pil_sample_cmyk.jpg", "hopper.png")


def make_folder(root: pathlib.Path, per_label: int = 8, odd=ODD) -> pathlib.Path:
    """Red, green and blue JPEGs, and the `odd` files among the red ones."""
    return write_image_folder(root, per_label, labels=("red", "green", "blue"), odd=odd)


def run(*argv) -> manifest.Manifest:
    return convert.run([str(a) for a in argv] + IN_PROCESS)


def read_records(path, label_offset: int = 1) -> list[schema.ImageRecord]:
    compression = "GZIP" if str(path).endswith(".gz") else ""
    return [schema.decode_example(r.numpy(), label_offset=label_offset)
            for r in tf.data.TFRecordDataset(str(path), compression_type=compression)]


@pytest.mark.slow
def test_folder_becomes_balanced_sorted_shards_and_nothing_is_lost(tmp_path):
    src = make_folder(tmp_path / "src")
    out = tmp_path / "out"

    result = run(src, out, "--num_shards", 3, "--validation_fraction", 0.25)

    assert result == dataset.read_manifest(str(out))
    assert (out / "labels.txt").read_text().split() == sorted(RGB)
    listed = sum(1 for p in src.rglob("*") if p.is_file())
    assert sum(info.listed for info in result.splits.values()) == listed
    rejected_lines = [json.loads(line) for f in (out / "rejected").glob("rejected-*.jsonl")
                      for line in f.read_text().splitlines()]
    assert sorted(r["reason"] for r in rejected_lines) == ["truncated", "unsupported_jpeg"]
    for f in (out / "rejected").iterdir():  # one file per split, in path order
        lines = [json.loads(line) for line in f.read_text().splitlines()]
        assert f.name == f"rejected-{lines[0]['split']}.jsonl"
        assert all(r["split"] == lines[0]["split"] for r in lines)
        assert [r["path"] for r in lines] == sorted(r["path"] for r in lines)
    assert result.rejected_reasons == {"truncated": 1, "unsupported_jpeg": 1}
    for split, info in result.splits.items():
        assert info.listed == info.num_examples + info.rejected
        assert info.rejected == sum(r["split"] == split for r in rejected_lines)
        assert max(info.shard_lengths) - min(info.shard_lengths) <= 1
        keys = []
        for name, length in zip(info.files, info.shard_lengths, strict=True):
            records = read_records(out / name)
            assert len(records) == length
            keys += [shard_plan.order_key(r.filename) for r in records]
            for r in records:
                label = r.filename.split("/")[0]
                assert r.label_text == label and result.labels[r.label_index] == label
                source = (src / r.filename).read_bytes()
                assert r.sha256 == hashlib.sha256(source).hexdigest()
                assert tf.io.decode_jpeg(r.encoded, channels=3).shape == (r.height, r.width, 3)
        assert keys == sorted(keys), "records are not in hash order across shards"
    assert not list(out.glob(".tmp-*")), "temporary folder left behind"


@pytest.mark.slow
def test_good_jpegs_are_stored_byte_for_byte_and_odd_ones_normalised(tmp_path):
    src = make_folder(tmp_path / "src", per_label=2)
    out = tmp_path / "out"
    run(src, out)
    records = {r.filename: r for f in out.glob("train-*") for r in read_records(f)}
    assert records["blue/000.jpg"].encoded == (src / "blue/000.jpg").read_bytes()
    cmyk = records["red/pil_sample_cmyk.jpg"]
    assert cmyk.encoded != (src / "red/pil_sample_cmyk.jpg").read_bytes()
    assert tf.io.decode_jpeg(cmyk.encoded).shape[-1] == 3
    assert records["red/hopper.png"].encoded[:2] == b"\xff\xd8"
    (rejected,) = (out / "rejected").iterdir()
    paths = [json.loads(line)["path"] for line in rejected.read_text().splitlines()]
    assert rejected.name == "rejected-train.jsonl" and len(paths) == 2 and paths == sorted(paths)


@pytest.mark.slow
def test_two_runs_over_the_same_input_give_identical_bytes(tmp_path):
    src = make_folder(tmp_path / "src", odd=())
    run(src, tmp_path / "a", "--num_shards", 2)
    run(src, tmp_path / "b", "--num_shards", 2)
    names = sorted(p.name for p in (tmp_path / "a").glob("train-*"))
    assert names == ["train-00000-of-00002.tfrecord", "train-00001-of-00002.tfrecord"]
    for name in names:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


@pytest.mark.slow
def test_an_existing_dataset_is_refused_and_overwrite_leaves_no_old_shards(tmp_path):
    src = make_folder(tmp_path / "src", odd=())
    out = tmp_path / "out"
    run(src, out, "--num_shards", 4)
    with pytest.raises(FileExistsError, match="--overwrite"):
        run(src, out, "--num_shards", 2)
    assert len(list(out.glob("train-*"))) == 4  # untouched

    run(src, out, "--num_shards", 2, "--overwrite")
    assert sorted(p.name for p in out.glob("train-*")) == [
        "train-00000-of-00002.tfrecord", "train-00001-of-00002.tfrecord"]
    assert dataset.read_manifest(str(out)).splits["train"].files == tuple(
        sorted(p.name for p in out.glob("train-*")))


def test_an_overwrite_that_loses_a_split_says_so(tmp_path, capsys):
    # The README's tour converted again with --overwrite to add a format, and without
    # --validation_fraction: validation was gone, without a word (a new user's trial).
    src = make_folder(tmp_path / "src", per_label=4, odd=())
    out = tmp_path / "out"
    first = run(src, out, "--validation_fraction", 0.3)
    capsys.readouterr()
    run(src, out, "--overwrite", "--formats", "tfrecord,array_record")
    said = [line for line in capsys.readouterr().out.splitlines() if "WARNING" in line]
    held = first.splits["validation"].num_examples
    assert said == [f"WARNING: the dataset this replaced had split(s) validation ({held} "
                    "records), which this one has not (it was converted with "
                    "--validation_fraction 0.3: give it again)."]  # fmt: skip
    run(src, out, "--overwrite")  # the same splits as the dataset it replaces
    assert "WARNING" not in capsys.readouterr().out


def test_a_file_the_split_patterns_read_in_the_output_is_warned_of_as_verify_reports_it(
    tmp_path, capsys
):
    # The conversion took train-notes.txt in its output folder in silence, and verify then
    # failed on the fresh dataset: a reader of train-* reads it (a helper's trial).
    src = make_folder(tmp_path / "src", per_label=2, odd=())
    out = tmp_path / "out"
    out.mkdir()
    (out / "train-notes.txt").write_text("my notes")
    run(src, out)
    said = [line for line in capsys.readouterr().out.splitlines() if "WARNING" in line]
    assert said == [f"WARNING: {out} holds files that are not this dataset's where its readers "
                    "look: train-notes.txt: the pattern train-* of split train reads it as part "
                    "of the dataset, but the manifest does not list it. Move them out of it: "
                    "until then `tfrecord-pipe verify` fails on them."]  # fmt: skip
    assert (out / "train-notes.txt").read_text() == "my notes"
    (out / "train-notes.txt").rename(tmp_path / "notes.txt")
    run(src, out, "--overwrite")
    assert "WARNING" not in capsys.readouterr().out


def test_label_folders_holding_no_file_are_said_to_be_no_labels(tmp_path, capsys):
    # A folder whose files were all rejected is a label and warned of; an empty one was
    # silently none (a new user's trial).
    src = make_folder(tmp_path / "src", per_label=2, odd=())
    for empty in ("purple", "nested/inner", ".ipynb_checkpoints"):
        (src / empty).mkdir(parents=True)
    found = run(src, tmp_path / "out")
    assert found.labels == ("blue", "green", "red")
    said = [line for line in capsys.readouterr().out.splitlines() if "WARNING" in line]
    assert said == ["WARNING: label folders holding no file, so no labels of this dataset: "
                    "'nested', 'purple'. Images put there later make labels of them, and "
                    "shift the indices of the labels after them."]  # fmt: skip
    splits = tmp_path / "splits"
    (splits / "validation" / "red").mkdir(parents=True)
    (splits / "validation" / "red" / "0.jpg").write_bytes((src / "red" / "000.jpg").read_bytes())
    src.rename(splits / "train")
    run(splits, tmp_path / "out2")
    said = [line for line in capsys.readouterr().out.splitlines() if "holding no file" in line]
    assert "'train/nested', 'train/purple'. Images" in said[0]


@pytest.mark.slow
def test_csv_with_split_column_relative_paths_and_a_labels_file(tmp_path):
    make_folder(tmp_path / "images", per_label=3, odd=())
    labels_file = tmp_path / "labels.txt"
    labels_file.write_text("red\ngreen\nblue\n")  # not sorted: the file fixes the order
    lines = ["path,label,split"]
    for i in range(3):
        lines += [f"images/red/{i:03d}.jpg,red,train", f"images/blue/{i:03d}.jpg,blue,validation"]
    lines += ["images/green/000.jpg,purple,train", "images/missing.jpg,red,train"]
    csv_path = tmp_path / "list.csv"
    csv_path.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out"

    result = run(csv_path, out, "--labels_file", labels_file, "--label_offset", 0)

    assert result.labels == ("red", "green", "blue")
    assert result.splits["train"].num_examples == 3
    assert result.splits["validation"].num_examples == 3
    assert result.rejected_reasons == {"unknown_label": 1, "unreadable": 1}
    for record in read_records(next(out.glob("validation-*")), label_offset=0):
        assert record.label_text == "blue" and record.label_index == 2
        assert record.filename.startswith("images/blue/")


@pytest.mark.slow
def test_a_path_listed_twice_is_written_once_and_the_extra_line_rejected(tmp_path):
    make_folder(tmp_path / "images", per_label=2, odd=())
    lines = [
        "images/red/000.jpg,red,train",
        "images/red/001.jpg,red,train",
        "images/blue/000.jpg,blue,train",
        "images/blue/000.jpg,green,validation",  # same file, other label and split
    ]
    csv_path = tmp_path / "list.csv"
    csv_path.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out"

    result = run(csv_path, out)

    assert result.splits["train"].num_examples == 3
    assert result.splits["validation"].num_examples == 0
    assert result.splits["validation"].listed == result.splits["validation"].rejected == 1
    assert result.rejected_reasons == {"duplicate": 1}
    assert result.labels == ("blue", "red")  # "green" came only from the dropped line
    (line,) = [json.loads(text) for f in out.glob("rejected/*.jsonl") for text in f.open()]
    assert line["reason"] == "duplicate" and line["split"] == "validation"
    assert "listed 2 times; this listing (label 'green', split 'validation') is dropped; kept the "\
        "listing 'images/blue/000.jpg' with label 'blue' in" in line["error"]
    # "green" vanished from the classes without a word (a multi-label list loses labels so).
    (warning,) = [w for w in result.warnings(str(out)) if "CSV list name a file" in w]
    assert warning.startswith("1 line(s) of the CSV list name a file another line names")
    assert "multi-label" in warning and "a label only such lines give is no class" in warning


def test_a_csv_split_that_cannot_be_a_file_name_stops_the_job_with_what_to_do(tmp_path):
    make_folder(tmp_path / "src", odd=())
    (tmp_path / "list.csv").write_text("src/red/000.jpg,red,../train\n")
    with pytest.raises(ValueError, match="list.csv line 1 .*: split '../train' is not a usable"):
        run(tmp_path / "list.csv", tmp_path / "out")
    assert not list(tmp_path.glob("*train*")) and not list((tmp_path / "out").glob("*.tfrecord"))


def test_a_csv_list_with_more_columns_than_path_label_split_stops_before_the_job(tmp_path):
    # `path,label,width,height` (a Kaggle-style list): the width was taken for a split, each
    # number a split of its own, and the rest ignored. Checked where the launcher reads the
    # list whole: on Beam a worker's listing failed after the job had started.
    make_folder(tmp_path / "src", per_label=1, odd=())
    listed = tmp_path / "list.csv"
    listed.write_text("path,label,width,height\nsrc/red/000.jpg,red,64,48\n")
    for engine in ([], ["--runner", "DirectRunner"]):
        ran = run_cli("convert", listed, tmp_path / "out", *IN_PROCESS, *engine)
        assert ran.returncode == 2 and "Traceback" not in ran.stderr, ran.stderr
        assert ran.stderr.splitlines()[-1] == (
            f"error: CSV list {listed} line 2 has 4 columns ('src/red/000.jpg,red,64,48'); its "
            "lines are path,label[,split]: keep those columns only, and write a path that holds "
            "a comma in double quotes."
        )
        assert not (tmp_path / "out").exists()  # refused before the job, and its claim
    # A first line the auto rule does not take for a header is named with what to pass.
    listed.write_text("image.path,label,split,notes\nsrc/red/000.jpg,red,train,x\n")
    ran = run_cli("convert", listed, tmp_path / "out", *IN_PROCESS)
    assert "line 1 has 4 columns" in ran.stderr and "pass --csv_header yes" in ran.stderr
    # Empty cells after the split, as spreadsheets write them, are no columns.
    listed.write_text("src/red/000.jpg,red,train,,\nsrc/blue/000.jpg,blue,,\n")
    assert run(listed, tmp_path / "out").splits["train"].num_examples == 2
    # verify of a dataset made before the rule (the fourth column ignored) still works.
    listed.write_text("src/red/000.jpg,red,train,from batch 3\nsrc/blue/000.jpg,blue\n")
    verified = run_cli("verify", listed, tmp_path / "out")
    assert verified.returncode == 0 and verified.stdout.strip().endswith("OK"), verified.stdout


@pytest.mark.slow
def test_split_folders_are_detected(tmp_path):
    for split in ("train", "validation"):
        make_folder(tmp_path / "src" / split, per_label=2, odd=())
    result = run(tmp_path / "src", tmp_path / "out")
    assert result.splits["train"].num_examples == 6
    assert result.splits["validation"].num_examples == 6
    assert result.labels == tuple(sorted(RGB))


@pytest.mark.parametrize("stray, layout, message", [
    ("train old/red/1.jpg", "splits", "split folder 'train old' is not a usable split name"),
    ("notes.jpg", "splits", "is not inside a split folder"),
    ("cats/1.jpg", "auto", r"folders named like splits \(train\) beside other things \(cats\)"),
    ("notes.jpg", "auto", r"beside other things \(files\).*--layout labels"),
])
def test_split_folders_that_cannot_name_shards_stop_the_job_with_what_to_do(
    tmp_path, stray, layout, message
):
    make_folder(tmp_path / "src" / "train", per_label=2, odd=())
    (tmp_path / "src" / stray).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / "src" / stray).write_bytes(jpeg_bytes())
    with pytest.raises(ValueError, match=message):
        run(tmp_path / "src", tmp_path / "out", "--layout", layout)
    assert not list((tmp_path / "out").glob("*.tfrecord"))


@pytest.mark.slow
def test_compressed_shards_read_back_with_gzip(tmp_path):
    src = make_folder(tmp_path / "src", per_label=2, odd=())
    result = run(src, tmp_path / "out", "--compress")
    assert result.compression == "GZIP"
    shards = sorted((tmp_path / "out").glob("train-*"))
    assert shards and all(shard.name.endswith(".tfrecord.gz") for shard in shards)
    assert sum(len(read_records(shard)) for shard in shards) == 6
    verified = run_cli("verify", src, tmp_path / "out")  # its compression is the one recorded
    assert verified.returncode == 0, verified.stdout


def test_bad_inputs_fail_before_the_job_with_what_to_do(tmp_path, caplog):
    with pytest.raises(FileNotFoundError, match="nothing-here does not exist"):
        run(tmp_path / "nothing-here", tmp_path / "out")
    src = make_folder(tmp_path / "src", per_label=1, odd=())
    with pytest.raises(ValueError, match=r"^Invalid option: --validation_fraction must be in"):
        run(src, tmp_path / "out", "--validation_fraction", 1.5)
    # Said in the flags' words, not the classes' (it said "Invalid ImagePolicy: max_side").
    with pytest.raises(ValueError, match=r"^Invalid options: --max_side must be >= 1 .*; "
                       r"--jpeg_quality must be in 1..100, got 200$"):
        run(src, tmp_path / "out", "--max_side", 0, "--jpeg_quality", 200)
    for flag, value in (("--shard_mb", "1e-9"), ("--max_file_mb", "nan")):  # (was shard_bytes)
        with pytest.raises(ValueError, match=f"^{flag} must be a positive number of MiB, a byte"):
            run(src, tmp_path / "out", flag, value)
    # --shard_mb was ignored where --num_shards was given, in silence; a path starting with
    # "-" was taken for a flag, and the error said only "No OUTPUT" (a helper's trial).
    with pytest.raises(ValueError, match="^--num_shards and --shard_mb both given: "):
        run(src, tmp_path / "out", "--num_shards", 2, "--shard-mb=5")
    with pytest.raises(ValueError, match="^No OUTPUT: .* -out was read as a flag: give a path "
                                         "that starts with '-' as ./-out, or after --.$"):  # fmt: skip
        run(src, "-out")
    # A shell pattern's folders (`convert data/* out`): Beam dropped `out` with a warning, and
    # the dataset was written into the second folder, among its images.
    (tmp_path / "pets" / "cat").mkdir(parents=True)
    with pytest.raises(ValueError, match="Unexpected argument 'out': convert takes SOURCE and "
                                         "OUTPUT, then flags.$"):  # fmt: skip
        run(src, tmp_path / "pets", "out")
    with pytest.raises(ValueError, match="Unexpected argument '.*cat': convert takes SOURCE and "
                                         "OUTPUT, then flags \\(a shell pattern such as data/\\* "
                                         "gives one argument per folder"):  # fmt: skip
        run(src, tmp_path / "pets", tmp_path / "pets" / "cat")
    with pytest.raises(ValueError, match="Unexpected argument '0.2'"):  # its flag left out
        run(src, tmp_path / "out", "0.2")
    # A negative value was taken for a flag ("Unknown flag -1"); as a value, Beam's runner
    # failed on it with an IndexError.
    for given in (["--direct_num_workers", "-1"], ["--direct_num_workers=-1"]):
        with pytest.raises(ValueError, match=r"^--direct_num_workers -1: give how many workers"):
            convert.run([str(src), str(tmp_path / "out"), *given])  # (not after IN_PROCESS's)
    with pytest.raises(ValueError, match="Unexpected argument '-1'"):
        run(src, tmp_path / "out", "-1")
    assert sorted(p.name for p in (tmp_path / "pets").iterdir()) == ["cat"]
    (tmp_path / "pets" / "cat").rmdir(), (tmp_path / "pets").rmdir()
    with pytest.raises(ValueError, match="is inside the input folder"):
        run(src, src / "dataset")
    assert not (src / "dataset").exists()
    with pytest.raises(ValueError, match="^OUTPUT .*/src is the input folder: "):  # ("src is
        run(src, f"{src}/")  # inside the input folder src", a helper's trial)
    (tmp_path / "away").mkdir()  # a folder elsewhere, reached through a link in the input
    os.symlink(tmp_path / "away", src / "away")
    with pytest.raises(ValueError, match="is inside the input folder"):
        run(src, src / "away")
    os.unlink(src / "away")
    # The converse: the images' folder inside the output (`convert pets ./`) scattered the
    # dataset's files among the user's.
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="holds the input folder"):
        run(src, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["away", "notes.txt", "src"]
    # Two image folders in the wrong order: the dataset was written among the second one's
    # label folders, in silence (a helper's trial).
    other = make_folder(tmp_path / "other", per_label=2, odd=())
    with pytest.raises(FileExistsError, match=r"^OUTPUT .*other holds images \([a-z]+/000\.jpg, "
                                              r".*\) and no dataset: "):  # fmt: skip
        run(src, other)
    assert not [path for path in other.iterdir() if path.is_file()]
    shutil.rmtree(other)
    project = tmp_path / "project"  # a logo among a project's files is no folder of images
    project.mkdir()
    (project / "logo.png").write_bytes(b"png")
    (project / "README.md").write_text("mine")
    run(src, project)
    assert (project / "manifest.json").exists()
    shutil.rmtree(project)
    with pytest.raises(FileNotFoundError, match="Labels file .* does not exist"):
        run(src, tmp_path / "out", "--labels_file", tmp_path / "labels.txt")
    (tmp_path / "labels.txt").write_text("red\nblue\nred\n")
    with pytest.raises(ValueError, match=r"more than once: \['red'\]. List each label once, "):
        run(src, tmp_path / "out", "--labels_file", tmp_path / "labels.txt")
    # A class-index file (`0,red`) rejected every input `unknown_label`, saying nothing of why.
    (tmp_path / "labels.txt").write_text("0,red\n1\tblue\n2 green\n")
    with pytest.raises(finalise.NothingWrittenError), caplog.at_level(logging.WARNING):
        run(src, tmp_path / "numbered", "--labels_file", tmp_path / "labels.txt")
    assert "lines look numbered ('0,red'): it lists one label per line" in caplog.text
    # Split folders decide the splits: the fraction was ignored, and nothing said so.
    for split in ("train", "validation"):
        (tmp_path / "splits" / split / "red").mkdir(parents=True)
        (tmp_path / "splits" / split / "red" / "a.jpg").write_bytes(jpeg_bytes(8, 8))
    with pytest.raises(ValueError, match="--validation_fraction 0.2 does nothing here"):
        run(tmp_path / "splits", tmp_path / "out", "--validation_fraction", 0.2)
    assert not (tmp_path / "out").exists()


def test_label_folders_a_labels_file_lists_in_another_form_are_refused_before_the_job(tmp_path):
    # A folder named 'café' as macOS writes it (e and a combining accent) beside a labels
    # file's 'café' typed as one character: its images were rejected `unknown_label`, naming
    # a label that printed the same as the one listed (a helper's trial).
    decomposed, composed = "cafe\u0301", "caf\u00e9"
    for split, label in (("train", decomposed), ("train", "Red"), ("validation", "red")):
        (tmp_path / "src" / split / label).mkdir(parents=True)
        (tmp_path / "src" / split / label / "a.jpg").write_bytes(jpeg_bytes(8, 8))
    (tmp_path / "labels.txt").write_text(f"{composed}\nred\n")
    with pytest.raises(ValueError, match=(
        "^Label folders that .*labels.txt lists in another form .*: folder 'Red', listed as "
        "'red'; folder 'cafe\\\\u0301', listed as 'caf\\\\xe9'\\): their images would")):
        run(tmp_path / "src", tmp_path / "out", "--labels_file", tmp_path / "labels.txt")
    assert not (tmp_path / "out").exists()
    (tmp_path / "src" / "train" / "Red").rename(tmp_path / "src" / "train" / "red")
    (tmp_path / "labels.txt").write_text(f"{decomposed}\nred\n")
    found = run(tmp_path / "src", tmp_path / "out", "--labels_file", tmp_path / "labels.txt")
    assert found.labels == (decomposed, "red") and found.num_rejected == 0


def test_a_link_in_the_input_to_the_output_or_a_folder_holding_it_is_refused_both_ways(tmp_path):
    # The output given by its own path, a link in the input leading to it: the job listed its
    # claim (and, run again, its old shards) as inputs, and verify failed the dataset.
    src = make_folder(tmp_path / "src", per_label=2, odd=())
    out = tmp_path / "data" / "out"
    run(src, out)
    beam = ["--runner", "DirectRunner", *IN_PROCESS]  # verify's Beam driver, once (seconds)
    for target, drivers in ((tmp_path / "data", ([], beam)), (out, ([],))):
        os.symlink(target, src / "red" / "more")
        with pytest.raises(ValueError, match=r"holds the output folder .* remove the link"):
            run(src, out, "--overwrite")
        for driver in drivers:
            done = run_cli("verify", src, out, *driver)
            assert done.returncode == 2 and "remove the link" in done.stderr, done.stderr
            assert len(done.stderr.strip().splitlines()) == 1, done.stderr
        os.unlink(src / "red" / "more")
    assert run_cli("verify", src, out).returncode == 0  # the dataset as it was


@pytest.mark.slow
def test_full_run_from_gs_to_gs(gcs, tmp_path):
    src = make_folder(tmp_path / "src", per_label=3, odd=("truncated_jpeg.jpg",))
    bucket = storage.Client().bucket(gcs.bucket)
    for path in src.rglob("*.jpg"):
        bucket.blob(f"convert-src/{path.relative_to(src)}").upload_from_filename(path)
    for marker in ("convert-src/", "convert-src/red/"):  # what the console's "Create folder" makes
        bucket.blob(marker).upload_from_string(b"")

    out = gcs.url("convert-out")
    result = run(gcs.url("convert-src"), out, "--num_shards", 2)

    assert dataset.read_manifest(out) == result
    assert result.splits["train"].num_examples == 9
    assert result.rejected_reasons == {"truncated": 1}
    assert result.splits["train"].listed == 10  # folder markers are not inputs
    records = [r for name in result.splits["train"].files for r in read_records(f"{out}/{name}")]
    assert sorted(r.filename for r in records) == sorted(
        str(p.relative_to(src)) for p in src.rglob("*.jpg") if "truncated" not in p.name)
    assert not tf.io.gfile.glob(out + "/.tmp-*/*")
    # An object for the output: a dataset went under manifest.json/, inside this one, and
    # exit 0 (a helper's trial); a local file is refused the same way.
    for file in (f"{out}/manifest.json", f"{out}/{result.splits['train'].files[0]}"):
        with pytest.raises(ValueError, match=f"{file} is a file, not a folder: the output must "):
            run(src, file)
    assert not bucket.blob("convert-out/manifest.json/manifest.json").exists()


def test_a_missing_bucket_is_one_line_naming_it(gcs, tmp_path):
    # The cloud client's error, not its pages of traceback; a local job never imports it.
    ran = run_cli("convert", "gs://no-such-bucket/src", tmp_path / "out")
    assert ran.returncode == 2
    assert ran.stderr.startswith("error: Bucket gs://no-such-bucket does not exist, or these "
                                 "credentials cannot see it: check its name (gs://no-such-"
                                 "bucket/src or ")  # fmt: skip
    assert "404" in ran.stderr and ran.stderr.count("\n") == 1
    src = make_folder(tmp_path / "src", per_label=1, odd=())
    ran = run_cli("convert", src, "gs://no-such-bucket/out")  # (a helper's trial)
    assert ran.returncode == 2 and "Bucket gs://no-such-bucket does not exist" in ran.stderr


@pytest.mark.slow
def test_remote_sources_of_a_batch_are_read_at_once_and_checked_in_order(gcs, tmp_path):
    # On Dataflow a worker checks on one thread; reading gs:// objects one after another
    # there would leave it waiting on the network. Each read is slowed down here, as a
    # distant bucket would be, to see how many are in flight.
    import threading
    import time

    from beam_jobs import load
    from beam_jobs.source_file import SourceFile
    from tfrecord_pipe._core import images

    src = make_folder(tmp_path / "src", per_label=6, odd=("truncated_jpeg.jpg",))
    bucket = storage.Client().bucket(gcs.bucket)
    batch = []
    for path in sorted(src.rglob("*.jpg")):
        relpath = str(path.relative_to(src))
        bucket.blob(f"batch-src/{relpath}").upload_from_filename(path)
        batch.append(SourceFile(gcs.url(f"batch-src/{relpath}"), relpath, path.parent.name, "train"))

    in_flight, peak, lock = 0, 0, threading.Lock()

    class SlowNetwork(load.Checker):
        def _read(self, source):
            nonlocal in_flight, peak
            with lock:
                in_flight += 1
                peak = max(peak, in_flight)
            time.sleep(0.05)
            try:
                return super()._read(source)
            finally:
                with lock:
                    in_flight -= 1

    checker = SlowNetwork(images.ImagePolicy(), threads=1)
    index = {label: i for i, label in enumerate(sorted(RGB))}
    checker.set_labels(index, index)
    try:
        out = list(checker.check(batch))
    finally:
        checker.close()

    assert peak >= min(len(batch), load.REMOTE_READERS) // 2, peak
    checked = [(source.split, c) for source, c, _, _ in out if c is not None]
    rejected = [r for _, c, _, r in out if c is None]
    assert [c.relpath for _, c in checked] == [s.relpath for s in batch if "truncated" not in s.path]
    assert [r.reason for r in rejected] == ["truncated"]
    sha = {c.relpath: c.sha256 for _, c in checked}
    assert all(sha[p] == hashlib.sha256((src / p).read_bytes()).hexdigest() for p in sha)


def test_a_source_that_changes_between_check_and_write_stops_the_write(tmp_path):
    import google_crc32c

    from beam_jobs import load
    from tfrecord_pipe._core import images

    path = tmp_path / "a.jpg"
    path.write_bytes(jpeg_bytes(8, 8))
    checked = load.Checked(
        key="k", path=str(path), relpath="a.jpg", label_index=0, label_text="red",
        sha256=hashlib.sha256(path.read_bytes()).hexdigest(),
        crc32c=google_crc32c.value(path.read_bytes()), height=8, width=8, size=1, reencoded=False,
    )  # fmt: skip
    record = schema.decode_example(
        load.read_record(checked, images.ImagePolicy(), 1), label_offset=1
    )
    assert record.encoded == path.read_bytes() and record.label_text == "red"
    path.write_bytes(jpeg_bytes(8, 8, (0, 0, 255)))
    with pytest.raises(load.SourceChangedError, match="changed while the job ran"):
        load.read_record(checked, images.ImagePolicy(), 1)
    path.write_bytes(b"")  # emptied: refused unread, and still said as a change of this file
    with pytest.raises(load.SourceChangedError,
                       match=f"{path} changed while the job ran \\(now 0 bytes"):  # fmt: skip
        load.read_record(checked, images.ImagePolicy(), 1)
    path.unlink()  # removed: a change too, not a bad input of the user's (exit 2)
    with pytest.raises(load.SourceChangedError,
                       match=f"{path} changed while the job ran \\(it is gone\\)"):  # fmt: skip
        load.read_record(checked, images.ImagePolicy(), 1)
    path.symlink_to(path)  # a link to itself: it raised the system's bare OSError
    with pytest.raises(load.SourceChangedError,
                       match=r"changed while the job ran \(it cannot be read now: .*symbolic"):
        load.read_record(checked, images.ImagePolicy(), 1)


@pytest.mark.slow
def test_images_are_loaded_in_parallel_bundles_not_by_one_worker(tmp_path):
    # Listing is one step a runner cannot split; without redistributing its output, every
    # image would be loaded by a single worker thread, locally and on Dataflow.
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    from beam_jobs.config import ConvertConfig

    # With a labels file nothing else forces a break between listing and loading.
    src = make_folder(tmp_path / "src", per_label=10, odd=())
    config = sources.resolve_layout(ConvertConfig(source=str(src), output=str(tmp_path / "out")))
    progress_dir = tmp_path / "progress"
    progress_dir.mkdir()
    options = PipelineOptions(
        ["--runner=FnApiRunner", "--direct_num_workers=2", "--direct_running_mode=multi_threading"]
    )
    with beam.Pipeline(options=options) as job:
        pipeline.build_pipeline(
            job, config, str(tmp_path / "tmp"), tuple(sorted(RGB)), str(progress_dir)
        )

    loaded = [int(f.read_text().split()[0]) for f in progress_dir.iterdir()
              if f.suffix != ".partial"]  # fmt: skip
    assert sum(loaded) == 30
    assert sum(1 for n in loaded if n > 0) >= 2, f"one worker loaded everything: {loaded}"


@pytest.mark.slow
def test_checking_on_threads_writes_the_same_dataset_and_counts_every_input(tmp_path):
    # Local runs check inputs on a thread per core inside one worker; Beam's counters only
    # count on the bundle's own thread, so a count made on a checking thread would be lost.
    from apache_beam.metrics.metric import MetricsFilter
    from apache_beam.options.pipeline_options import PipelineOptions

    from beam_jobs.config import ConvertConfig

    src = make_folder(tmp_path / "src", per_label=30)
    listed = sum(1 for p in src.rglob("*") if p.is_file())
    outputs, counters = {}, {}
    for threads in (1, 3):
        out = tmp_path / f"out-{threads}"
        config = sources.resolve_layout(ConvertConfig(source=str(src), output=str(out)))
        job = beam.Pipeline(options=PipelineOptions(["--runner=FnApiRunner"]))
        pipeline.build_pipeline(job, config, str(out / ".tmp-run"), None, load_threads=threads)
        result = job.run()
        result.wait_until_finish()
        counters[threads] = {
            c.key.metric.name: c.committed
            for c in result.metrics().query(MetricsFilter().with_namespace("tfrecord_pipe"))["counters"]
        }
        outputs[threads] = {p.relative_to(out): p.read_bytes() for p in out.rglob("*")
                            if p.is_file() and p.name != "manifest.json"}  # fmt: skip

    assert outputs[1] == outputs[3]
    assert any(name.suffix == ".tfrecord" for name in outputs[3])
    assert counters[1] == counters[3]
    counted = counters[3]
    assert counted["images_rejected"] == 2 and counted["images_reencoded"] == 2  # CMYK, PNG
    assert counted["images_stored_unchanged"] + counted["images_reencoded"] + 2 == listed
    assert counted["bytes_read"] == sum(p.stat().st_size for p in src.rglob("*") if p.is_file())


@pytest.mark.parametrize("offset", ["10001", "-1", str(2**63 - 1), "100000000000000000000"])
def test_a_label_offset_out_of_bounds_is_refused_before_any_work(tmp_path, offset):
    # 10**20 hung after the shards were moved in; 2**63-1 with --compress wrapped the labels.
    (tmp_path / "src" / "cat").mkdir(parents=True)
    (tmp_path / "src" / "cat" / "a.jpg").write_bytes(jpeg_bytes(8, 8))
    result = run_cli("convert", tmp_path / "src", tmp_path / "out", "--label_offset", offset)
    assert result.returncode == 2 and "label_offset must be in 0..10000" in result.stderr
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_tfds_class_names_for_the_largest_offset_are_placeholders_then_the_labels():
    # (Their speed is not asserted: made with a list, not a set, they took 0.7 s, not 0.)
    from tfrecord_pipe._core import manifest, schema, tfds_metadata

    found = manifest.Manifest(labels=("offset_3", "cat"), label_offset=schema.MAX_LABEL_OFFSET,
                              compression="", splits={})  # fmt: skip
    names = tfds_metadata.class_names(found)
    assert len(names) == len(set(names)) == schema.MAX_LABEL_OFFSET + 2
    assert names[3] == "_offset_3" and names[-2:] == ["offset_3", "cat"]


@pytest.mark.parametrize("label", ["ca\nt", " cat", "cat ", "ca\u2028t"])
def test_a_label_labels_txt_cannot_hold_stops_the_job_at_listing(tmp_path, label):
    # A line break made two labels of one in labels.txt (shifting every label after it, and
    # adding a phantom class when reused as --labels_file); end spaces were lost.
    (tmp_path / "src" / label).mkdir(parents=True)
    (tmp_path / "src" / label / "a.jpg").write_bytes(jpeg_bytes(8, 8))
    (tmp_path / "src" / "dog").mkdir()
    (tmp_path / "src" / "dog" / "b.jpg").write_bytes(jpeg_bytes(8, 8))
    result = run_cli("convert", tmp_path / "src", tmp_path / "out")
    assert result.returncode == 2, result.stderr
    # One line, the folder's path escaped too: it was printed raw, over two lines.
    [error] = result.errors
    assert repr(label) in error and error.endswith("rename the folder."), result.stderr
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_a_csv_label_with_a_unicode_line_break_stops_the_job_naming_the_line(tmp_path):
    # CSV lines end at \n and \r only; U+2028 is a line break to every reader of labels.txt.
    (tmp_path / "a.jpg").write_bytes(jpeg_bytes(8, 8))
    (tmp_path / "list.csv").write_text("a.jpg,ca\u2028t\n", encoding="utf-8")
    result = run_cli("convert", tmp_path / "list.csv", tmp_path / "out")
    assert result.returncode == 2
    assert "list.csv line 1 (" in result.stderr and "has a line break" in result.stderr


def test_names_that_are_not_utf8_are_rejected_with_their_bytes_escaped(tmp_path):
    # One such name (common in old archives) aborted the whole job, and verify with it.
    src = tmp_path / "src"
    for folder in (b"cat", b"caf\xe9", b"dog"):
        os.makedirs(os.path.join(os.fsencode(src), folder))
    for name in (b"cat/caf\xe9.jpg", b"cat/a.jpg", b"caf\xe9/b.jpg", b"dog/c.jpg"):
        with open(os.path.join(os.fsencode(src), name), "wb") as f:
            f.write(jpeg_bytes(8, 8, (len(name), 3, 4)))
    result = run_cli("convert", src, tmp_path / "out")
    assert result.returncode == 0, result.stderr
    assert "train: 2 in" in result.stdout and "2 rejected (unreadable 2)" in result.stdout
    rows = [json.loads(line) for line in (tmp_path / "out" / "rejected" / "rejected-train.jsonl")
            .read_text().splitlines()]  # fmt: skip
    assert sorted(row["relpath"] for row in rows) == ["caf\\xe9/b.jpg", "cat/caf\\xe9.jpg"]
    assert all("not valid UTF-8" in row["error"] for row in rows)
    assert json.loads((tmp_path / "out" / "manifest.json").read_text())["labels"] == ["cat", "dog"]
    verified = run_cli("verify", src, tmp_path / "out")
    assert verified.returncode == 0 and verified.stdout.strip().endswith("OK"), verified.stdout
    # With a validation split, the split's hash of such a name stopped the job with
    # "surrogates not allowed", naming no file.
    result = run_cli("convert", src, tmp_path / "split", "--validation_fraction", "0.5")
    assert result.returncode == 0, result.stderr
    split = dataset.read_manifest(str(tmp_path / "split"))
    assert split.num_rejected == 2 and sum(i.num_examples for i in split.splits.values()) == 2
    verified = run_cli("verify", src, tmp_path / "split")
    assert verified.returncode == 0 and verified.stdout.strip().endswith("OK"), verified.stdout


def test_labels_that_print_alike_are_kept_apart_with_a_warning(tmp_path, capsys):
    # café typed two ways (NFC and NFD) and Dog/dog: separate classes that look like one; so
    # are a no-break space, a zero-width space and a fullwidth letter (a CSV's labels).
    for label in ("caf\u00e9", "cafe\u0301", "Dog", "dog", "cat", "big bird", "big\u00a0bird",
                  "owl", "owl\u200b", "\uff45mu", "emu"):  # fmt: skip
        (tmp_path / "src" / label).mkdir(parents=True)
        (tmp_path / "src" / label / "a.jpg").write_bytes(jpeg_bytes(8, 8, (len(label), 1, 2)))
    result = run_cli("convert", tmp_path / "src", tmp_path / "out")
    assert result.returncode == 0, result.stderr
    warning = next(line for line in result.stdout.splitlines() if "print alike" in line)
    assert "'cafe\\u0301' / 'caf\\xe9'" in warning and "'Dog' / 'dog'" in warning
    assert "'big bird' / 'big\\xa0bird'" in warning and "'owl' / 'owl\\u200b'" in warning
    assert "'emu' / '\\uff45mu'" in warning and "cat" not in warning
    # `inspect` says the same, for a job whose summary nobody saw (Dataflow's --no_wait).
    assert cli.main(["inspect", str(tmp_path / "out")]) == 0
    assert warning in capsys.readouterr().out.splitlines()


def test_labels_numbered_as_text_one_label_alone_and_no_train_split_are_warned(tmp_path, capsys):
    # A CSV of class numbers gave 10 the index before 2; a folder of images given for a
    # folder of label folders gave one class; a split named otherwise left the reader's
    # default split empty. Each was a dataset written without a word.
    def warned(src, *flags):
        capsys.readouterr()
        convert.run([str(src), str(tmp_path / f"out{len(list(tmp_path.iterdir()))}"), *flags,
                     *IN_PROCESS])  # fmt: skip
        return [line for line in capsys.readouterr().out.splitlines() if "WARNING" in line]

    lines = [f"{n}.jpg,{n % 12},{'train' if n < 12 else 'validation'}" for n in range(24)]
    for n in range(24):
        (tmp_path / "numbers" / f"{n}.jpg").parent.mkdir(exist_ok=True)
        (tmp_path / "numbers" / f"{n}.jpg").write_bytes(jpeg_bytes(8, 8, (n * 10, 9, 9)))
    (tmp_path / "numbers" / "list.csv").write_text("\n".join(lines) + "\n")
    assert warned(tmp_path / "numbers" / "list.csv") == [
        "WARNING: labels are numbers, put in the order of their text ('0', '1', '10', '11', '2', "
        "'3' and 6 more): label '10' has index 2, not its number's place. For indices in the "
        "numbers' order, give --labels_file listing them in that order"
    ]
    (tmp_path / "numbered.txt").write_text("\n".join(map(str, range(12))) + "\n")
    numbered = str(tmp_path / "numbered.txt")
    assert warned(tmp_path / "numbers" / "list.csv", "--labels_file", numbered) == []
    (tmp_path / "images" / "holiday").mkdir(parents=True)
    for n in range(3):
        (tmp_path / "images" / "holiday" / f"{n}.jpg").write_bytes(jpeg_bytes(8, 8, (n * 60, 1, 1)))
    one_label = [
        "WARNING: one label ('holiday') holds every record: every record is of that one class. "
        "Label folders (SRC/cat/1.jpg, SRC/dog/2.jpg) or a CSV list's label column give a "
        "class each"
    ]
    assert warned(tmp_path / "images") == one_label
    # A macOS zip's __MACOSX beside it, a label of no record, hid that warning.
    (tmp_path / "images" / "__MACOSX" / "holiday").mkdir(parents=True)
    apple_double = tmp_path / "images" / "__MACOSX" / "holiday" / "._0.jpg"
    apple_double.write_bytes(b"\x00\x05\x16\x07" * 9)
    assert one_label[0] in warned(tmp_path / "images")
    # A column of ids read as the labels; split folders read as labels.
    for n in range(10):
        (tmp_path / "ids" / f"{n}.jpg").parent.mkdir(exist_ok=True)
        (tmp_path / "ids" / f"{n}.jpg").write_bytes(jpeg_bytes(8, 8, (n * 25, 50, 9)))
    lines = "".join(f"{n}.jpg,n{n:08d} 1 3 31\n" for n in range(10))
    (tmp_path / "ids" / "list.csv").write_text(lines)
    assert ("WARNING: every label holds one record (10 labels: 'n00000000 1 3 31', "
            "'n00000001 1 3 31', 'n00000002 1 3 31' and 7 more): a column of ids, file names or "
            "boxes read as the labels?") in warned(tmp_path / "ids" / "list.csv")  # fmt: skip
    for split in ("train", "test"):
        (tmp_path / "kaggle" / split).mkdir(parents=True)
        colour = (len(split) * 30, 1, 1)
        (tmp_path / "kaggle" / split / "a.jpg").write_bytes(jpeg_bytes(8, 8, colour))
    assert ("WARNING: labels named like splits ('test', 'train'): a folder of split folders read "
            "with --layout labels? Each is a class now") in warned(
        tmp_path / "kaggle", "--layout", "labels")  # fmt: skip
    (tmp_path / "folds" / "fold1" / "cat").mkdir(parents=True)
    (tmp_path / "folds" / "fold1" / "dog").mkdir(parents=True)
    (tmp_path / "folds" / "fold1" / "cat" / "a.jpg").write_bytes(jpeg_bytes(8, 8, (200, 1, 1)))
    (tmp_path / "folds" / "fold1" / "dog" / "a.jpg").write_bytes(jpeg_bytes(8, 8, (1, 200, 1)))
    assert warned(tmp_path / "folds", "--layout", "splits") == [
        "WARNING: no split named train (the splits: fold1): the reader reads train when "
        "training unless given split="
    ]
    # A CSV list naming a split two ways: evaluation read one, and left the other's records
    # out, with no word (a reviewer).
    (tmp_path / "two_names" / "list.csv").parent.mkdir()
    for n, split in enumerate(("train", "train", "val", "validation")):
        (tmp_path / "two_names" / f"{n}.jpg").write_bytes(jpeg_bytes(8, 8, (n * 60, 9, 9)))
        with open(tmp_path / "two_names" / "list.csv", "a") as f:
            f.write(f"{n}.jpg,{'ab'[n % 2]},{split}\n")
    assert ("WARNING: splits 'val' and 'validation' are separate splits: evaluation reads "
            "'validation' unless given split=. If they are one split, name it one way (a CSV "
            "list's split column, or one folder)") in warned(tmp_path / "two_names" / "list.csv")
    # A split misspelt in some lines: a split of its own, found when the reader had none of
    # that name, or never (a helper's trial).
    (tmp_path / "two_names" / "4.jpg").write_bytes(jpeg_bytes(8, 8, (250, 9, 9)))
    with open(tmp_path / "two_names" / "list.csv", "a") as f:
        f.write("4.jpg,b,validaton\n")
    assert ("WARNING: split 'validaton' is named like validation but is not it: a reader asked "
            "for validation will not find it. If validation was meant, fix the name (a CSV list's "
            "split column, or a split folder's) and convert again") in warned(tmp_path / "two_names" / "list.csv")
    # A split that adds to a usual name is one of its own (Kaggle's test1; test2, train_a).
    found = dataset.read_manifest(str(next(tmp_path.glob("out*/manifest.json")).parent))
    info = manifest.SplitInfo(0, (), 0, 0, 0, (), label_counts=(0,) * len(found.labels))
    named = dataclasses.replace(found, splits={name: info for name in (
        "test2", "train_a", "tests", "Validation", "trian")})  # fmt: skip
    assert named._misspelt_splits() == [("Validation", "validation"), ("trian", "train")]


def test_a_split_left_without_records_is_warned_of_and_look_alike_splits_refused(tmp_path):
    # Split folders whose test/ holds train/'s pictures: --dedupe rejects every train copy,
    # and the job ended with "train: 0 in 0 shards" and exit 0, warning of nothing.
    for split in ("train", "test"):
        (tmp_path / "src" / split / "cat").mkdir(parents=True)
        for i in range(2):
            (tmp_path / "src" / split / "cat" / f"{i}.jpg").write_bytes(jpeg_bytes(8, 8, (1, i, 2)))
    result = run_cli("convert", tmp_path / "src", tmp_path / "out", "--dedupe")
    assert result.returncode == 0, result.stderr
    [empty] = [line for line in result.stdout.splitlines() if "no record" in line]
    rejected = tmp_path / "out" / "rejected" / "rejected-train.jsonl"
    assert empty == (f"WARNING: split train has no record: all 2 of its inputs were rejected; "
                     f"why is in {rejected}")  # fmt: skip
    result = run_cli("convert", tmp_path / "src", tmp_path / "kept")
    assert "no record" not in result.stdout and result.returncode == 0, result.stdout
    # A `Train` folder beside train/ (given --layout splits), or a CSV line's `Train`, was a
    # split of its own, whose shards are train's on a disk that ignores case (macOS).
    (tmp_path / "src" / "Train" / "cat").mkdir(parents=True)
    (tmp_path / "src" / "Train" / "cat" / "9.jpg").write_bytes(jpeg_bytes(8, 8, (9, 9, 9)))
    (tmp_path / "list.csv").write_text("src/train/cat/0.jpg,cat\nsrc/Train/cat/9.jpg,cat,Train\n")
    for source, layout, fix in ((tmp_path / "src", "splits", "rename the split folders"),
                                (tmp_path / "list.csv", "csv", "fix the CSV lines")):  # fmt: skip
        result = run_cli("convert", source, tmp_path / "alike", "--layout", layout)
        assert result.returncode == 2 and result.stderr.splitlines()[-1] == (
            "error: Split names that print alike ('Train' / 'train': another case or Unicode "
            "form, invisible characters or another kind of space): each would be a split of its "
            "own, and their shard files one file on a disk that "
            f"ignores case (macOS, Windows). Give each split one name: {fix}."
        ), result.stderr
