"""`tfrecord-pipe inspect` and `verify`, run as installed commands in a subprocess, on local
paths and on gs:// in the test GCS."""

import os
import pathlib
import shutil
import subprocess
import sys

import pytest
import tensorflow as tf
from PIL import Image

from beam_jobs import convert
from tfrecord_pipe import manifest, schema

from conftest import ODD_IMAGES, jpeg_bytes

COMMAND = str(pathlib.Path(sys.executable).parent / "tfrecord-pipe")
IN_PROCESS = ["--direct_num_workers=1", "--direct_running_mode=in_memory"]
COLOURS = {"blue": (20, 20, 220), "green": (20, 200, 20), "red": (220, 20, 20)}


def tfrecord_pipe(*args, env=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [COMMAND, *map(str, args)], capture_output=True, text=True, timeout=300,
        env=dict(os.environ, **(env or {})),
    )  # fmt: skip


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """An image folder (5 per label, one truncated file) and its dataset, written by the job."""
    root = tmp_path_factory.mktemp("cli")
    src = root / "src"
    for label, colour in COLOURS.items():
        (src / label).mkdir(parents=True)
        for i in range(5):
            (src / label / f"{i:03d}.jpg").write_bytes(jpeg_bytes(10 + i, 12, colour))
    shutil.copy(ODD_IMAGES / "truncated_jpeg.jpg", src / "red" / "truncated_jpeg.jpg")
    convert.run([str(src), str(root / "out"), "--num_shards", "2", "--validation_fraction",
                 "0.3"] + IN_PROCESS)  # fmt: skip
    return src, root / "out"


@pytest.fixture
def dataset_copy(converted, tmp_path):
    """A copy of the converted dataset that a test may tamper with."""
    src, out = converted
    shutil.copytree(out, tmp_path / "out")
    return src, tmp_path / "out"


def test_inspect_shows_splits_labels_sizes_and_rejections(converted):
    _, out = converted
    done = tfrecord_pipe("inspect", out, "--check")
    assert done.returncode == 0, done.stderr
    text = done.stdout
    assert "3 labels, label_offset 1" in text
    assert "train:" in text and "validation:" in text and "in 2 shards" in text
    assert "counts checked against the shards: OK" in text
    assert "blue" in text and "█" in text  # the label histogram
    assert "image height 12..12" in text
    assert "rejected: 1 (truncated 1)" in text and "truncated_jpeg.jpg" in text


def test_inspect_grid_draws_every_sample_with_its_label(converted, tmp_path):
    _, out = converted
    grid = tmp_path / "grid.png"
    done = tfrecord_pipe("inspect", out, "--grid", grid, "--grid_count", "8")
    assert done.returncode == 0, done.stderr
    assert "contact sheet of 8 records" in done.stdout
    sheet = Image.open(grid)
    assert sheet.size == (6 * 132 + 4, 2 * (128 + 18 + 4) + 4)  # 8 tiles: two rows of six


def test_inspect_check_catches_a_manifest_that_disagrees_with_a_shard(dataset_copy):
    _, out = dataset_copy
    found = manifest.read(str(out))
    info = found.splits["train"]
    lengths = (info.shard_lengths[0] + 1,) + info.shard_lengths[1:]
    splits = dict(found.splits)
    splits["train"] = manifest.SplitInfo(
        info.num_examples + 1, lengths, info.num_bytes, info.listed + 1, info.rejected, info.files
    )
    manifest.write(str(out), manifest.Manifest(**{**found.__dict__, "splits": splits}))
    done = tfrecord_pipe("inspect", out, "--check")
    assert done.returncode == 1
    assert "PROBLEM" in done.stdout and "the shard holds" in done.stdout


@pytest.mark.parametrize(
    "make_path, message",
    [
        (lambda tmp: tmp / "missing", "does not exist"),
        (lambda tmp: tmp, "No TFRecord files"),  # an empty folder
        (lambda tmp: f"{tmp}/train-*", "No TFRecord files"),  # a pattern that matches nothing
    ],
)
def test_inspect_bad_input_is_one_clear_line_and_exit_2(tmp_path, make_path, message):
    done = tfrecord_pipe("inspect", make_path(tmp_path))
    assert done.returncode == 2
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and message in errors[0]


def test_verify_passes_on_an_untouched_conversion(converted):
    src, out = converted
    done = tfrecord_pipe("verify", src, out)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "16 sources listed; 15 records in the shards; 1 rejected" in done.stdout
    assert done.stdout.strip().endswith("OK")


def rewrite_shard(path: pathlib.Path, change) -> None:
    """Rewrites a shard with `change(list of serialized records)` applied (valid CRCs)."""
    records = [r.numpy() for r in tf.data.TFRecordDataset(str(path))]
    with tf.io.TFRecordWriter(str(path)) as writer:
        for record in change(records):
            writer.write(record)


def first_shard(out: pathlib.Path) -> pathlib.Path:
    return out / manifest.read(str(out)).splits["train"].files[0]


def test_verify_catches_a_deleted_shard(dataset_copy):
    src, out = dataset_copy
    first_shard(out).unlink()
    done = tfrecord_pipe("verify", src, out)
    assert done.returncode == 1
    assert "is missing (the manifest lists" in done.stdout
    assert "in no shard and not in rejected/ (lost)" in done.stdout


def test_verify_catches_a_duplicated_record(dataset_copy):
    src, out = dataset_copy
    rewrite_shard(first_shard(out), lambda records: records + records[:1])
    done = tfrecord_pipe("verify", src, out)
    assert done.returncode == 1
    assert "written 2 times" in done.stdout


def test_verify_catches_a_modified_record(dataset_copy):
    src, out = dataset_copy

    def repaint(records):
        record = schema.decode_example(records[0])
        changed = schema.ImageRecord(
            **{**record.__dict__, "encoded": jpeg_bytes(record.width, record.height, (1, 2, 3))}
        )
        return [schema.serialize(changed)] + records[1:]

    rewrite_shard(first_shard(out), repaint)
    done = tfrecord_pipe("verify", src, out)
    assert done.returncode == 1
    assert "(modified record)" in done.stdout


def test_verify_catches_a_source_in_neither_shards_nor_rejected(dataset_copy):
    src, out = dataset_copy
    (src_copy := out.parent / "src").mkdir()
    shutil.copytree(src, src_copy, dirs_exist_ok=True)
    (src_copy / "green" / "999.jpg").write_bytes(jpeg_bytes(9, 9, (0, 250, 0)))  # never converted
    done = tfrecord_pipe("verify", src_copy, out)
    assert done.returncode == 1
    assert "green/999.jpg: listed but in no shard and not in rejected/ (lost)" in done.stdout


def test_verify_a_folder_that_is_not_a_dataset_exits_2(converted):
    src, _ = converted
    done = tfrecord_pipe("verify", src, src)
    assert done.returncode == 2
    assert "not a finished tfrecord-pipe dataset" in done.stderr


def test_inspect_and_verify_on_gcs(converted, gcs):
    src, out = converted
    for local, remote in ((src, gcs.url("cli", "src")), (out, gcs.url("cli", "out"))):
        for path in local.rglob("*"):
            if path.is_file():
                tf.io.gfile.makedirs(f"{remote}/{path.parent.relative_to(local)}")
                tf.io.gfile.copy(str(path), f"{remote}/{path.relative_to(local)}", overwrite=True)
    inspected = tfrecord_pipe("inspect", gcs.url("cli", "out"), env=gcs.environ)
    assert inspected.returncode == 0, inspected.stderr
    assert "rejected: 1 (truncated 1)" in inspected.stdout
    verified = tfrecord_pipe("verify", gcs.url("cli", "src"), gcs.url("cli", "out"), env=gcs.environ)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert verified.stdout.strip().endswith("OK")
    missing = tfrecord_pipe("inspect", "gs://no-such-bucket/data", env=gcs.environ)
    assert missing.returncode == 2 and "error:" in missing.stderr


def test_bench_prints_train_and_eval_next_to_the_ceiling(converted):
    _, out = converted
    sizes = ("--image_size", "32", "--batch_size", "4")
    done = tfrecord_pipe("bench", out, "--seconds", "1", *sizes, "--dtype", "uint8")
    assert done.returncode == 0, done.stderr
    assert "32x32 uint8, batch 4" in done.stdout
    rows = [line for line in done.stdout.splitlines() if line.startswith("| ")]
    assert [row.split("|")[1].strip() for row in rows[1:]] == ["ceiling", "train", "eval"]
    assert "1.00x" in rows[1]
    assert "training runs at" in done.stdout
    assert "[####" in done.stderr  # the progress bar


def test_bench_with_an_unknown_dtype_exits_2_naming_the_choices(converted):
    _, out = converted
    done = tfrecord_pipe("bench", out, "--dtype", "float16")
    assert done.returncode == 2
    assert "dtype must be one of ('float32', 'bfloat16', 'uint8'), got 'float16'" in done.stderr


def test_bench_on_a_pattern_that_matches_nothing_exits_2(tmp_path):
    done = tfrecord_pipe("bench", f"{tmp_path}/train-*", "--seconds", "1")
    assert done.returncode == 2
    assert "matched no files" in done.stderr


def test_inspect_a_bare_pattern_counts_from_the_shards(converted):
    _, out = converted
    done = tfrecord_pipe("inspect", f"{out}/train-*")
    assert done.returncode == 0, done.stderr
    train = manifest.read(str(out)).splits["train"].num_examples
    assert "no manifest.json" in done.stdout
    assert f"train: {train} records in 2 shards" in done.stdout


def test_verify_a_csv_conversion_with_a_duplicate_line_and_a_missing_file(tmp_path):
    (tmp_path / "imgs").mkdir()
    lines = ["path,label,split"]
    for i, (label, colour) in enumerate(COLOURS.items()):
        (tmp_path / "imgs" / f"{i}.jpg").write_bytes(jpeg_bytes(9, 9, colour))
        lines.append(f"imgs/{i}.jpg,{label},train")
    lines += ["imgs/0.jpg,green,validation", "imgs/missing.jpg,red,train"]
    (tmp_path / "list.csv").write_text("\n".join(lines) + "\n")
    convert.run([str(tmp_path / "list.csv"), str(tmp_path / "out")] + IN_PROCESS)
    done = tfrecord_pipe("verify", tmp_path / "list.csv", tmp_path / "out")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "5 sources listed; 3 records in the shards; 2 rejected" in done.stdout
