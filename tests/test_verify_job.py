"""`tfrecord-pipe verify SRC OUT --runner ...`: the same checks as a Beam pipeline, for
datasets one machine should not re-read. Run here on Beam's local runner, on local folders
and the test GCS; on Dataflow only its graph and staged wheel are checked (offline)."""

import json
import os
import pathlib
import re
import zipfile

import pytest
import tensorflow as tf
from apache_beam.portability.api import beam_runner_api_pb2
from google.cloud import storage

from beam_jobs import convert, flags
from beam_jobs import storage as beam_storage
from tfrecord_pipe._core import schema
from tfrecord_pipe._reading import dataset
from tfrecord_pipe._tools import verify_job, verify_reading, verify_rules

from helpers import IN_PROCESS, jpeg_bytes, run_cli, verified_both_ways, with_label_added

pytestmark = pytest.mark.slow  # each test runs Beam pipelines

LOCAL = ["--runner", "DirectRunner", *IN_PROCESS]


def rewrite_shard(path: pathlib.Path, change) -> None:
    records = [r.numpy() for r in tf.data.TFRecordDataset(str(path))]
    with tf.io.TFRecordWriter(str(path)) as writer:
        for record in change(records):
            writer.write(record)


def test_the_pipeline_finds_every_problem_local_verify_finds(converted_copy):
    src, out = converted_copy
    found = dataset.read_manifest(str(out))
    train, validation = (found.splits[name].files for name in ("train", "validation"))

    def repaint(records):
        record = schema.decode_example(records[0], label_offset=1)
        changed = schema.ImageRecord(**{**record.__dict__, "encoded": jpeg_bytes(3, 3)})
        return [schema.serialize(changed, label_offset=1), b"not a record", *records[1:]]

    rewrite_shard(out / train[0], lambda records: records + records[:1])  # written twice
    rewrite_shard(out / train[1], repaint)  # a modified record, and one that does not parse
    (out / validation[1]).unlink()  # its sources lost
    (src / "green" / "new.jpg").write_bytes(jpeg_bytes(9, 9, (0, 250, 0)))  # never converted
    rejected = next((out / "rejected").iterdir())
    line = json.loads(rejected.read_text().splitlines()[0])
    with rejected.open("a") as lines:  # an extra line, for a file no source is
        lines.write(json.dumps({**line, "relpath": "gone.jpg", "path": "gone.jpg"}) + "\n")
    (out / "labels.txt").write_text("red\nblue\n")

    report = verified_both_ways(src, out)
    assert report.num_problems >= 8, report
    for said in ("written 2 times", "(modified record)", "does not parse", "is missing",
                 "(lost, or added to the source since)", "green/new.jpg",
                 "gone.jpg: in rejected/", "labels.txt"):  # fmt: skip
        assert any(said in problem for problem in report.problems), (said, report)


def test_the_command_runs_the_pipeline_given_beam_flags_and_exits_as_locally(converted_copy):
    src, out = converted_copy
    done = run_cli("verify", src, out, "--runner=direct", *IN_PROCESS)  # Beam's names, any case
    assert done.returncode == 0, done.stdout + done.stderr
    assert "16 sources listed; 15 records in the shards; 1 rejected" in done.stdout
    assert done.stdout.strip().endswith("OK")
    (out / dataset.read_manifest(str(out)).splits["train"].files[0]).unlink()
    done = run_cli("verify", src, out, *LOCAL)
    assert done.returncode == 1 and "is missing" in done.stdout


def test_the_same_first_problems_are_listed_both_ways_those_of_files_first(
    converted_copy, monkeypatch
):
    src, out = converted_copy
    changed = sorted((src / "red").iterdir())
    for i, path in enumerate(changed):  # a problem each: 5 changed, 1 no longer truncated
        path.write_bytes(jpeg_bytes(5 + i, 5, (1, 1, 1)))
    shard = dataset.read_manifest(str(out)).splits["validation"].files[0]
    (out / shard).unlink()  # a file's problem, and its records' sources lost
    monkeypatch.setattr(verify_rules, "MAX_PROBLEMS_KEPT", 2)
    report = verified_both_ways(src, out)
    assert report.num_problems > len(changed) + 1 and len(report.problems) == 2
    assert report.problems[0].startswith(f"shard {shard} is missing"), report
    assert f"... and {report.num_problems - 2} more" in str(report)


def test_damaged_rejection_and_duplicate_files_are_problems_not_crashes(converted_copy):
    src, out = converted_copy
    found = dataset.read_manifest(str(out))
    (split,) = [name for name, info in found.splits.items() if info.rejected]
    other = ({"train", "validation"} - {split}).pop()
    with (out / "rejected" / f"rejected-{split}.jsonl").open("a") as lines:
        lines.write("not json\n" + json.dumps({"reason": "truncated"}) + "\n[1, 2]\n")
        lines.write("[" * 100_000 + "\n")  # nested past Python's recursion limit
    # A file the manifest counts no rejections in, claiming a stored input.
    stored = schema.decode_example(
        next(iter(tf.data.TFRecordDataset(str(out / found.splits[other].files[0])))).numpy(),
        label_offset=1,
    ).filename
    (out / "rejected" / f"rejected-{other}.jsonl").write_text(
        json.dumps({"path": stored, "relpath": stored, "split": other, "reason": "truncated"})
        + "\n"
    )
    (out / "duplicates.jsonl").write_text(json.dumps({"sha256": ["a"], "files": []}) + "\n")
    (out / "rejected" / "rejected-nosuch.jsonl").write_text("{}\n")  # of no split
    # The end of a shard cut off: what it holds before the cut is still checked.
    shard = out / found.splits["train"].files[0]
    whole = shard.read_bytes()
    shard.write_bytes(whole[: len(whole) * 2 // 3])
    # A stored input that the converter would reject now: one line says so, not two.
    relpath = schema.decode_example(
        next(
            iter(tf.data.TFRecordDataset(str(out / found.splits["validation"].files[-1])))
        ).numpy(),
        label_offset=1,
    ).filename
    (src / relpath).unlink()
    os.mkfifo(src / relpath)

    report = verified_both_ways(src, out)
    said = "\n".join(report.problems)
    for line in (2, 3, 4, 5):
        assert f"rejected-{split}.jsonl line {line} is not a rejection" in said
    assert f"rejected-{other}.jsonl holds 1 lines, the manifest counts 0 rejected" in said
    assert f"{stored}: an extra rejection line (truncated)" in said
    assert "duplicates.jsonl is not a duplicates report" in said
    assert "rejected/rejected-nosuch.jsonl: not a split of the manifest" in said
    cut = re.search(rf"shard {shard.name} is corrupt after (\d+) records", said)
    assert cut and int(cut.group(1)) > 0, said
    assert [p for p in report.problems if p.startswith(relpath)] == [
        f"{relpath}: has a record, but the converter would reject it now (not_a_regular_file)"
    ]


def test_bad_flags_are_refused_before_anything_runs(converted, tmp_path, monkeypatch):
    src, out = converted
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr("tempfile.tempdir", None)
    misspelt = run_cli("verify", src, out, "--runer", "DirectRunner")
    assert misspelt.returncode == 2 and "Did you mean --runner?" in misspelt.stderr
    assert "neither verify's nor Beam's" in misspelt.stderr
    for where in ([], ["--temp_location", str(tmp_path)]):  # none, or not on gs://
        remote = run_cli("verify", src, out, "--runner", "DataflowRunner", "--project", "p", *where)
        assert remote.returncode == 2 and "--temp_location gs://" in remote.stderr
    assert not list(tmp_path.iterdir())  # no wheel built for a job that will not run
    first = run_cli("verify", "--runner", "DirectRunner", src, out)
    assert first.returncode == 2 and "Give SRC and OUT first" in first.stderr
    for after in (["--runner", "DirectRunner"], ["--runner=DirectRunner", "--save_main_session"]):
        stray = run_cli("verify", src, out, *after, "extra")
        assert stray.returncode == 2 and "Unexpected argument 'extra'" in stray.stderr
        assert "shell pattern" not in stray.stderr  # a word, no path
    folders = run_cli("verify", src, out, tmp_path)  # `verify data/* ...`: a third folder
    assert folders.returncode == 2 and "gives one argument per folder it matches" in folders.stderr
    workers = run_cli("verify", src, out, "--direct_num_workers", "-1")  # an IndexError in Beam
    assert workers.returncode == 2 and "--direct_num_workers -1: give how many" in workers.stderr
    template = run_cli("verify", src, out, *LOCAL, "--template_location", "t.json")
    assert template.returncode == 2 and "--template_location" in template.stderr


def test_a_failed_job_exits_1_with_one_line_and_leaves_nothing(converted, monkeypatch, tmp_path):
    src, out = converted
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr("tempfile.tempdir", None)

    def storage_gone(*_):
        raise OSError("the storage went away")

    monkeypatch.setattr(verify_rules.Expect, "__call__", storage_gone)
    done = run_cli("verify", src, out, *LOCAL)
    assert done.returncode == 1
    assert done.stderr.startswith("error: The verify job failed") and "went away" in done.stderr
    assert "nothing was proven either way" in done.stderr
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("tfrecord-pipe-verify-")]


def test_on_gcs_inspect_and_both_verifies_read_both_sides_there(converted, gcs, monkeypatch):
    src, out = converted
    for local, remote in ((src, gcs.url("vj", "src")), (out, gcs.url("vj", "out"))):
        for path in local.rglob("*"):
            if path.is_file():
                tf.io.gfile.makedirs(f"{remote}/{path.parent.relative_to(local)}")
                tf.io.gfile.copy(str(path), f"{remote}/{path.relative_to(local)}", overwrite=True)
    inspected = run_cli("inspect", gcs.url("vj", "out"))
    assert inspected.returncode == 0, inspected.stderr
    assert "rejected: 1 (truncated 1)" in inspected.stdout
    missing = run_cli("inspect", "gs://no-such-bucket/data")
    assert missing.returncode == 2 and missing.errors
    bucket = storage.Client().bucket(gcs.bucket)
    bucket.blob("vj/src/red/extra.jpg").upload_from_string(jpeg_bytes(7, 7))
    # The report goes through --temp_location on the test GCS, as on Dataflow, and is removed.
    temp, read = gcs.url("vj-tmp"), []
    real_read = beam_storage.read_text
    monkeypatch.setattr(
        beam_storage, "read_text", lambda path: read.append(path) or real_read(path)
    )
    report = verified_both_ways(gcs.url("vj", "src"), gcs.url("vj", "out"), "--temp_location", temp)
    reports = [path for path in read if path.endswith(verify_job.REPORT_NAME)]
    assert reports and all(path.startswith(temp + "/") for path in reports)
    assert not list(bucket.list_blobs(prefix="vj-tmp/"))
    assert report.sources == 17 and report.records == 15 and report.num_problems == 2, report
    lost = "red/extra.jpg: listed but in no shard and not in rejected/ (lost, or added to the"
    assert f"{lost} source since)" in report.problems
    assert any(p.startswith(f"split {split}: the manifest lists") for p in report.problems
               for split in ("train", "validation"))  # fmt: skip


def test_on_dataflow_the_job_stages_a_wheel_without_tensorflow_and_every_step(converted, gcs,
                                                                           tmp_path):  # fmt: skip
    # --template_location: the DataflowRunner checks the graph and stages it, without submitting.
    src, out = converted
    found = verify_reading.read_conversion(str(out))
    options = flags.pipeline_options(
        ["--runner", "DataflowRunner", "--project", "test-project", "--region", "us-central1",
         "--temp_location", gcs.url("vj-tmp"), "--staging_location", gcs.url("vj-staging"),
         "--template_location", str(tmp_path / "template.json")],
        False,
    )  # fmt: skip
    import apache_beam as beam

    job = beam.Pipeline(options=options)
    config = verify_reading.source_config(str(src), str(out), found)
    _ = job | "Verify" >> verify_job.VerifyDataset(str(out), found, config, "unused")
    try:
        job.run()
    finally:
        flags.remove_wheel(options)
    blobs = {
        b.name.rsplit("/", 1)[-1]: b
        for b in storage.Client().bucket(gcs.bucket).list_blobs(prefix="vj-staging/")
    }
    proto = beam_runner_api_pb2.Pipeline()
    proto.ParseFromString(blobs["pipeline.pb"].download_as_bytes())
    labels = {t.unique_name for t in proto.components.transforms.values()}
    for step in ("ReadShards", "ReadRejected", "List/Walk", "Expect", "JoinByPath",
                 "CheckPaths", "JoinByContent", "CheckContents", "WriteReport"):  # fmt: skip
        assert any(step in label for label in labels), step
    # What workers pip-install: Beam, not TensorFlow (700 MB a worker, never imported).
    wheel = next(name for name in blobs if name.endswith(".whl"))
    blobs[wheel].download_to_filename(tmp_path / wheel)
    with zipfile.ZipFile(tmp_path / wheel) as archive:
        names = archive.namelist()
        metadata = next(n for n in names if n.endswith(".dist-info/METADATA"))
        requires = archive.read(metadata).decode()
    assert "Requires-Dist: apache-beam" in requires and "Requires-Dist: tensorflow" not in requires
    assert "tfrecord_pipe/_tools/verify_job.py" in names


def test_a_csv_list_is_listed_as_the_converter_did_one_record_per_file(tmp_path):
    (tmp_path / "imgs").mkdir()
    lines = ["path,label,split"]
    for i, label in enumerate(("blue", "green", "red")):
        (tmp_path / "imgs" / f"{i}.jpg").write_bytes(jpeg_bytes(9, 9 + i))
        lines.append(f"imgs/{i}.jpg,{label},train")
    # A label only a line dropped as naming a file again gives is no label of the dataset; a
    # label only a missing file gives is one (its input is rejected as unreadable).
    # A file named twice in train and once in validation has a rejection line in each.
    lines += ["imgs/0.jpg,green,validation", "./imgs/1.jpg,yellow,train",
              "imgs/gone.jpg,purple,train", "imgs/2.jpg,red,train", "imgs/2.jpg,blue,validation"]
    listed = tmp_path / "list.csv"
    listed.write_text("\n".join(lines) + "\n")
    convert.run([str(listed), str(tmp_path / "out"), *IN_PROCESS])
    found = dataset.read_manifest(str(tmp_path / "out"))
    assert found.labels == ("blue", "green", "purple", "red")
    report = verified_both_ways(listed, tmp_path / "out")
    assert (report.sources, report.records, report.rejected, report.ok) == (8, 3, 5, True), report
    # The manifest edited with the files made from it: its labels are checked as a folder's.
    dataset.write_manifest(str(tmp_path / "out"), with_label_added(found, "yellow"))
    report = verified_both_ways(listed, tmp_path / "out")
    assert report.problems == (("manifest.json: its labels are not the sorted labels of the "
                                "sources listed now (not among the sources: 'yellow'): a line "
                                "added or removed since, or the manifest edited"),)  # fmt: skip
    dataset.write_manifest(str(tmp_path / "out"), found)
    listed.write_text("\n".join(lines + ["imgs/2.jpg,blue,validation"]) + "\n")  # a line added
    report = verified_both_ways(listed, tmp_path / "out")
    assert "imgs/2.jpg: should be rejected (duplicate), but is in no shard and not in " in (
        "".join(report.problems)
    )


def test_rejection_lines_pair_with_their_own_split_first():
    # Paired in turn, the first expected rejection took the other's line: two problems said
    # where one is true (a line in test, where validation is expected).
    expected = [{"rejected": "duplicate", "split": "validation"},
                {"rejected": "duplicate", "split": "train"}]  # fmt: skip
    lines = [{"reason": "duplicate", "split": "train"}, {"reason": "duplicate", "split": "test"}]
    problems = []
    verify_rules._check_rejections("a.jpg", expected, lines, problems)
    assert problems == ["a.jpg: rejected in split test, but listed in validation"]
