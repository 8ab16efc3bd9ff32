"""claim.py: one conversion at a time into an output folder, locally and on gs://."""

import contextlib
import dataclasses
import json
import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from beam_jobs import claim, convert

from helpers import IN_PROCESS, run_cli, write_image_folder


def test_a_claimed_folder_refuses_a_second_conversion_naming_the_first(tmp_path):
    src = write_image_folder(tmp_path / "src", per_label=1)
    with claim.Claim(str(tmp_path / "out")) as held:
        with pytest.raises(claim.OutputBusyError, match="being written by another conversion"):
            convert.run([str(src), str(tmp_path / "out"), *IN_PROCESS])
        assert (tmp_path / "out" / claim.CLAIM_NAME).exists()
        message = str(pytest.raises(claim.OutputBusyError, claim.Claim(str(tmp_path / "out")).acquire).value)
        assert f"pid {os.getpid()}" in message and held.path in message
    assert not (tmp_path / "out" / claim.CLAIM_NAME).exists()  # given up at the end


def write_claim(folder, **holder):
    folder.mkdir(parents=True, exist_ok=True)
    now = time.time()
    fields = dict(run="dead", host=socket.gethostname(), pid=os.getpid(), started=now, renewed=now)
    (folder / claim.CLAIM_NAME).write_text(json.dumps({**fields, **holder}))


def dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


@pytest.mark.parametrize(
    "holder",
    [{"pid": "dead"}, {"host": "another-machine", "renewed": 0.0}, {"run": None}],
    ids=["process gone", "not renewed", "not a claim"],
)
def test_a_claim_of_a_run_that_died_is_taken_over_and_said(tmp_path, holder):
    if holder.get("pid") == "dead":
        holder["pid"] = dead_pid()
    write_claim(tmp_path / "out", **holder)
    if holder.get("run", "x") is None:
        (tmp_path / "out" / claim.CLAIM_NAME).write_text("{half written")
    with claim.Claim(str(tmp_path / "out")) as held:
        assert held.taken_over is not None


def test_a_live_claim_on_another_machine_is_respected(tmp_path):
    write_claim(tmp_path / "out", host="another-machine", pid=1)
    with pytest.raises(claim.OutputBusyError, match="host another-machine"):
        claim.Claim(str(tmp_path / "out")).acquire()


def test_two_runs_claiming_at_the_same_moment_never_both_hold_it(tmp_path):
    # Created empty and then written, a claim read in between looked like a dead run's: the
    # other run took it over and both converted (17 rounds in 300 here, and in the suite).
    for round_ in range(200):
        folder, taken = str(tmp_path / str(round_)), []
        start = threading.Barrier(2)

        def take(folder=folder, taken=taken, start=start):
            contender = claim.Claim(folder)
            start.wait()
            with contextlib.suppress(claim.OutputBusyError):
                contender.acquire()
                taken.append(contender)

        threads = [threading.Thread(target=take) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len(taken) == 1, f"round {round_}: {len(taken)} runs hold the claim"
        assert sorted(os.listdir(folder)) == [claim.CLAIM_NAME]  # no partial file left


@pytest.mark.slow
def test_two_conversions_started_together_leave_one_whole_dataset(tmp_path):
    # Both used to succeed, leaving the shards of two datasets side by side.
    src = write_image_folder(tmp_path / "src", per_label=1500)  # seconds of work, not less
    out = tmp_path / "out"
    runs = [
        subprocess.Popen(
            [sys.executable, "-m", "beam_jobs.convert", str(src), str(out), "--num_shards",
             str(shards), "--overwrite", *IN_PROCESS],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for shards in (3, 4)
    ]  # fmt: skip
    errors = [run.communicate(timeout=300)[1] for run in runs]
    codes = [run.returncode for run in runs]
    assert sorted(codes) == [0, 2], [error[-1500:] for error in errors]
    assert "being written by another conversion" in errors[codes.index(2)]
    shards = sorted(p.name for p in out.glob("*.tfrecord"))
    written = json.loads((out / "manifest.json").read_text())["splits"]["train"]["files"]
    assert shards == sorted(written)  # one dataset's shards, no others
    assert run_cli("verify", src, out).returncode == 0


@pytest.mark.slow
def test_a_claim_on_gcs_is_taken_once_renewed_and_given_up(gcs):
    folder = gcs.url("claimed")
    with claim.Claim(folder) as held:
        with pytest.raises(claim.OutputBusyError, match=f"pid {os.getpid()}"):
            claim.Claim(folder).acquire()
        held._store.renew(dataclasses.replace(held._me, renewed=time.time()))  # as the thread does
        with pytest.raises(claim.OutputBusyError):
            claim.Claim(folder).acquire()
    with claim.Claim(folder) as again:  # given up: free to take
        assert again.taken_over is None


@pytest.mark.slow
def test_a_stale_claim_on_gcs_is_taken_over_by_one_run_only(gcs):
    from google.cloud import storage

    folder = gcs.url("stale")
    blob = storage.Client().bucket(gcs.bucket).blob(f"stale/{claim.CLAIM_NAME}")
    dead = {"run": "dead", "host": "gone", "pid": 1, "started": 0.0, "renewed": 0.0}
    blob.upload_from_string(json.dumps(dead))
    first, second = claim.Claim(folder), claim.Claim(folder)
    first.acquire()
    assert first.taken_over is not None and first.taken_over.run == "dead"
    with pytest.raises(claim.OutputBusyError):
        second.acquire()
