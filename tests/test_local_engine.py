"""The local engine (`beam_jobs/local_engine.py`): the conversion's default on one machine.

It must write the Beam pipeline's dataset byte for byte, hold a bounded number of entries
whatever the input count (sorted runs on disk, merged), and never outlive, hang on, or hide
the failure of its worker processes.
"""

import errno
import io
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from beam_jobs import convert, load, local_engine, pieces, record_reader, shard_plan
from beam_jobs import shard_writer, spill
from beam_jobs import storage, worker_pool, worker_progress
from tfrecord_pipe._core import images, manifest, schema

from helpers import COLOURS, COMMAND, ODD_IMAGES, RGB, jpeg_bytes, run_cli, write_image_folder
from test_engines import files_of

BEAM = ["--runner", "DirectRunner"]  # the Beam pipeline, on Beam's local runner


def test_a_spill_gives_back_every_item_in_order_through_runs_merged_again(tmp_path, monkeypatch):
    monkeypatch.setattr(spill, "FAN_IN", 3)  # 50 runs: merged three at a time, then again
    items = [(random.randrange(40), n) for n in range(997)]
    random.Random(7).shuffle(items)
    sorts = spill.SortedSpill(str(tmp_path), key=lambda item: item[0], run_items=20)
    for item in items:
        sorts.add(item)
    assert len(sorts) == 997 and len(list(tmp_path.iterdir())) == 49  # the last 17 held
    out = list(sorts.sorted())
    assert out == sorted(items, key=lambda item: item[0])  # equal keys in the order added
    assert list(tmp_path.iterdir()) == []  # runs are deleted once read


def test_a_spill_past_its_fan_in_rewrites_only_the_runs_it_must(tmp_path, monkeypatch):
    monkeypatch.setattr(spill, "FAN_IN", 4)
    written = []
    write = spill.write_file
    monkeypatch.setattr(spill, "write_file", lambda folder, items, suffix: write(
        folder, (written.append(item) or item for item in items), suffix))  # fmt: skip
    items = [(random.randrange(5), n) for n in range(60)]
    sorts = spill.SortedSpill(str(tmp_path), key=lambda item: item[0], run_items=10)
    for item in items:
        sorts.add(item)
    assert len(written) == 60  # six runs
    assert list(sorts.sorted()) == sorted(items, key=lambda item: item[0])
    assert len(written) == 60 + 30  # the first three merged into one: four runs left


def test_a_sequence_gives_back_every_item_in_the_order_added_as_often_as_asked(tmp_path):
    items = [(random.randrange(40), n) for n in range(97)]
    sequence = spill.Sequence(str(tmp_path), run_items=10)
    for item in items:
        sequence.add(item)
    assert len(list(tmp_path.iterdir())) == 9  # the last 7 held
    assert list(sequence) == items and list(sequence) == items
    # Files written elsewhere (a worker's), taken as the next items.
    adopted = spill.Sequence(str(tmp_path))
    for start in (0, 40):
        with open(tmp_path / f"written-{start}", "wb") as f:
            spill.write_items(f, items[start : start + 40])
        adopted.adopt(str(tmp_path / f"written-{start}"))
    assert list(adopted) == items[:80] and list(adopted) == items[:80]


def test_a_spill_handed_over_to_another_gives_back_every_item_there(tmp_path):
    items = [(random.randrange(40), n) for n in range(23)]
    given = spill.SortedSpill(str(tmp_path), key=lambda item: item[0], run_items=5)
    for item in items:
        given.add(item)
    runs = given.handed_over()
    assert len(runs) == 5 and list(given.sorted()) == []  # the 3 held written as a run
    taken = spill.SortedSpill(str(tmp_path), key=lambda item: item[0], run_items=5)
    taken.add((20, "held"))
    taken.adopt(runs)
    assert list(taken.sorted()) == sorted(items + [(20, "held")], key=lambda item: item[0])
    assert list(tmp_path.iterdir()) == []


def hostile_folder(root):
    """Label folders with every odd file of tests/data (CMYK, EXIF-rotated, truncated, PNG,
    GIF, ...), a non-image, a broken link, an empty file and the same bytes three times
    (across labels)."""
    odd = [path.name for path in ODD_IMAGES.iterdir() if not path.name.startswith(("LICENSE", "README"))]
    src = write_image_folder(root, per_label=9, odd=odd)
    (src / "red" / "notes.txt").write_text("not an image")
    (src / "red" / "empty.jpg").write_bytes(b"")
    (src / "green" / "broken.jpg").symlink_to(root / "nowhere.jpg")
    same = (src / "blue" / "000.jpg").read_bytes()
    (src / "red" / "copy-of-blue.jpg").write_bytes(same)
    (src / "green" / "zz-copy-of-blue.jpg").write_bytes(same)
    return src


@pytest.mark.slow
@pytest.mark.parametrize("options", [
    # Each input read twice: shards in two formats, GZIP shards.
    ["--validation_fraction", "0.3", "--formats", "tfrecord,array_record"],
    ["--dedupe", "--compress", "--num_shards", "3"],
    # Each input read once (pieces.py): shards cut where inputs were rejected; duplicates
    # dropped, and three shards put together from the pieces of both workers.
    ["--validation_fraction", "0.3"],
    ["--dedupe", "--num_shards", "3"],
])  # fmt: skip
def test_the_local_engine_writes_the_beam_pipelines_dataset_byte_for_byte(
    tmp_path, monkeypatch, options
):
    src = hostile_folder(tmp_path / "src")
    # Tiny sorts: every entry goes through runs on disk, merged in levels, in every sort.
    monkeypatch.setattr(spill, "RUN_ITEMS", 4)
    monkeypatch.setattr(spill, "FAN_IN", 3)
    convert.run([str(src), str(tmp_path / "engine"), *options])
    convert.run([str(src), str(tmp_path / "beam"), *options, *BEAM])
    engine = files_of(tmp_path / "engine")
    assert engine == files_of(tmp_path / "beam")
    assert "duplicates.jsonl" in engine and "rejected/rejected-train.jsonl" in engine
    assert not [name for name in os.listdir(tmp_path / "engine") if name.startswith(".")]


@pytest.mark.slow
@pytest.mark.parametrize("dedupe", [[], ["--dedupe"]])
def test_many_inputs_with_the_same_bytes_give_the_beam_pipelines_dataset(
    tmp_path, monkeypatch, dedupe
):
    # Groups of copies across labels and splits, among distinct inputs, through tiny sorts:
    # a read-once job finds them from their hashes alone, then picks their entries up.
    src = write_image_folder(tmp_path / "src", per_label=12)
    for label, n in [("red", 7), ("green", 3), ("blue", 5)]:
        same = (src / label / "004.jpg").read_bytes()
        for i in range(n):
            (src / ("green", "blue", "red")[i % 3] / f"copy-{label}-{i}.jpg").write_bytes(same)
    monkeypatch.setattr(spill, "RUN_ITEMS", 3)
    options = ["--validation_fraction", "0.4", "--num_shards", "2", *dedupe]
    convert.run([str(src), str(tmp_path / "engine"), *options])
    convert.run([str(src), str(tmp_path / "beam"), *options, *BEAM])
    engine = files_of(tmp_path / "engine")
    assert engine == files_of(tmp_path / "beam")
    assert engine["duplicates.jsonl"].count(b"sha256") == 3


@pytest.mark.slow
def test_shards_planned_from_sizes_misjudged_are_cut_again_to_the_beam_pipelines(
    tmp_path, monkeypatch
):
    # A read-once job plans its shards before reading its inputs, from a sample of their
    # sizes (pieces.py); here every size is misjudged, so that 64 shards were planned where
    # the records' sizes make 120: each shard is copied together from the pieces.
    src = write_image_folder(tmp_path / "src", per_label=40)
    monkeypatch.setattr(local_engine, "_record_size", lambda source: 1)
    options = ["--shard_mb", "0.001"]
    found = convert.run([str(src), str(tmp_path / "engine"), *options])
    assert len(found.splits["train"].shard_lengths) == 120
    convert.run([str(src), str(tmp_path / "beam"), *options, *BEAM])
    assert files_of(tmp_path / "engine") == files_of(tmp_path / "beam")


def test_labels_no_record_holds_or_none_of_train_are_said_by_both_engines(
    tmp_path, capsys, caplog
):
    # A macOS zip's __MACOSX folder (its AppleDouble files rejected) was a class of its own,
    # shifting every label after it, and nothing said so; nor of a label that train lacks.
    # Said from the manifest's counts, so where the launcher prints the summary (Dataflow's
    # too) and by `inspect`.
    for split, labels in (("train", RGB[:2]), ("validation", RGB)):
        for label in labels:
            (tmp_path / "src" / split / label).mkdir(parents=True)
            (tmp_path / "src" / split / label / "0.jpg").write_bytes(jpeg_bytes(9, 9, COLOURS[label]))
    (tmp_path / "src" / "train" / "__MACOSX").mkdir()
    (tmp_path / "src" / "train" / "__MACOSX" / "._0.jpg").write_bytes(b"\x00\x05\x16\x07" * 20)
    said = []
    for engine in ([], BEAM):
        capsys.readouterr()
        found = convert.run([str(tmp_path / "src"), str(tmp_path / f"out{len(said)}"), *engine])
        assert found.labels == ("__MACOSX", "blue", "green", "red")
        assert found.splits["train"].label_counts == (0, 0, 1, 1)
        assert found.splits["validation"].label_counts == (0, 1, 1, 1)
        printed = capsys.readouterr().out.splitlines()
        said.append([line for line in printed if "labels with" in line])
    # Printed by the launcher that waited, not logged by the job as well.
    assert not [r for r in caplog.records if "labels with" in r.getMessage()]
    assert said[0] == said[1] == [
        ("WARNING: labels with no record (every input of theirs was rejected): '__MACOSX'. Each "
         "is still a class and takes an index, shifting the labels after it: remove those "
         "folders or lines and convert again, or give --labels_file."),
        ("WARNING: labels with no record in split train, only in others: 'blue'. A model "
         "trained on it never sees them."),
    ]
    inspected = run_cli("inspect", tmp_path / "out0")
    assert said[0][0].removeprefix("WARNING: ") in inspected.stdout, inspected.stdout
    (tmp_path / "labels.txt").write_text("__MACOSX\nblue\ngreen\nred\n")  # as asked: no word
    capsys.readouterr()
    convert.run([str(tmp_path / "src"), str(tmp_path / "asked"), "--labels_file",
                 str(tmp_path / "labels.txt")])  # fmt: skip
    assert "labels with" not in capsys.readouterr().out


def test_labels_an_evaluation_split_lacks_are_said(tmp_path, capsys):
    # Evaluation reads validation: a class with no record there has no accuracy measured,
    # and nothing said so. A labels file names the classes, and does not change that.
    for split, labels in (("train", RGB), ("validation", RGB[:2])):
        for label in labels:
            (tmp_path / "src" / split / label).mkdir(parents=True)
            image = jpeg_bytes(9, 9, COLOURS[label])
            (tmp_path / "src" / split / label / "0.jpg").write_bytes(image)
    (tmp_path / "labels.txt").write_text("".join(f"{label}\n" for label in RGB))
    for out, options in (("out", []), ("named", ["--labels_file", str(tmp_path / "labels.txt")])):
        convert.run([str(tmp_path / "src"), str(tmp_path / out), *options])
        said = [line for line in capsys.readouterr().out.splitlines() if "labels with" in line]
        assert said == [f"WARNING: labels with no record in split validation: {RGB[2]!r}. "
                        "Evaluation, which reads it, never measures them: give it images of "
                        "them (a larger --validation_fraction, or files in their validation "
                        "folders or lines)."]  # fmt: skip
    # Imagenette's and ImageNet's split folder is `val`: it said nothing there (a new user's
    # trial).
    (tmp_path / "src" / "validation").rename(tmp_path / "src" / "val")
    convert.run([str(tmp_path / "src"), str(tmp_path / "val")])
    said = [line for line in capsys.readouterr().out.splitlines() if "labels with" in line]
    assert said == [f"WARNING: labels with no record in split val: {RGB[2]!r}. An evaluation "
                    "of it never measures them: give it images of them (files in their val "
                    "folders or lines)."]  # fmt: skip


@pytest.mark.slow
def test_a_csv_list_gives_the_beam_pipelines_dataset_byte_for_byte(tmp_path, monkeypatch):
    src = hostile_folder(tmp_path / "src")
    labels = tmp_path / "labels.txt"
    labels.write_text("blue\ngreen\nred\n")
    lines = ["path,label,split"]
    for n, path in enumerate(sorted(src.rglob("*"))):
        if not path.is_dir():
            split = "validation" if n % 4 == 0 else "train"
            lines.append(f"{path.relative_to(tmp_path)},{path.parent.name},{split}")
    lines += [
        "src/red/000.jpg,green,train",  # the same file again, under another label
        "./src/red/../red/001.jpg,red,validation",  # and another spelling
        "src/red/missing.jpg,red,train",
        ",red,train",
        "purple.jpg,purple,train",  # not in the labels file
    ]
    (tmp_path / "purple.jpg").write_bytes(jpeg_bytes(9, 9, (120, 0, 120)))
    csv = tmp_path / "list.csv"
    csv.write_text("\n".join(lines) + "\n")
    monkeypatch.setattr(spill, "RUN_ITEMS", 5)
    options = ["--labels_file", str(labels)]
    convert.run([str(csv), str(tmp_path / "engine"), *options])
    convert.run([str(csv), str(tmp_path / "beam"), *options, *BEAM])
    engine = files_of(tmp_path / "engine")
    assert engine == files_of(tmp_path / "beam")
    rejected = b"".join(data for name, data in engine.items() if name.startswith("rejected/"))
    for reason in ("duplicate", "unknown_label", "unreadable", "truncated"):
        assert f'"reason": "{reason}"'.encode() in rejected


def children_of(pid: int) -> list[int]:
    found = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [int(child) for child in found.split()]


def descendants_of(pid: int) -> list[int]:
    children = children_of(pid)
    return children + [grandchild for child in children for grandchild in descendants_of(child)]


def workers_of(pid: int) -> list[int]:
    """The job's workers: the children of its fork server."""
    servers = [child for child in children_of(pid)
               if b"forkserver" in Path(f"/proc/{child}/cmdline").read_bytes()]  # fmt: skip
    return [worker for server in servers for worker in children_of(server)]


def started_conversion(tmp_path, images: int = 4000):
    """A conversion running in its own process, once its workers are up; what it prints goes
    to tmp_path/stdout and tmp_path/stderr (a pipe would be held open by any worker left)."""
    src = tmp_path / "src"
    (src / "a").mkdir(parents=True)
    (src / "b").mkdir()
    for n in range(images):
        (src / "ab"[n % 2] / f"{n:05d}.jpg").write_bytes(jpeg_bytes(64 + n % 7, 48))
    with open(tmp_path / "stdout", "w") as stdout, open(tmp_path / "stderr", "w") as stderr:
        running = subprocess.Popen([COMMAND, "convert", str(src), str(tmp_path / "out")],
                                   stdout=stdout, stderr=stderr, text=True)  # fmt: skip
    deadline = time.monotonic() + 60
    while len(workers_of(running.pid)) < worker_pool.processes() and time.monotonic() < deadline:
        time.sleep(0.01)
    workers = workers_of(running.pid)
    assert len(workers) == worker_pool.processes(), (tmp_path / "stderr").read_text()
    return running, workers


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    with open(f"/proc/{pid}/stat") as f:  # ended, but not yet reaped by anyone
        return f.read().split(")")[-1].split()[0] == "Z"


@pytest.mark.slow
@pytest.mark.parametrize("flags", [[], ["-E"]])  # -E: the environment cannot steer the server
def test_a_script_that_converts_without_a_main_guard_converts_once(tmp_path, flags):
    # Workers from a fork server ran the launcher's script again, each starting a conversion
    # of its own, as Python's spawned workers do; a script needs no guard for ours. And the
    # server imported modules from the folder the user stood in before the installed ones.
    src = write_image_folder(tmp_path / "src", per_label=2)
    script = tmp_path / "scripts" / "convert_it.py"
    script.parent.mkdir()
    script.write_text(
        "from beam_jobs import convert\n"
        "print('SCRIPT RUNS')\n"
        f"convert.run([{str(src)!r}, {str(tmp_path / 'out')!r}])\n"
    )
    (tmp_path / "numpy.py").write_text("raise SystemExit('numpy.py of the working folder')\n")
    done = subprocess.run([sys.executable, *flags, str(script)], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("SCRIPT RUNS") == 1 and "6 in" in done.stdout, done.stdout


@pytest.mark.slow
def test_the_command_converts_from_a_working_folder_that_was_removed(tmp_path):
    src = write_image_folder(tmp_path / "src", per_label=2)
    gone = tmp_path / "gone"
    gone.mkdir()
    done = subprocess.run(
        f"cd {gone} && rmdir {gone} && {COMMAND} convert {src} {tmp_path / 'out'}",
        shell=True, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0 and "6 in" in done.stdout, done.stderr[-3000:]


@pytest.mark.slow
def test_workers_end_with_a_killed_launcher(tmp_path):
    running, workers = started_conversion(tmp_path)
    started = descendants_of(running.pid)  # the workers, their fork server, its tracker
    assert set(workers) < set(started)
    running.kill()  # SIGKILL: the OOM killer, a scheduler; no clean-up runs
    running.wait()
    deadline = time.monotonic() + 10
    while not all(gone(pid) for pid in started) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = [pid for pid in started if not gone(pid)]
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left


@pytest.mark.slow
def test_a_killed_worker_fails_the_job_saying_so_and_the_next_run_converts(tmp_path):
    running, workers = started_conversion(tmp_path)
    os.kill(workers[0], signal.SIGKILL)
    running.wait(timeout=60)
    stderr = (tmp_path / "stderr").read_text()
    assert running.returncode == 1, stderr
    assert "The conversion job failed" in stderr and "Nothing was finalised" in stderr, stderr
    assert "terminated abruptly" in stderr
    assert not (tmp_path / "out" / "manifest.json").exists()
    again = subprocess.run([COMMAND, "convert", str(tmp_path / "src"), str(tmp_path / "out")],
                           capture_output=True, text=True)  # fmt: skip
    assert again.returncode == 0 and "4000 in" in again.stdout, again.stderr


def test_an_input_removed_after_its_check_fails_the_job_saying_which_and_nothing_is_finalised(
    tmp_path, monkeypatch, workers_forked
):
    # GZIP shards are written from the inputs read again (a local job of plain TFRecord
    # shards reads each input once: the next tests).
    src = write_image_folder(tmp_path / "src", per_label=4)
    victim = src / "green" / "002.jpg"
    checked = load.Checker._checked

    def checked_then_removed(self, source, data, stored):
        entry = checked(self, source, data, stored)
        if source.path == str(victim):
            victim.unlink()  # as a user tidying the folder while the job runs
        return entry

    monkeypatch.setattr(load.Checker, "_checked", checked_then_removed)
    with pytest.raises(convert.JobFailedError, match=f"{victim} changed while the job ran.*"
                       "Nothing was finalised"):  # fmt: skip
        convert.run([str(src), str(tmp_path / "out"), "--compress"])
    assert not (tmp_path / "out" / "manifest.json").exists()
    monkeypatch.undo()
    again = convert.run([str(src), str(tmp_path / "out"), "--compress"])
    assert sum(split.num_examples for split in again.splits.values()) == 11


def test_an_input_read_once_is_stored_as_checked_whatever_becomes_of_it(
    tmp_path, monkeypatch, workers_forked
):
    src = write_image_folder(tmp_path / "src", per_label=4)
    victim = src / "green" / "002.jpg"
    image = victim.read_bytes()
    checked = load.Checker._checked

    def checked_then_removed(self, source, data, stored):
        entry = checked(self, source, data, stored)
        if source.path == str(victim):
            victim.unlink()
        return entry

    monkeypatch.setattr(load.Checker, "_checked", checked_then_removed)
    found = convert.run([str(src), str(tmp_path / "out")])
    assert found.splits["train"].num_examples == 12
    stored = {
        record.filename: record.encoded
        for shard in (tmp_path / "out").glob("train-*.tfrecord")
        for record in (schema.decode_example(data, label_offset=0)
                       for data in record_reader.records(str(shard)))  # fmt: skip
    }
    assert len(stored) == 12 and stored["green/002.jpg"] == image


@pytest.mark.parametrize("options, reads_again", [([], False), (["--compress"], True)])
def test_a_local_job_of_plain_shards_reads_each_input_once(
    tmp_path, monkeypatch, workers_forked, options, reads_again
):
    odd = ["truncated_jpeg.jpg", "pil_sample_cmyk.jpg"]
    src = write_image_folder(tmp_path / "src", per_label=40, odd=odd)
    (src / "red" / "copy.jpg").write_bytes((src / "blue" / "000.jpg").read_bytes())
    log = tmp_path / "reads.log"
    ask = storage.ReadAhead._ask

    def logged(self, path):  # every local read of an input is asked for ahead of it
        with open(log, "a") as f:
            f.write(path + "\n")
        return ask(self, path)

    monkeypatch.setattr(storage.ReadAhead, "_ask", logged)
    found = convert.run([str(src), str(tmp_path / "out"), "--dedupe", *options])
    inputs = [str(path) for path in src.rglob("*.jpg")]
    stored = [path for path in inputs if not path.endswith(("truncated_jpeg.jpg", "red/copy.jpg"))]
    assert found.splits["train"].num_examples == len(stored)
    read = log.read_text().splitlines()
    assert sorted(read) == sorted(inputs + (stored if reads_again else []))


def test_a_worker_error_that_pickle_cannot_rebuild_is_still_said(
    tmp_path, monkeypatch, caplog, workers_forked
):
    # images.Rejected cannot be rebuilt from its pickle: sent back as it is, it broke the pool,
    # and the job said only that a worker was "terminated abruptly".
    src = write_image_folder(tmp_path / "src", per_label=2)

    def fails(*args, **kwargs):
        raise images.Rejected(images.TRUNCATED, "cut short on purpose")

    monkeypatch.setattr(shard_writer, "write_shard", fails)
    monkeypatch.setattr(pieces, "write", fails)  # a local job of plain shards
    with pytest.raises(convert.JobFailedError, match="Rejected: .*cut short on purpose"):
        convert.run([str(src), str(tmp_path / "out"), "--verbose"])
    assert "Traceback" in caplog.text and "raise images.Rejected" in caplog.text  # the worker's


def test_a_full_disk_fails_the_job_saying_what_to_do(tmp_path, monkeypatch, workers_forked):
    src = write_image_folder(tmp_path / "src", per_label=2)

    def full(*_args, **_kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(spill, "write_file", full)  # where the pieces' entries are written
    done = run_cli("convert", src, tmp_path / "out")
    assert done.returncode == 1, done.stderr
    assert f"The disk of {tmp_path / 'out'} is full: it has " in done.stderr
    assert "Make room, or convert into a folder on a larger disk." in done.stderr
    assert "Nothing was finalised" in done.stderr
    # TMPDIR's disk, where the error names a file there (the progress line's counts).
    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setenv("TMPDIR", str(temp))
    monkeypatch.setattr(tempfile, "tempdir", None)

    def full_in_temp(*_args, **_kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(temp / "counts"))

    monkeypatch.setattr(spill, "write_file", full_in_temp)
    done = run_cli("convert", src, tmp_path / "out")
    assert f"A disk is full: {temp}, where the progress line's counts lie" in done.stderr
    assert "Set TMPDIR to a folder with room." in done.stderr and "The disk of" not in done.stderr


def test_a_full_disk_under_a_gs_output_is_tmpdirs_where_the_sorts_lie(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)
    sent = RuntimeError("OSError: [Errno 28] No space left on device")  # a worker's, no file
    said = convert._disk_full("gs://bucket/out", sent)
    assert said.startswith(f"A disk is full: {tmp_path}, where the job's sorts lie while it runs")
    assert said.endswith("Set TMPDIR to a folder with room.")


def test_a_checked_entry_crosses_processes_whole_and_takes_its_label_index_later():
    # Entries are pickled several times each (to the launcher, through its sorts, to the
    # shard's writer) by a pickling of their own, cheaper than the dataclass's.
    import pickle

    checked = load.Checked(key="k", path="/src/a.jpg", relpath="a.jpg", label_index=-1,
                           label_text="cat", sha256="0" * 64, crc32c=7, height=2, width=3,
                           size=100, reencoded=True)  # fmt: skip
    assert pickle.loads(pickle.dumps(checked)) == checked
    labelled = checked.with_label_index(4)
    assert labelled == load.Checked(**{**{f: getattr(checked, f) for f in load._CHECKED_NAMES},
                                       "label_index": 4})  # fmt: skip


def test_a_local_csv_of_gs_files_is_read_once_into_the_beam_pipelines_dataset(gcs, tmp_path):
    # The list is local, so the job reads each input once (pieces.py), its workers reading
    # the remote files ahead as the two-read way does.
    src = write_image_folder(tmp_path / "src", per_label=3, odd=("truncated_jpeg.jpg",))
    listed = gcs.image_list(src, "read-once", tmp_path / "list.csv")
    with gcs.exported():
        found = convert.run([str(listed), str(tmp_path / "engine")])
        convert.run([str(listed), str(tmp_path / "beam"), *BEAM])
    lines = listed.read_text().splitlines()
    assert found.splits["train"].num_examples == len(lines) - 1  # the truncated one
    assert files_of(tmp_path / "engine") == files_of(tmp_path / "beam")


def test_a_shard_made_of_pieces_frees_each_once_copied(
    tmp_path, monkeypatch, caplog, workers_forked
):
    # One shard of both workers' pieces: every piece stayed on disk until the job's end,
    # twice the dataset's size, and a job that fitted on its disk failed.
    src = write_image_folder(tmp_path / "src", per_label=20)
    log = tmp_path / "held.log"
    copy = pieces.copy

    def logged(piece, offset, length, shard):  # the pieces' files still on disk, as it copies
        folder = os.path.dirname(piece)
        held = {os.stat(os.path.join(folder, name)).st_ino for name in os.listdir(folder)
                if ".tfrecord" in name}  # fmt: skip
        with open(log, "a") as f:
            f.write(f"{len(held)}\n")
        copy(piece, offset, length, shard)

    monkeypatch.setattr(pieces, "copy", logged)
    monkeypatch.setattr(worker_pool, "processes", lambda: 2)  # whatever this machine has
    convert.run([str(src), str(tmp_path / "out"), "--num_shards", "1"])
    held = [int(n) for n in log.read_text().split()]
    assert held == [4, 3, 2, 1]  # two pieces a worker, each freed once copied

    def refused(*args):
        raise PermissionError(errno.EPERM, "Operation not permitted")  # as FAT refuses links

    monkeypatch.setattr(os, "link", refused)
    log.unlink()
    convert.run([str(src), str(tmp_path / "no-links"), "--num_shards", "1"])
    assert [int(n) for n in log.read_text().split()] == [4, 4, 4, 4]  # held to the end
    assert "takes no hard links" in caplog.text
    assert files_of(tmp_path / "no-links") == files_of(tmp_path / "out")


def test_shards_take_the_records_kept_in_the_pieces_as_ranked_in_one_sequence():
    # The launcher hands each shard runs of kept records by counts alone; they must be the
    # records the two-read way ranks into it (shard_plan.shard_of_rank), whatever the drops.
    rng = random.Random(3)
    for _ in range(300):
        records = [rng.randrange(0, 9) for _ in range(rng.randrange(1, 6))]
        dropped = [tuple(sorted(rng.sample(range(n), rng.randrange(0, n + 1)))) for n in records]
        kept = [(piece, n - len(gone), gone)
                for piece, (n, gone) in enumerate(zip(records, dropped))]
        ranked = [(piece, index) for piece, (n, gone) in enumerate(zip(records, dropped))
                  for index in range(n) if index not in gone]  # fmt: skip
        if not ranked:
            continue
        shards = rng.randrange(1, len(ranked) + 3)
        expected = {}
        for rank, at in enumerate(ranked):
            expected.setdefault(shard_plan.shard_of_rank(rank, len(ranked), shards), []).append(at)
        got = {}
        for shard, takes in pieces.shards_taking(iter(kept), len(ranked), shards):
            for take in takes:
                in_piece = [i for i in range(records[take.piece]) if i not in take.dropped]
                got.setdefault(shard, []).extend(
                    (take.piece, i) for i in in_piece[take.first : take.end])
        assert got == expected
    with pytest.raises(AssertionError, match="do not add up to 5"):
        list(pieces.shards_taking(iter([(0, 4, ())]), 5, 2))
    # A split whose every record --dedupe dropped: no shard (it raised StopIteration).
    assert list(pieces.shards_taking(iter([(0, 0, (0, 1))]), 0, 0)) == []


def test_a_shard_is_put_together_from_ranges_of_pieces_or_takes_a_whole_piece(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_bytes(b"0123456789")
    b.write_bytes(b"abcdef")
    entries = [tuple(pieces.InPiece(split="train", relpath=name, path=name, label_index=i,
                                    label_text="cat", sha256="0" * 64, size=1, length=length))
               for i, (name, length) in enumerate(zip("xyz", [3, 5, 4]))]  # fmt: skip
    cut = pieces.Cut()
    for (piece, offset), written in zip([(0, 2), (0, 5), (1, 0)], entries):
        cut.add(piece, offset, written)
    assert cut.ranges == [(0, 2, 8), (1, 0, 4)] and cut.count == 3
    positions = manifest.ShardPositions()
    for written in map(pieces.InPiece._make, entries):
        positions.add(written.relpath, written.label_index, written.label_text)
    assert cut.digest() == positions.hexdigest()
    files = {0: str(a), 1: str(b)}
    ranges = [(files[piece], offset, length) for piece, offset, length in cut.ranges]
    assert pieces.put_together(str(tmp_path / "shard"), ranges, False, links=False) == 12
    assert (tmp_path / "shard").read_bytes() == b"23456789abcd" and a.exists() and b.exists()
    os.link(a, tmp_path / "a.1")  # a shard's own links: each removed once copied
    assert pieces.put_together(str(tmp_path / "again"), [(str(tmp_path / "a.1"), 0, 4)],
                               False) == 4  # fmt: skip
    assert not (tmp_path / "a.1").exists() and a.exists()
    assert pieces.put_together(str(tmp_path / "whole"), [(str(b), 0, 6)], True) == 6
    assert (tmp_path / "whole").read_bytes() == b"abcdef" and not b.exists()
    a.write_bytes(b"01")  # cut short while the job ran: no shard takes the name
    with pytest.raises(OSError, match="ended before byte 5"):
        pieces.put_together(str(tmp_path / "short"), [(str(a), 0, 5)], False)
    assert not (tmp_path / "short").exists()


def test_the_progress_line_counts_the_inputs_listed_until_they_are_loaded(tmp_path):
    # A local job of plain shards lists every input before it loads any: ten million take
    # minutes, which the line showed as nothing at all.
    line = worker_progress.ProgressLine(str(tmp_path), stream=io.StringIO())
    worker_progress.report(str(tmp_path), "local", 0, 0, listed=4096)
    assert line._text(*worker_progress.totals(str(tmp_path))) == "converting: 4096 inputs listed"
    worker_progress.report(str(tmp_path), "local", 64, 1, listed=5000)
    shown = line._text(*worker_progress.totals(str(tmp_path)))
    assert shown.startswith("converting: 64 inputs loaded (1 rejected), ")
    assert line._text(1, 0).startswith("converting: 1 input loaded (0 rejected)")
    assert line._text(0, 0, listed=1) == "converting: 1 input listed"
    # Counts that stop moving are said to (a storage gone showed "0/s" for minutes).
    assert "moved" not in line._shown((64, 1, 0, 0, 5000), 100.0)
    assert "moved" not in line._shown((64, 1, 0, 0, 5000), 119.0)
    assert line._shown((64, 1, 0, 0, 5000), 125.0).endswith("/s; nothing moved for 25 s")
    assert "moved" not in line._shown((65, 1, 0, 0, 5000), 126.0)
