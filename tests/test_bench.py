"""`tfrecord-pipe bench`: the reader's pipelines timed next to the decode ceiling."""

import pytest
import tensorflow as tf

from dataset_factory import write_dataset
from helpers import run_cli, run_command

# Records in a bare pattern's files (no manifest: counts unknown, so the shuffle buffer is not
# capped at an epoch): a training pipeline fills its buffer of 10,000 by reading the files
# again and again, and a file of one record took 5 CPU-s to fill it.
SHUFFLE_FILL = 100


@pytest.mark.slow
def test_bench_prints_train_and_eval_next_to_the_ceiling(converted):
    _, out = converted
    sizes = ("--image_size", "32", "--batch_size", "4")
    done = run_cli("bench", out, "--seconds", "0.05", *sizes, "--dtype", "uint8")
    assert done.returncode == 0, done.stderr
    assert "32x32 uint8, batch 4" in done.stdout
    rows = [line for line in done.stdout.splitlines() if line.startswith("| ")]
    assert [row.split("|")[1].strip() for row in rows[1:]] == ["ceiling", "train", "eval"]
    assert "1.00x" in rows[1]
    assert "training runs at" in done.stdout


@pytest.mark.slow
def test_bench_progress_in_a_log_is_plain_lines(converted):
    # stderr is a pipe here, as in a log file: no carriage returns, one last line per pipeline.
    _, out = converted
    done = run_command("bench", out, "--seconds", "0.05", "--image_size", "16", "--batch_size", "2",
                       preloaded=True)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "\r" not in done.stderr
    finals = [line for line in done.stderr.splitlines() if "img/s" in line]
    assert [line.split()[0] for line in finals[-3:]] == ["ceiling", "train", "eval"]
    assert all("[########################]" in line for line in finals[-3:])


def test_bench_with_an_unknown_dtype_exits_2_naming_the_choices(converted, capsys):
    # In the flag's words (it said "Invalid ReaderConfig: dtype must be ...": a helper's trial).
    from tfrecord_pipe._tools import cli

    _, out = converted
    with pytest.raises(SystemExit) as exited:
        cli.main(["bench", str(out), "--dtype", "float16"])
    assert exited.value.code == 2
    said = capsys.readouterr().err  # (how the choices are quoted differs between Pythons)
    assert said.startswith("error: argument --dtype: invalid choice: 'float16' (choose from ")
    assert all(dtype in said for dtype in ("float32", "bfloat16", "uint8")), said


def test_bench_on_a_pattern_that_matches_nothing_exits_2(tmp_path):
    done = run_cli("bench", f"{tmp_path}/train-*", "--seconds", "1")
    assert done.returncode == 2
    assert "matched no files" in done.stderr


@pytest.mark.slow  # over a second of CPU: out of the fast subset
def test_bench_on_records_it_cannot_read_is_one_error_line(tmp_path):
    # Another tool's TFRecord file, or a file of no records: a 40-line traceback.
    other = tf.train.Example(features=tf.train.Features(feature={
        "image_raw": tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"x"]))}))
    with tf.io.TFRecordWriter(str(tmp_path / "other.tfrecord")) as writer:
        for _ in range(SHUFFLE_FILL):
            writer.write(other.SerializeToString())
    (tmp_path / "nothing.tfrecord").write_bytes(b"x\n")
    for name, said in (("other", "(data type: int64) is required but could not be found"),
                       ("nothing", "gave no record: each is missing, empty, or")):  # fmt: skip
        done = run_cli("bench", tmp_path / f"{name}.tfrecord", "--label_offset", "1",
                       "--seconds", "0.05", "--image_size", "8")  # fmt: skip
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
        assert done.errors == [done.errors[0]] and said in done.errors[0], done.errors
        assert "inspect --check" not in done.errors[0]  # it would find nothing wrong there


@pytest.mark.slow
def test_bench_on_a_bare_pattern_needs_the_label_offset(tmp_path, caplog):
    write_dataset(str(tmp_path), {"train": [[0, 1, 2, 0] * (SHUFFLE_FILL // 4)]})
    tf.io.gfile.remove(f"{tmp_path}/manifest.json")
    pattern = f"{tmp_path}/train-*"
    unknown = run_cli("bench", pattern, "--seconds", "0.05", "--batch_size", "2")
    assert unknown.returncode == 2 and "--label_offset" in unknown.errors[0]
    given = run_cli(
        "bench", pattern, "--seconds", "0.05", "--batch_size", "2", "--image_size", "16",
        "--label_offset", "1",
    )  # fmt: skip
    assert given.returncode == 0, given.stderr
    assert "Padded evaluation" not in caplog.text  # a training script's note: bench takes no loss
    # An offset larger than the records were written with: refused before the ceiling is timed.
    wrong = run_cli("bench", pattern, "--seconds", "5", "--batch_size", "2", "--image_size", "16",
                    "--label_offset", "2")  # fmt: skip
    assert wrong.returncode == 2 and "Label below 0" in wrong.errors[0], wrong.errors
    assert "ceiling" not in wrong.stderr
    small = run_cli(
        "bench", pattern, "--seconds", "0.05", "--batch_size", "2", "--image_size", "16",
        "--label_offset", "1", "--shuffle_buffer", "0",
    )  # fmt: skip
    assert small.returncode == 2 and "shuffle_buffer must be >= 1, got 0" in small.errors[0]
    # A shard cut short: inspect --check names the shard, and is pointed to.
    [shard] = tmp_path.glob("train-*")
    # (Cut inside a record's 12-byte header, TensorFlow ends the file there without a word.)
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2 + 100])  # in a record
    cut = run_cli("bench", pattern, "--seconds", "0.2", "--batch_size", "2", "--image_size", "16",
                  "--label_offset", "1")  # fmt: skip
    assert cut.returncode == 2 and "truncated record" in cut.errors[0], cut.errors
    assert "`tfrecord-pipe inspect --check` names the shard" in cut.errors[0]


@pytest.mark.slow
def test_a_split_too_small_to_time_gets_a_warning_not_a_ratio(tmp_path):
    # An evaluation pass of one to three padded batches used to print 0.10-0.36x, which reads
    # as a slow reader; it is the pipeline starting again.
    write_dataset(str(tmp_path), {"train": [[0, 1] * 10], "validation": [[0, 1] * 12]})
    flags = ("--seconds", "0.1", "--image_size", "16")
    small = run_cli("bench", tmp_path, *flags, "--batch_size", "8")  # a pass: 3 batches
    assert small.returncode == 0, small.stderr
    (eval_row,) = [line for line in small.stdout.splitlines() if line.startswith("| eval")]
    assert "too small to time" in eval_row
    assert "WARNING: a pass of eval is only 3 batch(es)" in small.stdout
    assert "(or a smaller --batch_size)" in small.stdout  # 24 records: batches of 1 would do
    enough = run_cli("bench", tmp_path, *flags, "--batch_size", "1")  # a pass: 24 batches
    (eval_row,) = [line for line in enough.stdout.splitlines() if line.startswith("| eval")]
    assert eval_row.endswith("x |") and "WARNING" not in enough.stdout
    # Fewer records than batches a pass needs: no batch size helps, and none is advised.
    write_dataset(str(tmp_path / "tiny"), {"train": [[0, 1] * 10], "validation": [[0, 1] * 3]})
    tiny = run_cli("bench", tmp_path / "tiny", *flags, "--batch_size", "1")
    assert "Bench a split of at least 20 batches: it holds 6." in tiny.stdout, tiny.stdout


@pytest.mark.slow
def test_a_validation_split_without_records_is_benched_as_none_and_nan_seconds_refused(tmp_path):
    # Its every input rejected, the split has no shard: bench stopped ("no shards to read")
    # where a dataset without the split is benched, evaluation on train.
    write_dataset(str(tmp_path), {"train": [[0, 1] * 4], "validation": []})
    done = run_cli("bench", tmp_path, "--seconds", "0.05", "--image_size", "16", "--batch_size", "2")
    assert done.returncode == 0, done.stderr
    assert [line for line in done.stdout.splitlines() if line.startswith("| eval")]
    nan = run_cli("bench", tmp_path, "--seconds", "nan")
    assert nan.returncode == 2 and "--seconds nan: must be positive (and finite)" in nan.stderr
    # Each named alone where it alone is wrong (all three were named: a helper's trial).
    assert run_cli("bench", tmp_path, "--batch_size", "0").stderr == (
        "error: --batch_size 0: must be positive (and finite)\n")  # fmt: skip


@pytest.mark.slow
def test_a_dataset_without_a_train_split_is_benched_by_a_pattern_as_advised(tmp_path):
    # It was refused with the reader's advice, "pass split=", which bench has no flag for.
    write_dataset(str(tmp_path), {"validation": [[0, 1] * 12]})
    flags = ("--seconds", "0.05", "--image_size", "16", "--batch_size", "2")
    refused = run_cli("bench", tmp_path, *flags)
    assert refused.returncode == 2 and "has no split 'train' (it has ['validation'])" in \
        refused.errors[0], refused.errors
    assert refused.errors[0].endswith(f"as {tmp_path}/validation-*.")
    advised = run_cli("bench", f"{tmp_path}/validation-*", *flags)
    assert advised.returncode == 0, advised.stderr


def test_a_time_shorter_than_a_batch_still_times_one():
    # `--seconds 1e-9` printed a table of zeros: no batch came within the time.
    from tfrecord_pipe._tools import bench

    batches = tf.data.Dataset.range(40).batch(2)
    measured = bench.measure("train", batches, 1e-9, lambda batch: len(batch), show_progress=False)
    assert measured.images == 2 and measured.images_per_s > 0


def test_the_benchmark_suites_table_has_a_row_for_every_reader_pipeline():
    # `python -m benchmarks` ran every benchmark, then failed (KeyError: 'grain, train') and
    # wrote no table: the Grain rows had no target.
    from benchmarks import __main__ as suite
    from benchmarks import reader_bench

    convert = {"job": 100.0, "ceiling": 200.0, "rss": 40.0, "verify": 110.0, "verify_rss": 50.0}
    row = {"rate": 90.0, "ceiling": 0.9, "ceiling_range": (0.8, 1.0), "peak": 300.0,
           "article": 1.4, "train": 1.0}  # fmt: skip
    lines = suite.table([(1000, convert), (4000, convert)],
                        {name: row for name in reader_bench.PIPELINES})  # fmt: skip
    assert [line.split(" | ")[0] for line in lines if line.startswith("| reader ")] == [
        f"| reader {name}" for name in reader_bench.PIPELINES
    ]


def test_the_csv_list_benchmark_prints_its_table(tmp_path, capsys):
    from benchmarks import csv_list_bench

    csv_list_bench.main(["--lines", "50", "--repeats", "1", "--cache", str(tmp_path)])
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].startswith("$ python -m benchmarks.csv_list_bench --lines 50")
    assert [line.split(" | ")[0] for line in printed[3:]] == ["| csv.reader (ceiling)",
                                                              "| resolve_layout"]
