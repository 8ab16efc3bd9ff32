"""A run's temporary folder outlives no run: a killed run's is removed by the next one."""

import os
import signal
import subprocess
import sys
import time

from beam_jobs import work_folder
from tfrecord_pipe._tools import verify

from helpers import COMMAND

HOLDS_A_FOLDER = """
import sys, time
from beam_jobs import work_folder
with work_folder.work_folder(sys.argv[1], sys.argv[2]) as folder:
    with open(folder + "/run-0001", "wb") as run:
        run.write(b"x" * 4096)
    print(folder, flush=True)
    time.sleep(120)
"""


def holding(prefix: str, parent) -> tuple[subprocess.Popen, str]:
    """A process inside `work_folder(prefix, parent)`, and its folder."""
    process = subprocess.Popen([sys.executable, "-c", HOLDS_A_FOLDER, prefix, str(parent)],
                               stdout=subprocess.PIPE, text=True)  # fmt: skip
    return process, process.stdout.readline().strip()


def test_a_killed_runs_folder_is_removed_by_the_next_run_and_a_living_runs_is_kept(tmp_path):
    killed, killed_folder = holding("job-", tmp_path)
    living, living_folder = holding("job-", tmp_path)
    other, _ = holding("other-", tmp_path)  # another prefix: not this run's kind
    own = work_folder._of_this_machine("job-")  # "job-" and this machine's name, as "job-vm-"
    older = tmp_path / f"{own}abcdefgh"  # no lock file: an older version's
    older.mkdir()
    # Others' on storage shared with them, whose locks may be theirs alone: "job-vm-" also
    # begins the name of a folder of the machine "vm-2".
    elsewhere = [tmp_path / "job-another-machine-abcdefgh", tmp_path / f"{own}2-abcdefgh"]
    for folder in elsewhere:
        folder.mkdir()
        (folder / work_folder.LOCK_NAME).touch()
    # Half-made (a run killed between making a folder and taking its lock): removed once
    # stale, not while its run may still be making it.
    half_made = [tmp_path / f".making-{own}abcdefg{n}" for n in range(2)]
    for folder in half_made:
        folder.mkdir()
    stale = time.time() - work_folder.MAKING_STALE_S - 1
    os.utime(half_made[0], (stale, stale))
    try:
        killed.kill()
        killed.wait()
        assert os.path.isdir(killed_folder)  # SIGKILL: nothing ran to remove it
        with work_folder.work_folder("job-", str(tmp_path)) as folder:
            left = sorted(path.name for path in tmp_path.iterdir())
            assert not os.path.exists(killed_folder)
            assert os.path.isfile(os.path.join(living_folder, "run-0001"))
            assert os.path.basename(folder) in left and older.name in left
            assert len([name for name in left if name.startswith("other-")]) == 1
        assert not os.path.exists(folder)
        living.send_signal(signal.SIGTERM)
        living.wait()
        assert os.path.isdir(living_folder)
        assert work_folder.remove_orphans("job-", str(tmp_path)) == [living_folder]
        assert older.is_dir() and all(folder.is_dir() for folder in elsewhere)
        making = [name for name in os.listdir(tmp_path) if name.startswith(".making-")]
        assert making == [half_made[1].name]
    finally:
        for process in (killed, living, other):
            process.kill()
            process.wait()
            process.stdout.close()


def test_a_verify_killed_mid_run_leaves_nothing_once_verify_runs_again(converted, tmp_path):
    """SIGKILL (the OOM killer) leaves verify's sorts, some 0.5 kB an input, in TMPDIR: the
    next verify removes them."""
    src, out = converted
    temp = tmp_path / "tmp"
    temp.mkdir()
    env = dict(os.environ, TMPDIR=str(temp))
    said = tmp_path / "said"
    for _ in range(5):  # its folder lives 0.1 s: verify may end, or clean up, before the kill
        with open(said, "w") as stdout:
            ran = subprocess.Popen([COMMAND, "verify", str(src), str(out)], env=env,
                                   stdout=stdout, stderr=subprocess.STDOUT)  # fmt: skip
        try:
            deadline = time.monotonic() + 120
            while ran.poll() is None and not any(
                p.name.startswith(verify.WORK_PREFIX) for p in temp.iterdir()
            ):
                assert time.monotonic() < deadline
                time.sleep(0.002)
            ran.kill()
        finally:
            ran.kill()
            ran.wait()
        left = [p.name for p in temp.iterdir() if p.name.startswith(verify.WORK_PREFIX)]
        if left:
            break
    assert len(left) == 1, said.read_text()
    done = subprocess.run([COMMAND, "verify", str(src), str(out)], env=env, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert not [p.name for p in temp.iterdir() if p.name.startswith(verify.WORK_PREFIX)]


def test_a_folder_this_process_holds_is_never_its_own_to_sweep(tmp_path, monkeypatch):
    # On NFS flock is a POSIX lock, which never conflicts within a process: two runs in one
    # process (threads of a library user) would each take the other's lock for free.
    with work_folder.work_folder("job-", str(tmp_path)) as folder:
        monkeypatch.setattr(work_folder.fcntl, "flock", lambda *_: None)  # locks tell nothing
        assert work_folder.remove_orphans("job-", str(tmp_path) + "/") == []
        assert os.path.isdir(folder)
