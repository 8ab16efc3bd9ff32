"""claim.py: one conversion at a time into an output folder, locally and on gs://."""

import contextlib
import dataclasses
import json
import os
import shutil
import signal
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
    fields = dict(run="dead", host=claim.this_host(), pid=os.getpid(), started=now, renewed=now)
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


def test_a_conversion_into_a_dead_runs_claimed_folder_converts_saying_it_took_the_claim(
    tmp_path, caplog
):
    src = write_image_folder(tmp_path / "src", per_label=1)
    write_claim(tmp_path / "out", pid=dead_pid())
    convert.run([str(src), str(tmp_path / "out"), *IN_PROCESS])
    assert "Took over the claim on" in caplog.text and "which had stopped renewing it" in caplog.text
    assert (tmp_path / "out" / "manifest.json").exists()
    assert not (tmp_path / "out" / claim.CLAIM_NAME).exists()


def test_a_live_claim_on_another_machine_is_respected(tmp_path):
    write_claim(tmp_path / "out", host="another-machine", pid=1)
    with pytest.raises(claim.OutputBusyError, match="host another-machine"):
        claim.Claim(str(tmp_path / "out")).acquire()


@pytest.mark.parametrize("host", [f"{socket.gethostname()} pid:[1]", socket.gethostname()],
                         ids=["another PID namespace", "a claim of 0.4"])
def test_a_live_claim_whose_pid_this_host_cannot_see_is_respected(tmp_path, host):
    # A container sharing the host's name (another PID namespace) found the running
    # conversion's pid gone, took its claim over and wrote into its output (a reviewer's
    # `unshare --pid`): a pid is looked up only in the namespace that names it.
    write_claim(tmp_path / "out", host=host, pid=dead_pid())
    with pytest.raises(claim.OutputBusyError, match="being written by another conversion"):
        claim.Claim(str(tmp_path / "out")).acquire()


@pytest.mark.parametrize("replacing", [False, True])
def test_a_run_that_lost_its_claim_changes_nothing_in_the_output(tmp_path, monkeypatch,
                                                                 replacing):  # fmt: skip
    # A run stopped past the claim's lease (Ctrl-Z, a suspended VM) was taken over; resumed,
    # it finalised over the other run's dataset, and both exited 0 (a reviewer's SIGSTOP).
    from beam_jobs import local_engine

    src = write_image_folder(tmp_path / "src", per_label=2)
    out = tmp_path / "out"
    if replacing:
        convert.run([str(src), str(out), *IN_PROCESS])
    before = sorted(p.name for p in out.iterdir()) if replacing else []
    write_shards = local_engine._Job.write_shards

    def taken_over_meanwhile(job, labels):
        write_claim(out, run="other", host="another-machine", pid=1)
        return write_shards(job, labels)

    monkeypatch.setattr(local_engine._Job, "write_shards", taken_over_meanwhile)
    flags = ["--overwrite"] if replacing else []
    with pytest.raises(convert.JobFailedError, match=f"no longer holds the claim on {out}: run "
                                                     "other .*changes nothing more"):  # fmt: skip
        convert.run([str(src), str(out), *flags, *IN_PROCESS])
    left = sorted(p.name for p in out.iterdir() if not p.name.startswith(".tmp-"))
    assert left == sorted([*before, claim.CLAIM_NAME] if replacing else [claim.CLAIM_NAME])
    assert json.loads((out / claim.CLAIM_NAME).read_text())["run"] == "other"  # not removed
    if replacing:
        assert run_cli("verify", src, out).returncode == 0  # the dataset there, as it was


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
def test_a_conversion_started_while_another_runs_is_refused_and_one_whole_dataset_left(
    tmp_path,
):
    # Both used to succeed, leaving the shards of two datasets side by side. The first run is
    # paused once it holds the claim, so that the two overlap on any machine: started
    # together, the first could end before the second began (and then both rightly
    # succeed). Where the first ends before it is seen holding the claim, they start again.
    src = write_image_folder(tmp_path / "src", per_label=300)
    out = tmp_path / "out"

    def convert_into(shards):
        return subprocess.Popen(
            [sys.executable, "-m", "beam_jobs.convert", str(src), str(out), "--num_shards",
             str(shards), "--overwrite", *IN_PROCESS],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip

    for _ in range(5):
        shutil.rmtree(out, ignore_errors=True)
        first = convert_into(3)
        while first.poll() is None and not (out / claim.CLAIM_NAME).exists():
            time.sleep(0.002)
        if first.poll() is None:
            break
        assert first.returncode == 0, first.communicate()[1][-1500:]
    else:
        pytest.fail("the first conversion was never seen holding its claim")
    first.send_signal(signal.SIGSTOP)
    try:
        second = convert_into(4)
        error = second.communicate(timeout=300)[1]
    finally:
        first.send_signal(signal.SIGCONT)
    first_error = first.communicate(timeout=300)[1]
    assert (first.returncode, second.returncode) == (0, 2), (first_error[-1500:], error[-1500:])
    assert "being written by another conversion" in error
    shards = sorted(p.name for p in out.glob("*.tfrecord"))
    written = json.loads((out / "manifest.json").read_text())["splits"]["train"]["files"]
    assert shards == sorted(written) and len(shards) == 3  # the first's shards, no others
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
def test_a_claim_on_gcs_whose_answers_were_lost_is_still_this_runs(gcs):
    # The client retries a request whose answer was cut off, and its precondition then fails
    # on the object the first try made: the create was read as another run's claim (the run
    # refused its own output, and left the claim there), and one renewal so answered failed
    # every later one, the claim left behind (a helper's trial, under injected faults). Here
    # the first try's effect is made by hand, then the step is asked again.
    from google.cloud import storage

    folder = gcs.url("lost-answers")
    blob = storage.Client().bucket(gcs.bucket).blob(f"lost-answers/{claim.CLAIM_NAME}")
    held = claim.Claim(folder)
    blob.upload_from_string(claim._encode(held._me))  # the create took effect
    held.acquire()
    assert held.taken_over is None
    renewed = dataclasses.replace(held._me, renewed=time.time())
    blob.upload_from_string(claim._encode(renewed))  # a renewal took effect
    held._store.renew(dataclasses.replace(renewed, renewed=time.time() + 1))
    held._store.renew(dataclasses.replace(renewed, renewed=time.time() + 2))  # and the next
    assert json.loads(blob.download_as_bytes())["renewed"] > renewed.renewed
    blob.upload_from_string(claim._encode(renewed))  # (a renewal took effect again)
    held._store.release(held._me)
    assert not blob.exists()
    # Another run's claim is not taken for this one's.
    other = claim.Claim(folder)
    blob.upload_from_string(claim._encode(other._me))
    with pytest.raises(claim.OutputBusyError, match=f"run {other.run} "):
        held.acquire()
    with pytest.raises(Exception, match="412|[Pp]recondition"):
        held._store.renew(held._me)


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


def test_a_run_taken_over_before_it_finalised_does_not_report_the_other_run_s_dataset(
        tmp_path, monkeypatch):  # fmt: skip
    # The run that took over removed this one's temporary folder; finalising, this one found
    # a manifest and no summary, took the dataset for its own finished one, and exited 0
    # printing it (a reviewer's case).
    from beam_jobs import finalise, local_engine

    src = write_image_folder(tmp_path / "src", per_label=2)
    out = tmp_path / "out"
    convert.run([str(src), str(out), *IN_PROCESS])
    real = finalise.finalise

    def taken_over_first(config, temp_dir, *args, **kwargs):
        shutil.rmtree(temp_dir)
        write_claim(out, run="other", host="another-machine", pid=1)
        return real(config, temp_dir, *args, **kwargs)

    monkeypatch.setattr(local_engine.finalise, "finalise", taken_over_first)
    with pytest.raises(convert.JobFailedError, match="no longer holds the claim"):
        convert.run([str(src), str(out), "--overwrite", *IN_PROCESS])


def test_a_finalise_that_loses_its_claim_midway_stops_at_the_next_group_of_moves(
        tmp_path, monkeypatch):  # fmt: skip
    # Stopped between two groups of renames for longer than the lease, it went on renaming
    # its shards over those of the run that took the folder over.
    from beam_jobs import finalise, storage

    (tmp_path / "tmp").mkdir()
    moves = []
    for i in range(250):
        (tmp_path / "tmp" / f"{i}.tfrecord").write_bytes(b"x")
        moves.append((str(tmp_path / "tmp" / f"{i}.tfrecord"), str(tmp_path / f"{i}.tfrecord")))
    write_claim(tmp_path, run="me")
    rename = storage.rename

    def taken_over_after(sources, targets):
        rename(sources, targets)
        write_claim(tmp_path, run="other", host="another-machine", pid=1)

    monkeypatch.setattr(storage, "rename", taken_over_after)
    monkeypatch.setattr(finalise._ClaimGuard, "CHECK_EVERY_S", 0.0)  # as after a long stop
    with pytest.raises(claim.ClaimLostError, match="run other .*holds it now"):
        finalise._move(moves, finalise._ClaimGuard(str(tmp_path), "me"))
    assert len(list(tmp_path.glob("*.tfrecord"))) == finalise.MOVES_A_CHECK
