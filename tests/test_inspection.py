"""`tfrecord-pipe inspect` and inspection.py: what a dataset holds, for a person to look at."""

import json
import os
import shlex
import shutil
import subprocess

import pytest
import tensorflow as tf
from PIL import Image

from tfrecord_pipe._core import manifest, schema
from tfrecord_pipe._reading import dataset
from tfrecord_pipe._tools import cli, inspection

from dataset_factory import write_dataset
from helpers import command_line, jpeg_bytes, run_cli, run_command


def test_inspect_shows_splits_labels_sizes_and_rejections(converted):
    _, out = converted
    done = run_cli("inspect", out, "--check")
    assert done.returncode == 0, done.stderr
    text = done.stdout
    assert "3 labels, label_offset 1" in text
    assert "train:" in text and "validation:" in text and "in 2 shards" in text
    sizes = sum(f.stat().st_size for f in out.glob("train-*"))  # small: KiB, not "0.0 MiB"
    assert f"in 2 shards, {sizes / 1024:.1f} KiB (shards " in text
    assert "counts checked against the shards: OK" in text
    assert "blue (0)" in text and "red (2)" in text and "█" in text  # name (0-based index)
    # Every record's label, counted by the converter: no sample read for them.
    assert text.count("labels (every record, as the manifest counts them):") == 2
    assert "image height 8..8" in text
    assert "rejected: 1 (truncated 1)" in text and "truncated_jpeg.jpg" in text


def test_rejection_lines_that_are_not_rejections_are_shown_as_such(converted_copy):
    # A line of JSON that is no object ended inspect in an AttributeError traceback; one not
    # JSON, or not UTF-8, in an error naming no file (a helper's trial).
    _, out = converted_copy
    [listing] = out.glob("rejected/*.jsonl")
    for line in (b"[]", b"{bad", b"\xff"):
        listing.write_bytes(line + b"\n")
        done = run_cli("inspect", out)
        assert done.returncode == 0, done.stderr
        assert (f"  {listing} line 1: not a rejection line: `tfrecord-pipe verify` checks them"
                in done.stdout.splitlines()), done.stdout  # fmt: skip


def test_inspect_grid_draws_every_sample_with_its_label(converted, tmp_path):
    _, out = converted
    grid = tmp_path / "grid.png"
    done = run_cli("inspect", out, "--grid", grid, "--grid_count", "8")
    assert done.returncode == 0, done.stderr
    assert "contact sheet of 8 records" in done.stdout
    sheet = Image.open(grid)
    assert sheet.size == (6 * 132 + 4, 2 * (128 + 30 + 4) + 4)  # 8 tiles: two rows of six


def test_a_long_file_name_keeps_the_split_in_its_caption():
    # The name's end was kept and the split cut off, on every long name.
    label, where = inspection.drawn_caption(
        ("daisy (3)", "validation IMG_20240101_123456_very_long_name.jpg"), 128
    )
    assert where.startswith("validation ...") and where.endswith("ame.jpg")
    assert len(where) <= 128 // 6 and label == "daisy (3)"
    # Pillow's default font draws printable ASCII: 'café' and '日本' were drawn as boxes.
    assert inspection.drawn_caption(("caf\u00e9 (0)", "train \u65e5\u672c.jpg"), 256) == (
        "caf\\xe9 (0)", "train \\u65e5\\u672c.jpg")


def test_the_grid_says_each_records_label_split_and_file(converted, tmp_path):
    _, out = converted
    captions = inspection.contact_sheet(str(out), str(tmp_path / "grid.png"), count=30)
    found = dataset.read_manifest(str(out))
    assert len(captions) == sum(info.num_examples for info in found.splits.values())
    files = {}  # split -> file names, read back with the reader's own parsing
    for split, info in found.splits.items():
        files[split] = {r.filename.split("/")[-1] for r in _records(out, info.files)}
    for label, where in captions:
        split, name = where.split(" ")
        assert name in files[split], (label, where)
        assert label.split(" (")[0] in found.labels and label.endswith(")")
    assert {where.split(" ")[0] for _, where in captions} == set(found.splits)


def test_the_grid_draws_records_of_cloud_tpu_s_layout_and_names_an_image_it_cannot(tmp_path):
    # imagenet_to_gcs.py's records (no sha256 key, a filename, no manifest): the grid asked
    # for every key of this project's format, and drew none.
    def example(encoded, label):
        def feature(value):
            if isinstance(value, int):
                return tf.train.Feature(int64_list=tf.train.Int64List(value=[value]))
            return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))

        features = {"image/encoded": encoded, "image/class/label": label,
                    "image/class/synset": b"n0144%d" % label, "image/filename": b"x%d.JPEG" % label}
        return tf.train.Example(features=tf.train.Features(feature={
            key: feature(value) for key, value in features.items()})).SerializeToString()

    with tf.io.TFRecordWriter(str(tmp_path / "train-00000-of-00001")) as writer:
        for label in (1, 2):
            writer.write(example(jpeg_bytes(40, 30, (200, 30, 30)), label))
    captions = inspection.contact_sheet(f"{tmp_path}/train-*", str(tmp_path / "grid.png"),
                                        label_offset=1)  # fmt: skip
    assert captions == [("n01441 (0)", "train x1.JPEG"), ("n01442 (1)", "train x2.JPEG")]
    with tf.io.TFRecordWriter(str(tmp_path / "train-00000-of-00001")) as writer:
        writer.write(example(b"not an image", 1))
    with pytest.raises(ValueError, match="an image of .*train-00000-of-00001 \\(x1.JPEG\\) does "
                                         "not decode: no image format Pillow knows$"):  # fmt: skip
        inspection.contact_sheet(f"{tmp_path}/train-*", str(tmp_path / "grid.png"), label_offset=1)


def test_a_grid_of_fewer_records_than_shards_shows_every_split(tmp_path):
    # One record from each shard in turn, shards listed split by split: 24 of 55 train shards
    # and 6 validation ones drew train alone (a new user's trial).
    write_dataset(str(tmp_path), {"train": [[0]] * 30, "validation": [[1]] * 5})
    captions = inspection.contact_sheet(str(tmp_path), str(tmp_path / "grid.png"), count=12)
    splits = [where.split()[0] for _, where in captions]
    assert splits.count("validation") == 5 and splits.count("train") == 7


def test_inspect_check_catches_a_manifest_that_disagrees_with_a_shard(converted_copy):
    _, out = converted_copy
    found = dataset.read_manifest(str(out))
    info = found.splits["train"]
    lengths = (info.shard_lengths[0] + 1,) + info.shard_lengths[1:]
    splits = dict(found.splits)
    splits["train"] = manifest.SplitInfo(
        info.num_examples + 1, lengths, info.num_bytes, info.listed + 1, info.rejected, info.files,
        label_counts=(info.label_counts[0] + 1, *info.label_counts[1:]),
    )  # fmt: skip
    dataset.write_manifest(str(out), manifest.Manifest(**{**found.__dict__, "splits": splits}))
    done = run_cli("inspect", out, "--check")
    assert done.returncode == 1
    assert "PROBLEM" in done.stdout and "the shard holds" in done.stdout


def test_inspect_check_finds_a_shard_of_its_size_and_count_holding_other_inputs(converted_copy):
    # Two records swapped in a shard (or a shard replaced by another's copy of its size and
    # count): --check said "OK", and only verify found it (two reviewers).
    _, out = converted_copy
    info = dataset.read_manifest(str(out)).splits["train"]
    shard = out / next(name for name, n in zip(info.files, info.shard_lengths) if n >= 2)
    found = [r.numpy() for r in tf.data.TFRecordDataset(str(shard))]
    size = shard.stat().st_size
    with tf.io.TFRecordWriter(str(shard)) as writer:
        for record in [found[1], found[0], *found[2:]]:
            writer.write(record)
    assert shard.stat().st_size == size
    done = run_cli("inspect", out, "--check")
    assert done.returncode == 1, done.stdout
    assert f"{shard}: holds other inputs than the manifest lists, or in another" in done.stdout
    assert "MISMATCH: 1 holding other inputs than listed" in done.stdout


def test_inspect_says_a_file_written_with_the_manifest_is_missing(converted_copy):
    # Without labels.txt (or TensorFlow Datasets' metadata) --check said OK; verify did not.
    _, out = converted_copy
    assert run_cli("inspect", out, "--check").returncode == 0
    for name in ("labels.txt", "features.json"):
        (out / name).unlink()
    done = run_cli("inspect", out, "--check")
    assert done.returncode == 1
    for name in ("labels.txt", "features.json"):
        assert f"PROBLEM {out / name}: missing (it is written with the manifest)" in done.stdout


def test_inspect_check_says_mismatch_for_a_missing_or_cut_shard_and_names_it(converted_copy):
    # Both printed "counts checked against the shards: OK" beside the PROBLEM lines, and a
    # missing shard's split was shown with its count and shard count less that shard's; the
    # sample's read error named no file.
    _, out = converted_copy
    info = dataset.read_manifest(str(out)).splits["train"]
    gone, cut = (out / name for name in info.files[:2])
    gone.unlink()
    cut.write_bytes(cut.read_bytes()[:-30])
    text = run_cli("inspect", out, "--check").stdout
    assert (f"train: {info.num_examples} records in {len(info.files)} shards (1 missing)") in text
    left = info.num_examples - info.shard_lengths[0] - info.shard_lengths[1]
    assert ("counts checked against the shards: MISMATCH: 1 missing, 1 unreadable, 1 of "
            f"another size than listed ({left} records read "
            f"of {info.num_examples} listed)") in text  # fmt: skip
    sampled = run_cli("inspect", out).stdout
    assert f"reading a sample stopped after 0 records, at {cut}: " in sampled, sampled
    # Emptied: said of another count, not also of "other inputs" (its digest of none).
    cut.write_bytes(b"")
    text = run_cli("inspect", out, "--check").stdout
    assert f"{cut}: manifest lists {info.shard_lengths[1]} records, the shard holds 0" in text
    assert "other inputs" not in text, text
    # Every shard of a split gone: it was "0 records (every input of it was rejected)".
    validation = dataset.read_manifest(str(out)).splits["validation"]
    for name in validation.files:
        (out / name).unlink()
    text = run_cli("inspect", out, "--check").stdout
    assert (f"validation: {validation.num_examples} records in {len(validation.files)} shards "
            f"({len(validation.files)} missing)") in text  # fmt: skip
    assert (f"MISMATCH: {len(validation.files)} missing (0 records read of "
            f"{validation.num_examples} listed)") in text  # fmt: skip


@pytest.mark.slow  # a new process: a regression would block for ever
def test_inspect_says_a_shard_replaced_by_a_fifo_is_no_file_and_never_blocks(converted_copy):
    _, out = converted_copy
    shard = out / dataset.read_manifest(str(out)).splits["train"].files[0]
    shard.unlink()
    os.mkfifo(shard)
    done = run_command("inspect", out, "--check", timeout=120, preloaded=True)
    assert done.returncode == 1, done.stderr[-2000:]
    assert f"PROBLEM {shard}: missing, or not a file (the manifest lists it)" in done.stdout
    # Named by a pattern (as the error for a folder without a manifest says to), or by its own
    # path, it was opened too.
    matched = dataset.resolve(str(out / "train-*")).everything().files
    assert str(shard) not in matched and len(matched) == len(list(out.glob("train-*"))) - 1
    with pytest.raises(ValueError, match=r"is not a file \(a pipe, a device, a socket"):
        dataset.resolve(str(shard))


@pytest.mark.parametrize(
    "make_path, message",
    [
        (lambda tmp: tmp / "missing", "does not exist"),
        (lambda tmp: tmp, "is an empty folder: not a dataset"),  # it suggested tmp/train-*
        (lambda tmp: (tmp / "train-00000-of-00001.tfrecord").touch() or tmp,
         "not a finished tfrecord-pipe dataset"),  # a folder of shards without a manifest
        (lambda tmp: f"{tmp}/train-*", "matched no files"),
    ],
)
def test_inspect_bad_input_is_one_clear_line_and_exit_2(tmp_path, make_path, message):
    done = run_cli("inspect", make_path(tmp_path))
    assert done.returncode == 2
    assert len(done.errors) == 1 and message in done.errors[0]


def test_a_folder_of_images_and_a_pattern_of_a_datasets_every_file_say_what_to_pass(
    converted, tmp_path
):
    # A folder of images was told to pass a pattern of its shards; `OUT/*` read the manifest,
    # labels.txt and the rest as records of a split named "files", and called them corrupt.
    (tmp_path / "photos" / "cat").mkdir(parents=True)
    (tmp_path / "photos" / "cat" / "a.jpg").write_bytes(b"not read")
    done = run_cli("inspect", tmp_path / "photos")
    assert done.returncode == 2
    assert f"convert it first (tfrecord-pipe convert {tmp_path / 'photos'} OUT)" in done.errors[0]
    _, out = converted
    (error,) = run_cli("inspect", f"{out}/*").errors
    assert "matched files of a dataset that are no shards (" in error
    assert (f"pass the dataset folder {out}, or a pattern of its shards alone such as "
            f"{out}/train-*-of-*") in error  # fmt: skip
    assert run_cli("inspect", f"{out}/train-*").returncode == 0
    # The pattern said is one that leaves out a file a split's name begins (it told a user
    # who passed OUT/train-* to pass OUT/train-*, with a contact sheet OUT/train-grid.png).
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    (copy / "train-grid.png").write_bytes(b"")
    assert "no shards (train-grid.png)" in run_cli("inspect", f"{copy}/train-*").errors[0]
    assert run_cli("inspect", f"{copy}/train-*-of-*").returncode == 0


@pytest.mark.parametrize("option, value, says", [
    ("--grid_count", "0", "--grid_count must be 1 or more, got 0"),
    ("--sample", "-1", "--sample must be 0 (every record) or more, got -1"),
])  # fmt: skip
def test_inspect_names_the_count_that_is_out_of_range(converted, capsys, option, value, says):
    # --grid_count 0 was refused naming --sample first.
    _, out = converted
    assert cli.main(["inspect", str(out), option, value]) == 2
    assert capsys.readouterr().err == f"error: {says}\n"


def test_a_histogram_of_many_labels_shows_the_largest_and_sums_up_the_rest():
    # 20,000 classes were 20,000 lines.
    lines = inspection._histogram({f"label{i}": i + 1 for i in range(100)}, most=40)
    assert len(lines) == 41 and lines[0].split()[0] == "label99"
    assert lines[-1] == "    ... and 60 more, 1 to 60 each"


@pytest.mark.parametrize("command", ["inspect", "verify"])
def test_a_link_that_leads_nowhere_is_said_to_be_one(tmp_path, capsys, command):
    # It said the link "does not exist", which `ls` contradicts.
    os.symlink("gone", tmp_path / "dataset")
    os.symlink("loop", tmp_path / "loop")
    for link, to in (("dataset", "gone"), ("loop", "loop")):
        args = [str(tmp_path / link)]
        if command == "verify":  # SRC, then the dataset
            args.insert(0, str(tmp_path))
        assert cli.main([command, *args]) == 2
        assert capsys.readouterr().err.endswith(
            f"error: {tmp_path / link} is a link that leads nowhere (to {to}: missing, or a loop "
            "of links).\n"
        )


def test_inspect_a_bare_pattern_counts_from_the_shards(converted):
    _, out = converted
    done = run_cli("inspect", f"{out}/train-*")
    assert done.returncode == 0, done.stderr
    train = dataset.read_manifest(str(out)).splits["train"].num_examples
    assert f"train: {train} records in 2 shards" in done.stdout


def test_without_a_label_offset_labels_show_as_stored_values(tmp_path):
    write_dataset(str(tmp_path), {"train": [[0, 1, 1]]}, label_offset=1)
    tf.io.gfile.remove(f"{tmp_path}/manifest.json")
    unknown = run_cli("inspect", f"{tmp_path}/train-*")
    assert "no manifest.json" in unknown.stdout
    assert "green (stored 2)" in unknown.stdout and "(1)" not in unknown.stdout
    given = run_cli("inspect", f"{tmp_path}/train-*", "--label_offset", "1")
    assert given.returncode == 0 and "green (1)" in given.stdout and "red (0)" in given.stdout
    # An offset larger than the one written puts labels below 0: said, not drawn as "red (-1)"
    # alone.
    wrong = run_cli("inspect", f"{tmp_path}/train-*", "--label_offset", "2")
    assert wrong.returncode == 1
    assert ("1 record(s) read have a label below 0 with --label_offset 2: the smallest stored "
            "is 1, so the offset they were written with is at most 1 (tfrecord-pipe's is 1)"
            ) in wrong.stdout + wrong.stderr  # fmt: skip
    negative = run_cli("inspect", f"{tmp_path}/train-*", "--label_offset", "-3")
    assert negative.errors == ["error: label_offset must be >= 0, got -3"], negative.errors


def test_a_damaged_shard_leaves_the_others_histograms_drawn(tmp_path):
    # One shard cut in a record stopped the whole sample: no label or size histogram at all.
    write_dataset(str(tmp_path), {"train": [[0] * 6, [1, 2] * 3, [2] * 6]})
    cut = tmp_path / "train-00001-of-00003.tfrecord"
    cut.write_bytes(cut.read_bytes()[: cut.stat().st_size // 2 + 100])  # inside a record
    done = run_cli("inspect", tmp_path)
    assert done.returncode == 1
    assert f"at {cut}: " in done.stdout
    assert "(the histograms are of the other 2 shard(s))" in done.stdout
    drawn = [line.split() for line in done.stdout.splitlines() if "█" in line]
    assert sorted((words[0], words[-1]) for words in drawn if "(" in words[1]) == [
        ("blue", "6"), ("red", "6")]  # the first and third shards' labels  # fmt: skip


def test_records_with_labels_outside_the_labels_file_are_a_problem(tmp_path):
    write_dataset(str(tmp_path), {"train": [[0, 1, 2, 2]]})
    described = json.loads((tmp_path / "manifest.json").read_text())
    described["labels"] = ["red", "green"]  # as if edited, or converted again with fewer labels
    (tmp_path / "manifest.json").write_text(json.dumps(described))
    done = run_cli("inspect", tmp_path)
    assert done.returncode == 1
    assert "2 record(s) read have a label beyond the manifest's 2 labels" in done.stdout
    described["labels"], described["label_offset"] = ["red", "green", "blue"], 2
    (tmp_path / "manifest.json").write_text(json.dumps(described))
    done = run_cli("inspect", tmp_path)
    assert done.returncode == 1
    assert ("1 record(s) read have a stored label below the manifest's label_offset 2"
            in done.stdout + done.stderr)  # fmt: skip


def test_sample_records_reports_keys_labels_and_sizes(tmp_path):
    write_dataset(str(tmp_path), {"train": [[0, 1], [2]], "validation": [[1]]}, size=(40, 30))
    report = inspection.sample_records(str(tmp_path))
    assert report.records_read == 4 and len(report.files) == 3
    assert report.keys == schema.FEATURES
    assert report.labels == {"red (0)": 1, "green (1)": 2, "blue (2)": 1}
    assert report.heights == (30, 30) and report.widths == (40, 40)
    assert report.problems == ()
    assert "labels: blue (2) x1, green (1) x2, red (0) x1" in str(report)


def test_sample_records_flags_a_record_whose_image_is_not_its_stated_size(tmp_path):
    path = str(tmp_path / "odd.tfrecord")
    record = schema.ImageRecord(
        encoded=jpeg_bytes(20, 10, (1, 2, 3)), height=11, width=20, label_index=0,
        label_text="x", filename="x/1.jpg", sha256="0" * 64,
    )  # fmt: skip
    with tf.io.TFRecordWriter(path) as writer:
        writer.write(schema.serialize(record, label_offset=1))
        writer.write(b"not an example")
    report = inspection.sample_records(path, label_offset=1)
    assert report.records_read == 2
    assert any("decodes to (10, 20, 3), the record says 11x20x3" in p for p in report.problems)
    assert any("record 2: Not a tf.train.Example" in problem for problem in report.problems)


def test_sample_records_reports_a_truncated_shard_instead_of_raising(tmp_path):
    write_dataset(str(tmp_path), {"train": [[0, 1, 2]]})
    shard = tmp_path / "train-00000-of-00001.tfrecord"
    shard.write_bytes(shard.read_bytes()[:-50])
    report = inspection.sample_records(str(tmp_path))
    assert report.records_read == 2
    assert any("reading stopped after 2 records" in problem for problem in report.problems)


def damage(shard, how: str) -> None:
    data = bytearray(shard.read_bytes())
    if how == "truncated":
        shard.write_bytes(bytes(data[:-100]))
    elif how == "bit-flipped":
        data[len(data) // 2] ^= 0xFF
        shard.write_bytes(bytes(data))
    elif how == "stray bytes":  # fewer than a record header: TensorFlow reads them as the end
        shard.write_bytes(bytes(data) + b"garbage")
    else:
        shard.unlink()


@pytest.mark.parametrize("how", ["truncated", "bit-flipped", "stray bytes", "missing"])
def test_inspect_check_names_a_damaged_shard_without_a_traceback(converted_copy, how):
    # It used to end in a raw TensorFlow traceback that named no file.
    _, out = converted_copy
    shard = out / dataset.read_manifest(str(out)).splits["train"].files[0]
    damage(shard, how)
    done = run_cli("inspect", out, "--check")
    assert done.returncode == 1, done.stderr
    problems = [line for line in done.stdout.splitlines() if line.startswith("PROBLEM")]
    assert any(shard.name in line for line in problems), problems
    assert "Traceback" not in done.stdout + done.stderr and "function_node" not in done.stdout


def test_a_file_that_is_no_tfrecord_is_a_problem_not_zero_records(tmp_path):
    # A few bytes that are no TFRecord used to read as an empty, healthy file, --check too.
    (tmp_path / "notes.tfrecord").write_text("hello\n")
    for flags in ((), ("--check",)):
        done = run_cli("inspect", tmp_path / "notes.tfrecord", *flags)
        assert done.returncode == 1, (flags, done.stdout)
        assert any(line.startswith("PROBLEM") for line in done.stdout.splitlines())


@pytest.mark.parametrize(
    "grid, message",
    [("sheet.txt", "give a name ending in .png"), ("", "give a name ending in .png"),
     ("missing/sheet.png", "cannot write there"),
     ("/proc/sheet.png", "cannot write there")],  # writable by its mode, to root
)  # fmt: skip
def test_a_grid_that_cannot_be_written_is_refused_before_reading(converted, tmp_path, grid,
                                                                  message):  # fmt: skip
    # An unwritable --grid used to end in a TensorFlow traceback after the whole summary.
    _, out = converted
    done = run_cli("inspect", out, "--grid", tmp_path / grid)
    assert done.returncode == 2 and done.stdout == ""
    assert len(done.errors) == 1 and message in done.errors[0]


def test_a_grid_is_written_over_only_where_inspect_wrote_one(converted, tmp_path):
    # `--grid imgs/cat/0.png` replaced the user's photo with the sheet, without a word.
    _, out = converted
    photo = tmp_path / "photo.png"
    Image.new("RGB", (8, 8), "blue").save(photo)
    before = photo.read_bytes()
    done = run_cli("inspect", out, "--grid", photo)
    assert done.returncode == 2 and done.stdout == "" and photo.read_bytes() == before
    assert "a file of that name is there that does not say inspect drew it" in done.errors[0]
    sheet = tmp_path / "sheet.png"
    for _ in range(2):  # the second run replaces the first's sheet
        assert run_cli("inspect", out, "--grid", sheet).returncode == 0
    done = run_cli("inspect", out, "--grid", "")  # drew nothing and said nothing
    assert done.returncode == 2 and "give a name ending in .png" in done.errors[0]


def _records(out, files):
    for name in files:
        for serialized in tf.data.TFRecordDataset(str(out / name)):
            yield schema.decode_example(serialized.numpy(), label_offset=1)


@pytest.mark.slow  # a new process
def test_inspect_into_a_reader_that_stops_early_ends_quietly(converted):
    # `tfrecord-pipe inspect DS | head` ended with "error: [Errno 32] Broken pipe".
    _, out = converted
    command = shlex.join(command_line("inspect", out, preloaded=True))
    done = subprocess.run(["bash", "-c", f'{command} | true; exit "${{PIPESTATUS[0]}}"'],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 141 and "Broken pipe" not in done.stderr, done.stderr[-2000:]


def test_the_rejections_shown_say_how_many_more_there_are_and_where():
    # Five of 13 were shown, and nothing said there were more.
    rows = tuple({"path": f"a{i}.jpg", "reason": "unreadable", "error": "gone"} for i in range(5))
    summary = inspection.DatasetSummary("ds", False, None, (), {"unreadable": 13}, rows)
    lines = inspection.render(summary).splitlines()
    after = lines.index("rejected: 13 (unreadable 13)") + 6
    assert lines[after] == "  ... and 8 more, in ds/rejected"


def test_names_holding_characters_that_do_not_print_are_shown_escaped():
    # A file named "evil\x1b[2J\x1b[31mred.jpg" cleared the terminal and turned it red, as
    # the rejection inspect showed (a helper's trial); a bare pattern's labels are the
    # records' own.
    rows = ({"path": "cat/evil\x1b[2Jred.jpg", "reason": "not_an_image", "error": "not\rone"},)
    summary = inspection.DatasetSummary("ds", False, None, (), {"not_an_image": 1}, rows)
    lines = inspection.render(summary).splitlines()
    assert "  'cat/evil\\x1b[2Jred.jpg': not_an_image: 'not\\rone'" in lines
    assert inspection._histogram({"cat\x1b[31m": 2, "dog": 1})[0].startswith(
        "    'cat\\x1b[31m' ")  # fmt: skip
    assert all(line.isprintable() for line in lines)


@pytest.mark.slow  # the GCS emulator
def test_inspect_check_reads_a_dataset_on_gcs_as_on_disk(gcs, converted):
    # The count (one traced function for every shard) and the digest of inputs both read
    # through TensorFlow's GCS filesystem: OK as uploaded, and two records swapped are found.
    _, out = converted
    remote = gcs.url("inspect-check")
    for name in os.listdir(out):
        if os.path.isfile(out / name):
            tf.io.gfile.copy(str(out / name), f"{remote}/{name}")
    done = run_cli("inspect", remote, "--check")
    assert done.returncode == 0, done.stdout
    assert done.stdout.count("counts checked against the shards: OK") == 2, done.stdout
    info = dataset.read_manifest(str(out)).splits["train"]
    name = next(name for name, n in zip(info.files, info.shard_lengths) if n >= 2)
    found = [r.numpy() for r in tf.data.TFRecordDataset(str(out / name))]
    with tf.io.TFRecordWriter(f"{remote}/{name}") as writer:
        for record in [found[1], found[0], *found[2:]]:
            writer.write(record)
    done = run_cli("inspect", remote, "--check")
    assert done.returncode == 1, done.stdout
    assert f"{remote}/{name}: holds other inputs than the manifest lists" in done.stdout
    # A --grid on a storage that does not answer: a traceback (a helper's trial).
    with gcs.faults(error_rate=1.0):
        done = run_cli("inspect", out, "--grid", f"{remote}/sheet.png")
    assert done.returncode == 2 and done.stdout == "", done.stdout
    assert len(done.errors) == 1 and "Cannot reach --grid gs://" in done.errors[0], done.stderr
