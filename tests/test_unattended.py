"""The job finishes itself: its last step finalises the dataset, with nobody waiting (Dataflow,
a template), and every write and the finalise can run again, or after failing midway, and
end with the same bytes (Dataflow retries failed bundles and may run a slow one twice)."""

import errno
import hashlib
import logging
import pathlib
import shutil
import subprocess
import sys

import apache_beam as beam
import google_crc32c
import pytest
import tensorflow as tf
from apache_beam.options.pipeline_options import PipelineOptions

import tfrecord_pipe
from beam_jobs import (
    claim,
    finalise,
    load,
    pipeline,
    record_writer,
    shard_plan,
    shard_writer,
    sources,
    storage,
    write_shards,
)
from beam_jobs.config import ConvertConfig
from tfrecord_pipe._core import array_records, images, naming

from helpers import IN_PROCESS, open_under, run_cli, write_image_folder

ROOT = pathlib.Path(__file__).resolve().parents[1]
ODD = ("truncated_jpeg.jpg", "hopper.png")


def tree(folder) -> dict[str, str]:
    """Every file below `folder`, by relative path, with a digest of its bytes."""
    folder = pathlib.Path(folder)
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}  # fmt: skip


def launch(config: ConvertConfig, run: str | None = None) -> str:
    """The pipeline as a launcher that does not wait builds it; the test runs it to the end
    and returns its temporary folder. No launcher code runs after the job."""
    temp_dir = str(pathlib.Path(config.output) / f"{finalise.TEMP_PREFIX}{run or 'template'}")
    job = beam.Pipeline(options=PipelineOptions(["--runner=FnApiRunner", *IN_PROCESS]))
    pipeline.build_pipeline(job, config, temp_dir, None, version=tfrecord_pipe.__version__, run=run)
    job.run().wait_until_finish()
    return temp_dir


def config_for(src, out, **options) -> ConvertConfig:
    config = ConvertConfig(source=str(src), output=str(out), validation_fraction=0.3, **options)
    return sources.resolve_layout(config)


def killed_after_moving(monkeypatch, config: ConvertConfig) -> None:
    """Runs the job with a finalise that dies once it has moved the files into place."""
    real_move = finalise._move

    def dies_after_moving(moves, still_held):
        real_move(moves, still_held)
        raise OSError("worker lost after the moves")

    monkeypatch.setattr(finalise, "_move", dies_after_moving)
    with pytest.raises(OSError, match="worker lost after the moves"):
        launch(config)
    monkeypatch.setattr(finalise, "_move", real_move)


@pytest.mark.slow
def test_the_job_finalises_on_its_own_and_gives_up_the_launchers_claim(tmp_path, caplog):
    src = write_image_folder(tmp_path / "src", per_label=6, odd=ODD)
    (src / "__MACOSX").mkdir()  # a label whose every input is rejected
    (src / "__MACOSX" / "._0.jpg").write_bytes(b"\x00\x05\x16\x07" * 20)
    out = tmp_path / "out"
    held = claim.Claim(str(out))
    with held:
        held.hand_over()  # what the launcher does before it returns
    assert (out / claim.CLAIM_NAME).exists()  # the job holds it now, not the launcher
    with caplog.at_level(logging.WARNING, logger="beam_jobs.pipeline"):
        launch(config_for(src, out, num_shards=2), run=held.run)
    # Nobody prints a summary: the job's log has what it would have said.
    assert [record.getMessage() for record in caplog.records
            if record.name == "beam_jobs.pipeline"][-1].startswith(
        "labels with no record (every input of theirs was rejected): '__MACOSX'"
    ), caplog.records  # fmt: skip
    assert (out / naming.MANIFEST_NAME).exists()
    assert not (out / claim.CLAIM_NAME).exists()
    assert not [p for p in out.iterdir() if p.name.startswith(finalise.TEMP_PREFIX)]
    assert run_cli("verify", src, out).returncode == 0


@pytest.mark.slow
def test_the_job_finalises_on_its_own_into_gcs(gcs, tmp_path):
    from google.cloud import storage as gcs_storage

    src = write_image_folder(tmp_path / "src", per_label=4, odd=ODD)
    out = gcs.url("unattended[1]")  # brackets: taken literally, not as a pattern
    config = config_for(src, out, num_shards=2)
    job = beam.Pipeline(options=PipelineOptions(["--runner=FnApiRunner", *IN_PROCESS]))
    temp_dir = f"{out}/{finalise.TEMP_PREFIX}gcsrun"
    pipeline.build_pipeline(job, config, temp_dir, None, version=tfrecord_pipe.__version__)
    job.run().wait_until_finish()
    names = {
        b.name for b in gcs_storage.Client().bucket(gcs.bucket).list_blobs(prefix="unattended[1]/")
    }
    assert "unattended[1]/manifest.json" in names
    assert not [n for n in names if finalise.TEMP_PREFIX in n or storage.PART_PREFIX in n]
    assert run_cli("verify", src, out).returncode == 0


@pytest.mark.slow
def test_finalising_again_changes_no_byte_and_a_failed_finalise_finishes_when_run_again(
    tmp_path, monkeypatch
):
    src = write_image_folder(tmp_path / "src", per_label=6, odd=ODD)
    out = tmp_path / "out"
    config = config_for(src, out, num_shards=2)
    launch(config)
    expected = tree(out)  # a run that nothing went wrong in
    shutil.rmtree(out)

    # A finalise that dies after moving the shards, before the manifest (a worker lost).
    real_write = storage.write_bytes

    def dies_at_the_manifest(path, data, mime_type="application/octet-stream"):
        if path.endswith(naming.MANIFEST_NAME):
            raise OSError("worker lost")
        real_write(path, data, mime_type)

    monkeypatch.setattr(storage, "write_bytes", dies_at_the_manifest)
    with pytest.raises(OSError, match="worker lost"):
        launch(config)
    monkeypatch.setattr(storage, "write_bytes", real_write)
    assert not (out / naming.MANIFEST_NAME).exists()  # no manifest over a half-finished folder
    temp_dir = out / f"{finalise.TEMP_PREFIX}template"
    finalise.finalise(config, str(temp_dir), tfrecord_pipe.__version__)  # the retry
    assert tree(out) == expected
    finalise.finalise(config, str(temp_dir), tfrecord_pipe.__version__)  # and once more
    assert tree(out) == expected


@pytest.mark.slow
def test_an_overwrite_whose_finalise_is_retried_still_removes_the_old_datasets_files(
    tmp_path, monkeypatch
):
    src = write_image_folder(tmp_path / "src", per_label=6)
    out = tmp_path / "out"
    launch(config_for(src, out, num_shards=3))
    old_files = {p.name for p in out.glob("*.tfrecord")}
    config = config_for(src, out, num_shards=1, overwrite=True)
    killed_after_moving(monkeypatch, config)
    assert not (out / naming.MANIFEST_NAME).exists()  # the old one went first
    finalise.finalise(
        config, str(out / f"{finalise.TEMP_PREFIX}template"), tfrecord_pipe.__version__
    )
    shards = {p.name for p in out.glob("*.tfrecord")}
    assert len(shards) == 2 and not shards & (old_files - shards)  # one per split, old ones gone
    assert run_cli("verify", src, out).returncode == 0


def checked_entries(folder: pathlib.Path) -> list[load.Checked]:
    """What LoadImages makes of each JPEG in `folder` (label "red")."""
    entries = []
    for path in sorted(folder.rglob("*.jpg")):
        data = path.read_bytes()
        stored = images.normalise(data)
        relpath = f"red/{path.name}"
        entries.append(load.Checked(
            key=shard_plan.order_key(relpath), path=str(path), relpath=relpath, label_index=0,
            label_text="red", sha256=hashlib.sha256(data).hexdigest(),
            crc32c=google_crc32c.value(data), height=stored.height, width=stored.width,
            size=len(stored.encoded), reencoded=stored.reencoded,
        ))  # fmt: skip
    return entries


def test_writing_a_shard_twice_or_after_a_failed_try_gives_the_same_files(tmp_path, monkeypatch):
    src = write_image_folder(tmp_path / "src", per_label=5, labels=("red",))
    entries = checked_entries(src / "red")
    temp = tmp_path / "temp"
    both = (naming.TFRECORD, naming.ARRAY_RECORD)
    config = ConvertConfig(str(src), str(tmp_path / "out"), formats=both)
    writer = write_shards.WriteShard(str(temp), config)
    writer.setup()
    plans = {"train": {"shards": 1}}
    element = (("train", 0), entries)
    infos = list(writer.process(element, plans))
    assert [info.file_format for info in infos] == list(both)
    shards = [temp / info.file for info in infos]
    first = [shard.read_bytes() for shard in shards]
    # The two formats hold the same records, in the same order.
    tfrecords = [r.numpy() for r in tf.data.TFRecordDataset(str(shards[0]))]
    assert len(tfrecords) == len(entries)
    assert list(array_records.records(str(shards[1]))) == tfrecords
    again = list(writer.process(element, plans))
    assert [shard.read_bytes() for shard in shards] == first and again == infos

    # A try that fails midway (a read error on the third record) leaves no file under either
    # name; the retry writes them whole.
    for shard in shards:
        shard.unlink()
    real_read = load.read_record
    reads = []

    def fails_once(entry, policy, label_offset, **how):
        reads.append(entry)
        if len(reads) == 3:
            raise OSError("connection reset")
        return real_read(entry, policy, label_offset, **how)

    monkeypatch.setattr(load, "read_record", fails_once)
    open_before = open_under(tmp_path)
    with pytest.raises(OSError, match="connection reset") as failed:
        list(writer.process(element, plans))
    assert not any(shard.exists() for shard in shards)
    # The sources it had opened ahead are closed, while its error is still held (by a
    # retrying runner, say).
    assert open_under(tmp_path) == open_before and failed.value
    retried = list(writer.process(element, plans))
    assert [shard.read_bytes() for shard in shards] == first and retried == infos
    writer.teardown()


def test_a_shard_whose_write_fails_closes_the_sources_it_read_ahead(tmp_path, monkeypatch):
    # A full disk fails a shard's write midway; a runner that keeps the error (to retry, to
    # report) must not keep the sources opened ahead of the records not written.
    src = write_image_folder(tmp_path / "src", per_label=6, labels=("red",))
    entries = checked_entries(src / "red")
    config = ConvertConfig(str(src), str(tmp_path / "out"))

    def disk_full(self, record):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(record_writer.RecordWriter, "write", disk_full)
    open_before = open_under(tmp_path)
    with pytest.raises(OSError, match="No space left") as failed:
        shard_writer.write_shard(entries, "train", 0, 1, str(tmp_path / "temp"), config, None)
    assert open_under(tmp_path) == open_before and failed.value


def cli_without(modules: str, *commands: list[str]) -> subprocess.CompletedProcess:
    """The CLI's `commands`, one after another while each succeeds, in a Python process where
    any import of `modules` (names separated by spaces) fails."""
    code = (
        f"import sys; sys.modules.update(dict.fromkeys({modules.split()!r}))  # imports fail\n"
        "from tfrecord_pipe._tools import cli\n"
        f"sys.exit(next((code for argv in {[list(map(str, c)) for c in commands]!r} "
        "if (code := cli.main(argv))), 0))\n"
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, timeout=300)  # fmt: skip


@pytest.mark.slow
def test_the_launcher_runs_without_tensorflow(tmp_path):
    src = write_image_folder(tmp_path / "src", per_label=3)
    done = cli_without("tensorflow", ["convert", src, tmp_path / "out", *IN_PROCESS])
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Converted into" in done.stdout
    assert (tmp_path / "out" / naming.MANIFEST_NAME).exists()


def test_a_local_conversion_and_its_verify_run_without_beam(tmp_path):
    # Beam's import cost most of a CPU-second in the launcher, and as much in the workers'
    # server (benchmarks/RESULTS.md, "Conversion without Beam's import"); the cloud clients'
    # errors, with gRPC, a twentieth.
    src, out = write_image_folder(tmp_path / "src", per_label=3), tmp_path / "out"
    done = cli_without("apache_beam google.api_core grpc", ["convert", src, out],
                       ["verify", src, out])  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Converted into" in done.stdout and "every record checked. OK" in done.stdout


def test_no_wait_with_the_local_runner_is_refused(tmp_path):
    src = write_image_folder(tmp_path / "src", per_label=1)
    done = run_cli("convert", src, tmp_path / "out", "--no_wait")
    assert done.returncode == 2
    assert "--no_wait is for a runner that runs the job elsewhere" in done.stderr


@pytest.mark.slow
def test_a_run_after_an_overwrite_killed_while_finalising_removes_what_it_left(
    tmp_path, monkeypatch
):
    # The killed run had deleted the old manifest and moved its shards in: only its temporary
    # folder knew the old dataset's files. The next run must not leave them beside its own.
    src = write_image_folder(tmp_path / "src", per_label=6)
    out = tmp_path / "out"
    launch(config_for(src, out, num_shards=6))
    killed_after_moving(monkeypatch, config_for(src, out, num_shards=3, overwrite=True))
    removed = finalise.clear_leftovers(str(out))  # what the next run does under the claim
    assert removed and not list(out.glob("*.tfrecord"))  # old 6 and the killed run's 3
    launch(config_for(src, out, num_shards=2, overwrite=True))
    assert len(list(out.glob("train-*.tfrecord"))) == 2
    assert run_cli("verify", src, out).returncode == 0


@pytest.mark.slow
def test_a_finalise_cut_short_in_its_clean_up_finishes_it_and_gives_up_the_claim(
    tmp_path, monkeypatch
):
    src = write_image_folder(tmp_path / "src", per_label=4)
    out = tmp_path / "out"
    held = claim.Claim(str(out))
    with held:
        held.hand_over()

    def lost_while_deleting(folder):
        raise OSError("worker lost in the clean-up")

    monkeypatch.setattr(storage, "delete_folder", lost_while_deleting)
    monkeypatch.setattr(claim, "give_up", lambda folder, run: None)  # as if lost before it
    config = config_for(src, out, num_shards=2)
    with pytest.raises(OSError, match="worker lost in the clean-up"):
        launch(config, run=held.run)
    monkeypatch.undo()
    assert (out / naming.MANIFEST_NAME).exists() and (out / claim.CLAIM_NAME).exists()
    written = tree(out)
    temp_dir = out / f"{finalise.TEMP_PREFIX}{held.run}"
    finalise.finalise(config, str(temp_dir), tfrecord_pipe.__version__, run=held.run)  # retry
    assert not temp_dir.exists() and not (out / claim.CLAIM_NAME).exists()
    dataset = {name: digest for name, digest in written.items() if not name.startswith(".")}
    assert tree(out) == dataset  # the dataset's bytes untouched, the rest gone


@pytest.mark.slow
def test_an_empty_input_with_overwrite_fails_and_keeps_the_old_dataset(tmp_path):
    src = write_image_folder(tmp_path / "src", per_label=2)
    out = tmp_path / "out"
    launch(config_for(src, out))
    before = tree(out)
    empty = tmp_path / "empty" / "red"
    empty.mkdir(parents=True)
    done = run_cli("convert", empty.parent, out, "--overwrite", *IN_PROCESS)
    assert done.returncode == 2 and "no input was found" in done.stderr
    assert {k: v for k, v in tree(out).items() if not k.startswith(".")} == before


def test_a_no_wait_launch_that_fails_leaves_no_claim_behind(tmp_path, monkeypatch):
    # The claim passes to the job before it is launched; a launch that fails takes it back,
    # and the wheel built for its workers goes too.
    src = write_image_folder(tmp_path / "src", per_label=1)
    out = tmp_path / "out"
    (tmp_path / "tmp").mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    monkeypatch.setattr("tempfile.tempdir", None)
    done = run_cli("convert", src, out, "--no_wait", "--runner", "DataflowRunner")
    assert done.returncode == 2 and "Missing required option: project" in done.stderr
    assert not (out / claim.CLAIM_NAME).exists()
    assert not list((tmp_path / "tmp").iterdir())
