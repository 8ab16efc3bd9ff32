"""finalise.py: the output folder is checked before the job and finished after it; an
overwrite replaces exactly the old dataset; what killed runs left is cleared and said."""

import logging
import re
import shutil
import signal
import subprocess
import time

import pytest

from beam_jobs import claim, convert, finalise
from tfrecord_pipe._core import manifest, naming
from tfrecord_pipe._reading import dataset

from helpers import (COMMAND, IN_PROCESS, jpeg_bytes, run_cli, run_command, set_up_then,
                     write_image_folder)

pytestmark = pytest.mark.slow  # whole conversions


def convert_(*argv):
    return convert.run([str(arg) for arg in argv] + IN_PROCESS)


def test_overwrite_deletes_exactly_the_old_datasets_files(tmp_path):
    # It used to delete anything named *.tfrecord* and anything under rejected/.
    src = write_image_folder(tmp_path / "src", per_label=3, odd=("truncated_jpeg.jpg",))
    out = tmp_path / "out"
    convert_(src, out, "--num_shards", 3, "--validation_fraction", 0.5)
    mine = [out / "my-notes.tfrecord.txt", out / "rejected" / "README", out / "keep.tfrecord"]
    for path in mine:
        path.write_text("not part of any dataset")
    (src / "red" / "truncated_jpeg.jpg").unlink()  # the new dataset rejects nothing
    result = convert_(src, out, "--num_shards", 1, "--overwrite")
    left = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert left == sorted([
        "keep.tfrecord", "my-notes.tfrecord.txt", "rejected/README",
        *(name for name, _ in manifest.files_of(result)),  # labels.txt, manifest.json, TFDS's
        *(file for info in result.splits.values() for file in info.files),
    ])  # fmt: skip
    assert len(result.splits["train"].files) == 1  # the old dataset's 3+3 shards are gone
    assert run_cli("verify", src, out).returncode == 0


@pytest.mark.parametrize("name", ["../notes.txt", "{outside}", "rejected/../../notes.txt",
                                  "validation-00000-of-00001.tfrecord"])
def test_a_manifest_naming_other_files_is_refused_and_overwrite_deletes_none(tmp_path, name):
    # --overwrite deleted any file an edited manifest listed, outside the output folder too,
    # and the readers would open it.
    src = write_image_folder(tmp_path / "src", per_label=2)
    out, notes = tmp_path / "out", tmp_path / "notes.txt"
    found = convert_(src, out)
    notes.write_text("mine")
    train = found.splits["train"]
    text = (out / naming.MANIFEST_NAME).read_text()
    (out / naming.MANIFEST_NAME).write_text(text.replace(train.files[0], name.format(outside=notes)))
    with pytest.raises(ValueError, match="is not a shard file name of that split .* remove that"):
        convert_(src, out, "--overwrite")
    with pytest.raises(ValueError, match="is not a shard file name of that split"):
        dataset.read_manifest(str(out))
    assert notes.read_text() == "mine" and (out / train.files[0]).exists()


def test_a_killed_runs_temporary_folder_is_removed_by_the_next_run_which_says_so(
    tmp_path, caplog
):
    src = write_image_folder(tmp_path / "src", per_label=2)
    out = tmp_path / "out"
    leftover = out / f"{finalise.TEMP_PREFIX}deadbeef0000"
    (leftover / "rejected").mkdir(parents=True)
    (leftover / "train-00000-of-00001.tfrecord").write_bytes(b"half a shard")
    with caplog.at_level(logging.WARNING, logger="beam_jobs.convert"):
        convert_(src, out)
    assert not leftover.exists()
    assert "Removed 1 temporary folder(s) left by runs that did not finish" in caplog.text
    assert str(leftover) in caplog.text


def test_a_run_that_writes_no_record_fails_and_leaves_no_manifest(tmp_path):
    (tmp_path / "src" / "red").mkdir(parents=True)
    (tmp_path / "src" / "red" / "a.jpg").write_bytes(b"not an image")
    done = run_cli("convert", tmp_path / "src", tmp_path / "out", *IN_PROCESS)
    assert done.returncode == 2
    assert "No record was written: all 1 inputs were rejected (not_an_image 1)" in done.errors[0]
    # The first rejection is said: the rest were only in a hidden temporary folder.
    assert f"; the first: {tmp_path / 'src' / 'red' / 'a.jpg'} (not_an_image: " in done.errors[0]
    assert "sub-folder per label" not in done.errors[0]
    assert not (tmp_path / "out" / naming.MANIFEST_NAME).exists()
    # A folder of images without label sub-folders: every input has no label; say how.
    flat = write_image_folder(tmp_path / "flat", per_label=1)
    for path in list(flat.rglob("*.jpg")):
        path.rename(flat / f"{path.parent.name}-{path.name}")
    done = run_cli("convert", flat, tmp_path / "flat-out", *IN_PROCESS)
    assert done.returncode == 2
    assert "(no_label 3)" in done.errors[0] and "one sub-folder per label" in done.errors[0]
    # A CSV list of paths that are not where its folder says (Kaggle's ids without ".jpg").
    (tmp_path / "ids.csv").write_text("path,label\n000bec18,cat\n001513df,dog\n")
    done = run_cli("convert", tmp_path / "ids.csv", tmp_path / "ids-out", *IN_PROCESS)
    assert done.returncode == 2
    assert f"the first: {tmp_path / '000bec18'} (unreadable: " in done.errors[0]
    assert done.errors[0].endswith(f"The paths of a CSV list are taken from its own folder "
                                   f"({tmp_path}), or are absolute.")  # fmt: skip
    # A list written on Windows (a helper's trial): no hint said why every file was missing.
    (tmp_path / "windows.csv").write_text("src\\red\\a.jpg,red\n")
    done = run_cli("convert", tmp_path / "windows.csv", tmp_path / "win-out", *IN_PROCESS)
    assert done.returncode == 2 and done.errors[0].endswith(
        "or are absolute. A \\ is part of a file's name here: write folders with / between "
        "them.")  # fmt: skip
    # ImageNet's LOC_synset_mapping.txt ("n01440764 tench, Tinca tinca") as the labels file.
    (tmp_path / "synsets.txt").write_text("n01440764 tench, Tinca tinca\nred\n")
    (tmp_path / "syn" / "n01440764").mkdir(parents=True)
    (tmp_path / "syn" / "n01440764" / "a.jpg").write_bytes(jpeg_bytes(8, 8))
    done = run_cli("convert", tmp_path / "syn", tmp_path / "syn-out", "--labels_file",
                   tmp_path / "synsets.txt", *IN_PROCESS)  # fmt: skip
    assert done.errors[0].endswith(f"Each line of {tmp_path / 'synsets.txt'} is one whole label, "
                                   "as the inputs give it; its first line is 'n01440764 tench, "
                                   "Tinca tinca'.")  # fmt: skip


def test_nothing_written_leaves_an_old_dataset_as_it_was(tmp_path):
    src = write_image_folder(tmp_path / "src", per_label=2)
    out = tmp_path / "out"
    before = convert_(src, out)
    for path in (src / "red").iterdir():
        path.write_bytes(b"broken")
    for label in ("green", "blue"):
        for path in (src / label).iterdir():
            path.unlink()
    with pytest.raises(finalise.NothingWrittenError):
        convert_(src, out, "--overwrite")
    assert dataset.read_manifest(str(out)) == before


@pytest.mark.parametrize(
    "make, message",
    [(lambda out: out.write_text("a file"), "is a file, not a folder"),
     (lambda out: (out.mkdir(), (out / "manifest.json").write_text("{not json")),
      "manifest.json is not a valid tfrecord-pipe manifest")],
)  # fmt: skip
def test_an_output_that_is_a_file_or_an_unreadable_dataset_is_refused_before_any_work(
    tmp_path, make, message
):
    src = write_image_folder(tmp_path / "src", per_label=1)
    make(tmp_path / "out")
    done = run_cli("convert", src, tmp_path / "out", "--overwrite", *IN_PROCESS)
    assert done.returncode == 2 and message in done.errors[0]
    assert "converting:" not in done.stderr  # refused before loading anything


def test_a_mistyped_flag_is_an_error_naming_the_closest(tmp_path):
    # Beam only logged a warning, and the dataset was written without a validation split.
    src = write_image_folder(tmp_path / "src", per_label=1)
    done = run_cli("convert", src, tmp_path / "out", "--validaton_fraction", "0.2")
    assert done.returncode == 2
    assert "Unknown flag --validaton_fraction" in done.errors[0]
    assert "Did you mean --validation_fraction?" in done.errors[0]
    assert not (tmp_path / "out").exists()
    passed = run_cli("convert", src, tmp_path / "out", "--direct_num_workers=1",
                     "--direct_running_mode", "in_memory")  # fmt: skip
    assert passed.returncode == 0, passed.stderr


def test_an_image_of_a_strange_shape_is_drawn_in_the_grid(tmp_path):
    (tmp_path / "src" / "red").mkdir(parents=True)
    (tmp_path / "src" / "red" / "panorama.jpg").write_bytes(jpeg_bytes(20000, 10))
    convert_(tmp_path / "src", tmp_path / "out")
    done = run_cli("inspect", tmp_path / "out", "--grid", tmp_path / "grid.png")
    assert done.returncode == 0, done.stderr
    assert "contact sheet of 1 record:" in done.stdout
    assert "train: 1 record in 1 shard," in done.stdout  # not "1 records in 1 shards"
    line = finalise.summary_line(finalise.read_manifest(str(tmp_path / "out")), "out", 0.1)
    assert "train: 1 in 1 shard; 0 rejected" in line


def test_a_finalise_that_fails_midway_says_so_and_the_same_command_again_finishes(tmp_path):
    src = write_image_folder(tmp_path / "src", per_label=6)
    out = tmp_path / "out"
    blocked = out / "validation-00001-of-00002.tfrecord"  # a folder: its shard cannot move in
    blocked.mkdir(parents=True)
    command = ["convert", src, out, "--num_shards", 2, "--validation_fraction", 0.4, *IN_PROCESS]
    failed = run_command(*command)
    assert failed.returncode == 1, failed.stderr[-3000:]
    assert (out / "train-00000-of-00002.tfrecord").exists()  # moved in before the failure
    assert "while finalising" in failed.stderr and "Run the same command again" in failed.stderr
    # One line says it; Beam's traceback of the failed step is not printed before it.
    assert "Traceback" not in failed.stderr and "ERROR" not in failed.stderr, failed.stderr

    blocked.rmdir()
    again = run_command(*command)  # no --overwrite: what the failed run moved in is no dataset
    assert again.returncode == 0, again.stderr[-3000:]
    assert "Removed 1 temporary folder(s) left by runs that did not finish" in again.stderr
    assert not list(out.glob(f"{finalise.TEMP_PREFIX}*"))
    assert run_cli("verify", src, out).returncode == 0


def test_a_user_s_file_by_a_dataset_s_name_is_kept_and_a_stopped_finalise_s_replaced(
    tmp_path, monkeypatch
):
    # A labels.txt of the user's in the output folder was written over without a word.
    src = write_image_folder(tmp_path / "src", per_label=2)
    out = tmp_path / "out"
    out.mkdir()
    (out / "labels.txt").write_text("my notes\n")
    (out / "notes.md").write_text("mine")  # named like nothing of a dataset's: written beside
    for overwrite in ([], ["--overwrite"]):
        with pytest.raises(FileExistsError, match=r"holds labels.txt but no dataset \(no "
                           r"manifest.json\): .* --overwrite too. Move it, or write"):  # fmt: skip
            convert.run([str(src), str(out), *overwrite, *IN_PROCESS])
    assert sorted(p.name for p in out.iterdir()) == ["labels.txt", "notes.md"]
    assert (out / "labels.txt").read_text() == "my notes\n"
    (out / "labels.txt").unlink()
    # A file named like a shard, and no manifest: "already holds a dataset", said the first
    # run, and --overwrite then left it among the new shards, for `train-*` to read.
    (out / "train-00000-of-00002.tfrecord").write_bytes(b"x")
    for overwrite in ([], ["--overwrite"]):
        with pytest.raises(FileExistsError, match=r"holds train-00000-of-00002.tfrecord, named "
                           r"like a dataset's files, but no manifest.json"):  # fmt: skip
            convert.run([str(src), str(out), *overwrite, *IN_PROCESS])
        # A run's leftover that explains nothing of it excuses nothing (a reviewer: any
        # `.tmp-*` let it through, and `train-*` then read a record twice).
        (out / f"{finalise.TEMP_PREFIX}0123456789ab").mkdir(exist_ok=True)
    (out / "train-00000-of-00002.tfrecord").unlink()
    (out / f"{finalise.TEMP_PREFIX}0123456789ab").rmdir()
    # The labels file of the conversion itself, kept in the output: written again as read.
    (out / "labels.txt").write_text("red\ngreen\nblue\n")
    convert.run([str(src), str(out), "--labels_file", str(out / "labels.txt"), *IN_PROCESS])
    assert (out / "labels.txt").read_text() == "red\ngreen\nblue\n"
    assert dataset.read_manifest(str(out)).labels == ("red", "green", "blue")
    shutil.rmtree(out)
    out.mkdir()
    (out / "notes.md").write_text("mine")

    # A finalise stopped after labels.txt and TensorFlow Datasets' files, before the
    # manifest: those are its own, and the same command again replaces them.
    write_bytes = finalise.storage.write_bytes

    def stopped_at_the_manifest(path, *args, **kwargs):
        if path.endswith(naming.MANIFEST_NAME):
            raise OSError("stopped")
        return write_bytes(path, *args, **kwargs)

    monkeypatch.setattr(finalise.storage, "write_bytes", stopped_at_the_manifest)
    with pytest.raises(convert.JobFailedError, match="stopped"):
        convert.run([str(src), str(out), *IN_PROCESS])
    assert (out / "labels.txt").exists() and not (out / naming.MANIFEST_NAME).exists()
    monkeypatch.undo()
    convert.run([str(src), str(out), *IN_PROCESS])
    assert run_cli("verify", src, out).returncode == 0
    assert (out / "notes.md").read_text() == "mine"


def test_a_run_stopped_as_it_cleaned_up_left_a_whole_dataset_and_the_rerun_says_so(
    tmp_path, monkeypatch
):
    # Killed after its manifest, the same command again was told only that OUT "already
    # holds a dataset" (a reviewer): that one is whole, and verify proves it.
    src = write_image_folder(tmp_path / "src", per_label=2)
    out = tmp_path / "out"
    clean_up = finalise._clean_up

    def stopped(*_):
        raise OSError("stopped")

    monkeypatch.setattr(finalise, "_clean_up", stopped)
    with pytest.raises(convert.JobFailedError, match="stopped"):
        convert.run([str(src), str(out), *IN_PROCESS])
    monkeypatch.setattr(finalise, "_clean_up", clean_up)
    with pytest.raises(FileExistsError, match=r"already holds a dataset, written whole by a "
                       r"run that was stopped as it cleaned up .* verify SRC OUT"):  # fmt: skip
        convert.run([str(src), str(out), *IN_PROCESS])
    assert run_cli("verify", src, out).returncode == 0
    convert.run([str(src), str(out), "--overwrite", *IN_PROCESS])
    assert not list(out.glob(f"{finalise.TEMP_PREFIX}*"))


@pytest.mark.parametrize("signum, code, said", [
    (signal.SIGINT, 130, "interrupted"),
    (signal.SIGTERM, 143, "terminated (SIGTERM)"),  # a scheduler's stop: it ended saying nothing
])  # fmt: skip
def test_ctrl_c_or_sigterm_says_so_and_the_same_command_again_converts(
    tmp_path, signum, code, said
):
    src = write_image_folder(tmp_path / "src", per_label=2000)  # seconds of work, not less
    out = tmp_path / "out"
    command = [COMMAND, "convert", str(src), str(out), *IN_PROCESS]
    for _ in range(3):  # a test process descheduled for the whole job saw nothing to stop
        # Ctrl-C at its default, as in a terminal's foreground job: a suite started in the
        # background (`make test &`) would hand on SIGINT ignored, which the job keeps.
        running = subprocess.Popen(
            set_up_then("signal.signal(signal.SIGINT, signal.SIG_DFL)", command),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while not (out / claim.CLAIM_NAME).exists() and running.poll() is None:
            assert time.monotonic() < deadline, "the conversion never claimed its output"
            time.sleep(0.005)
        if running.poll() is None:
            break
        running.communicate()
        shutil.rmtree(out)
    running.send_signal(signum)  # as Ctrl-C or a scheduler does, once the job holds the output
    _, stderr = running.communicate(timeout=120)
    assert running.returncode == code, stderr[-3000:]
    assert f"error: {said} before the conversion finished" in stderr
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr
    assert not (out / naming.MANIFEST_NAME).exists()
    again = run_command(*command[1:])
    assert again.returncode == 0, again.stderr[-3000:]
    assert run_cli("verify", src, out).returncode == 0


def test_a_conversion_that_ignores_sigint_keeps_ignoring_it_and_main_runs_in_a_thread(tmp_path):
    # Started in the background by a script (SIGINT ignored), a conversion must not be stopped
    # by a Ctrl-C meant for the foreground; and main() in a thread must not fail on signals.
    src = write_image_folder(tmp_path / "src", per_label=30)
    out = tmp_path / "out"
    ignoring = subprocess.Popen(
        set_up_then("signal.signal(signal.SIGINT, signal.SIG_IGN)",
                    [COMMAND, "convert", src, out, *IN_PROCESS]),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while not (out / claim.CLAIM_NAME).exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    # Sent while it converts, not to a process that has ended (which would prove nothing).
    assert (out / claim.CLAIM_NAME).exists() and ignoring.poll() is None
    ignoring.send_signal(signal.SIGINT)
    _, stderr = ignoring.communicate(timeout=120)
    assert ignoring.returncode == 0 and (out / naming.MANIFEST_NAME).exists(), stderr[-2000:]

    import threading

    answers = []
    thread = threading.Thread(target=lambda: answers.append(convert.main([str(src), str(out)])))
    thread.start()
    thread.join(60)
    assert answers == [2]  # the dataset is there: refused with its line, no signal error


def test_a_temporary_folder_that_cannot_be_read_counts_as_files_not_a_crash(tmp_path):
    src = write_image_folder(tmp_path / "src", per_label=3)
    out = tmp_path / "out"
    convert_(src, out, "--num_shards", 1)
    (out / naming.MANIFEST_NAME).unlink()  # as if a finalise died before its manifest
    leftover = out / f"{finalise.TEMP_PREFIX}abc"
    leftover.mkdir()
    (leftover / finalise.PLAN_NAME).write_text("{damaged")
    with pytest.raises(FileExistsError, match=f"^OUTPUT {re.escape(str(out))} already holds "):
        convert_(src, out, "--num_shards", 1)
    result = convert_(src, out, "--num_shards", 1, "--overwrite")
    assert result.splits["train"].num_examples == 9 and not leftover.exists()



def test_ctrl_c_while_replacing_a_dataset_does_not_say_the_old_one_was_kept(monkeypatch, capsys):
    # With --overwrite, a run stopped while it finalises has removed the old manifest: a
    # user reading "what this run left is removed" would think the old dataset still there.
    def interrupted(argv, prog):
        raise KeyboardInterrupt

    monkeypatch.setattr(convert, "run", interrupted)
    assert convert.main(["src", "out"]) == 130
    assert "may be gone already" not in capsys.readouterr().err
    assert convert.main(["src", "out", "--overwrite=false"]) == 130  # a Flex Template's way
    assert "may be gone already" not in capsys.readouterr().err
    assert convert.main(["src", "out", "--overwrite=TRUE"]) == 130
    assert "may be gone already" in capsys.readouterr().err
    assert convert.main(["src", "out", "--overwrite"]) == 130
    said = capsys.readouterr().err
    assert "interrupted before the conversion finished" in said
    assert "The dataset it was replacing may be gone already" in said
