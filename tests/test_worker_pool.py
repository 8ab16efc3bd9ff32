"""The local engine's and verify's worker processes (beam_jobs/worker_pool.py): what a killed
worker, a lock held at the wrong instant, or an error that does not travel does to a pool."""

import multiprocessing
import os
import resource
import signal
import struct
import subprocess
import sys
import threading
import time
from concurrent.futures.process import BrokenProcessPool

import pytest

from beam_jobs import fork_server, worker_pool

from helpers import run_python, set_up_then, write_image_folder

_HELD = threading.Lock()


def _lock_is_free(_) -> bool:
    if not _HELD.acquire(timeout=2):
        return False
    _HELD.release()
    return True


def test_a_lock_held_while_the_workers_start_is_not_held_in_them():
    # Workers forked from the launcher inherited every lock as its threads held it at that
    # instant, and nothing in the worker ever let it go: verify on gs:// hung for ever on
    # google-auth's, held by a Cloud Storage request of another thread.
    with _HELD:
        with worker_pool.pool(2, int) as pool:
            assert all(pool.map(_lock_is_free, range(4)))


def _killed_while_sending(kill_with: int) -> None:
    """Writes the start of a 10 kB answer to the launcher, then is killed."""
    to_launcher = multiprocessing.current_process()._args[0]
    os.write(to_launcher.fileno(), struct.pack("!i", 10_000) + b"half an answer")
    os.kill(os.getpid(), kill_with)


def _slow(seconds: float) -> float:
    threading.Event().wait(seconds)
    return seconds


@pytest.mark.parametrize(("kill_with", "said"), [
    (signal.SIGKILL, "killed by SIGKILL, as the out-of-memory killer does"),
    (signal.SIGRTMIN + 5, f"killed by signal {signal.SIGRTMIN + 5}"),  # one with no name
])  # fmt: skip
def test_a_worker_killed_while_it_sends_its_answer_fails_every_task_not_done(kill_with, said):
    # Python's ProcessPoolExecutor waited for ever on the rest of a half-sent answer (and the
    # other workers on the lock of the pipe they shared): a conversion whose worker the OOM
    # killer ended hung.
    with pytest.raises(BrokenProcessPool, match=said):
        with worker_pool.pool(2, int) as pool:
            other = pool.submit(_slow, 60)  # ended with the pool, not waited for
            pool.submit(_killed_while_sending, kill_with).result(timeout=60)
    with pytest.raises(BrokenProcessPool):
        other.result(timeout=0)


def _fails_to_start() -> None:
    raise OSError("no such bucket")


def test_a_worker_that_cannot_start_fails_the_tasks_saying_why():
    with pytest.raises(worker_pool.WorkerError, match="OSError while a worker started: no such"):
        with worker_pool.pool(2, _fails_to_start) as pool:
            pool.submit(abs, -1).result(timeout=60)


class _NoRebuild(Exception):
    def __init__(self, a, b):
        super().__init__(f"{a} {b}")


def _answers_what_cannot_travel(kind: str):
    if kind == "unpicklable":
        return threading.Lock()
    raise _NoRebuild("rebuilt", "never")


def _raise_on_arrival():
    raise RuntimeError("cannot be rebuilt here")


class _BreaksOnArrival:
    def __reduce__(self):
        return _raise_on_arrival, ()


def test_what_cannot_travel_fails_its_task_and_the_pool_goes_on():
    with worker_pool.pool(1, int) as pool:
        with pytest.raises(worker_pool.WorkerError, match="task could not be read in the worker"):
            pool.submit(abs, _BreaksOnArrival()).result(timeout=60)
        with pytest.raises(worker_pool.WorkerError, match="cannot be sent back"):
            pool.submit(_answers_what_cannot_travel, "unpicklable").result(timeout=60)
        with pytest.raises(worker_pool.WorkerError, match="could not be read"):
            pool.submit(_answers_what_cannot_travel, "error").result(timeout=60)
        assert pool.submit(abs, -3).result(timeout=60) == 3


def test_a_worker_whose_launcher_is_gone_ends_quietly(monkeypatch, capfd):
    # With the fork server killed under `verify`, each worker's answer met a closed pipe, and
    # its report of that failure too: a traceback printed twice before the one-line error.
    import multiprocessing

    monkeypatch.setattr(worker_pool, "_start", lambda *_: None)
    worker, launcher = multiprocessing.Pipe()
    launcher.send((len, ([1, 2],)))
    launcher.close()  # gone before the answer
    worker_pool._serve(worker, None, "fork", None, ())  # returns, raising nothing
    assert capfd.readouterr() == ("", "")  # and printing nothing


def test_a_callback_that_submits_as_the_pool_breaks_is_told_and_nothing_waits():
    # Futures resolved while the pool's lock was held: a done-callback that submitted
    # waited on that lock for ever, and so did the job.
    told = []

    def submit_again(_):
        try:
            pool.submit(abs, -1)
        except BrokenProcessPool as err:
            told.append(err)

    with worker_pool.pool(2, int) as pool:
        pool.submit(_slow, 60).add_done_callback(submit_again)
        with pytest.raises(BrokenProcessPool):
            pool.submit(_killed_while_sending, signal.SIGKILL).result(timeout=60)
    assert len(told) == 1


def test_workers_start_in_a_working_folder_that_was_removed(tmp_path, monkeypatch):
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()  # as a user's shell sits in a folder another command removed
    with worker_pool.pool(2, int) as pool:
        assert pool.submit(abs, -2).result(timeout=60) == 2


_BUSY = """
import os, resource, sys, time
from multiprocessing import forkserver
from beam_jobs import worker_pool

work = [range(20_000_000)] * 2
started = time.process_time()
sum(work[0])
one = time.process_time() - started
with worker_pool.pool(2, int) as pool:
    assert list(pool.map(sum, work)) == [sum(work[0])] * 2
mine = resource.getrusage(resource.RUSAGE_SELF)
print(mine.ru_utime + mine.ru_stime, one, forkserver._forkserver._forkserver_pid)
"""


def test_the_workers_end_with_the_command_and_their_time_counts_as_its():
    # The fork server, left to end on its own after the launcher, was nobody's child: the
    # workers' CPU time went uncounted (`time`, a benchmark's rusage: a conversion measured
    # at a third of its cost), and it could outlive the command.
    command = subprocess.Popen([sys.executable, "-c", _BUSY], stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while (ended := os.wait4(command.pid, os.WNOHANG))[0] == 0:
        assert time.monotonic() < deadline, "the command did not end"
        time.sleep(0.05)
    command.returncode = os.waitstatus_to_exitcode(ended[1])
    assert command.returncode == 0
    own, one_sum, server = command.stdout.read().split()
    usage = ended[2]
    # Its own time and the two sums the workers made: at least half a sum's worth (uncounted,
    # they add nothing). Not 1.5, nor 1: on a busy machine the launcher's sum took 0.45 CPU-s
    # and each worker's about 0.32, the same work (caches shared with other processes).
    assert usage.ru_utime + usage.ru_stime >= float(own) + 0.5 * float(one_sum)
    assert not os.path.exists(f"/proc/{server}")  # ended and waited for: not even a zombie


def test_a_stopped_server_is_started_again_by_the_next_pool():
    for _ in range(2):
        with worker_pool.pool(1, int) as pool:
            assert pool.submit(abs, -3).result(timeout=60) == 3
        fork_server.stop()


def test_a_stopped_worker_ends_with_the_pool_without_waiting_for_the_deadline(monkeypatch):
    # Ctrl-C with a worker stopped (SIGSTOP, a debugger): its SIGTERM waited until it was
    # continued, and each such worker cost the job END_S more before it was killed.
    monkeypatch.setattr(worker_pool, "END_S", 60.0)
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        with worker_pool.pool(2, int) as pool:
            busy = [pool.submit(_slow, 60) for _ in range(2)]
            for process in pool._workers.values():
                os.kill(process.pid, signal.SIGSTOP)
            raise KeyboardInterrupt
    assert time.monotonic() - started < 30  # not the 60 s deadline
    assert all(isinstance(future.exception(timeout=0), BrokenProcessPool) for future in busy)


def test_a_process_forked_from_the_launcher_leaves_the_launchers_server_alone():
    # Its exit ran the launcher's `stop`: it unlinked the server's socket, and every pool of
    # the launcher failed after.
    ran = run_python(
        "import os, sys\n"
        "from beam_jobs import worker_pool\n"
        "with worker_pool.pool(1, int) as pool: pool.submit(abs, -1).result(timeout=60)\n"
        "child = os.fork()\n"
        "if child == 0: sys.exit(0)\n"
        "os.waitpid(child, 0)\n"
        "with worker_pool.pool(1, int) as pool: print(pool.submit(abs, -2).result(timeout=60))\n"
    )
    assert ran.returncode == 0 and ran.stdout.split() == ["2"], ran.stderr


def test_a_pool_left_open_at_exit_does_not_hold_the_exit():
    # The server ends only once its workers do; waited for before multiprocessing ended
    # them, it held every exit END_S.
    ran = run_python(
        "import threading, time\n"
        "from beam_jobs import fork_server, worker_pool\n"
        "fork_server.END_S = 600\n"
        "ready = threading.Event()\n"
        "def hold():\n"
        "    with worker_pool.pool(2, int) as pool:\n"
        "        pool.submit(abs, -1).result(timeout=60)\n"
        "        ready.set()\n"
        "        time.sleep(1000)\n"
        "threading.Thread(target=hold, daemon=True).start()\n"
        "assert ready.wait(60)\n",
        timeout=120,
    )
    assert ran.returncode == 0, ran.stderr


@pytest.mark.parametrize("args", [["SRC", "OUT"], ["gs://bucket/src", "OUT"]])
@pytest.mark.slow  # over a second of CPU: out of the fast subset
def test_workers_start_with_the_job_s_modules_loaded_and_beam_only_for_remote_paths(args):
    # Beam's import cost most of a CPU-second in the workers' server, on every conversion;
    # a job on gs:// needs Beam's filesystems in every worker, imported once in the server.
    loaded = (
        "sorted(m for m in __import__('sys').modules if m in ('apache_beam', "
        "'apache_beam.io.filesystems') or m in __import__('beam_jobs.worker_pool')"
        ".worker_pool.JOB_MODULES)"
    )
    ran = run_python(
        "from beam_jobs import worker_pool\n"
        f"worker_pool.start_server_for({args!r})\n"
        "with worker_pool.pool(1, int) as pool:\n"
        f"    print(pool.submit(eval, {loaded!r}).result(timeout=60))\n"
    )
    remote = ["apache_beam", "apache_beam.io.filesystems"] if "gs://" in args[0] else []
    assert ran.stdout.strip() == str(sorted([*worker_pool.JOB_MODULES, *remote])), ran.stderr


@pytest.mark.parametrize(("args", "starts"), [
    (["SRC", "OUT"], True),
    (["SRC", "OUT", "--runner", "DataflowRunner"], False),  # Beam's runner: no pool here
    (["SRC", "OUT", "--direct_num_workers=2"], False),
    (["--help"], False),
])  # fmt: skip
def test_a_command_starts_the_server_only_where_a_pool_will_run(args, starts):
    ran = run_python(
        "from multiprocessing import forkserver\n"
        "from beam_jobs import worker_pool\n"
        f"worker_pool.start_server_for({args!r})\n"
        "print(forkserver._forkserver._forkserver_pid is not None)\n"
    )
    assert ran.stdout.split() == [str(starts)], ran.stderr


def _command(*args, limit: tuple[int, int]) -> subprocess.CompletedProcess:
    """The command run with at most limit[0] open files, raisable up to limit[1] (`ulimit -n`)."""
    limited = f"resource.setrlimit(resource.RLIMIT_NOFILE, {limit})"
    command = [sys.executable, "-m", "tfrecord_pipe._tools.cli", *args]
    return subprocess.run(set_up_then(limited, command), capture_output=True, text=True,
                          timeout=120)  # fmt: skip


@pytest.mark.slow  # conversions and verifies in new processes, as a shell runs them
def test_a_low_limit_of_open_files_is_raised_or_said_with_what_to_do(tmp_path):
    # Under `ulimit -n` 15 both commands failed naming the workers' server (a bare traceback
    # at 8); a limit lowered in the soft limit only, which the process may raise, failed too.
    # 66 images make 64 shards: a sort's merge then opens a run of each (spill.FAN_IN).
    src, out = write_image_folder(tmp_path / "src", per_label=22), tmp_path / "out"
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    for command in (("convert", src, out), ("verify", src, out)):
        done = _command(*command, limit=(12, hard))  # the soft limit alone: raised
        assert done.returncode == 0, done.stderr[-2000:]
    assert "every source accounted for" in done.stdout
    # A hard limit the workers fit under, but not a merge of every run at once: merged in
    # more steps (it was refused, asking for 169 files).
    for command in (("convert", src, tmp_path / "narrow"), ("verify", src, tmp_path / "narrow")):
        done = _command(*command, limit=(12, 70))
        assert done.returncode == 0, done.stderr[-2000:]
    assert "every source accounted for" in done.stdout
    for command in (("convert", src, tmp_path / "other"), ("verify", src, out)):
        done = _command(*command, limit=(12, 12))
        assert done.returncode == 2, done.stderr[-2000:]
        assert "may open at most 12 files at once (ulimit -n)" in done.stderr
        assert "Raise the limit (ulimit -n 1024)" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "other").exists() or not any((tmp_path / "other").iterdir())


def test_the_commands_run_under_a_temporary_folder_too_long_for_a_socket_s_path(tmp_path):
    # Sockets' paths have at most 107 bytes: under a TMPDIR of over 75 characters (a cluster
    # job's own) both commands failed with "OSError: AF_UNIX path too long".
    src, out = write_image_folder(tmp_path / "src", per_label=2), tmp_path / "out"
    temp = tmp_path / ("t" * (fork_server.SOCKET_PATH_MOST - fork_server.SOCKET_BELOW_TEMP))
    temp.mkdir()
    assert len(str(temp)) > fork_server.SOCKET_PATH_MOST - fork_server.SOCKET_BELOW_TEMP
    for command in (("convert", src, out), ("verify", src, out)):
        cli = [sys.executable, "-m", "tfrecord_pipe._tools.cli", *map(str, command)]
        done = subprocess.run(cli, capture_output=True, text=True, timeout=120,
                              env=dict(os.environ, TMPDIR=str(temp)))  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]
    assert "every source accounted for" in done.stdout
    assert not list(temp.iterdir())  # verify's sorts lay there, and went with it
    # With no shorter folder to use: the commands' own one-line error, saying what to do.
    no_short = ("from beam_jobs import fork_server; fork_server.SHORT_TEMP = ('/nowhere',); "
                "from tfrecord_pipe._tools import cli; cli.run()")  # fmt: skip
    for command in (("convert", src, tmp_path / "other"), ("verify", src, out)):
        cli = [sys.executable, "-c", no_short, *map(str, command)]
        done = subprocess.run(cli, capture_output=True, text=True, timeout=120,
                              env=dict(os.environ, TMPDIR=str(temp)))  # fmt: skip
        assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
        assert "Set TMPDIR to a writable folder whose path has at most 75 bytes" in done.stderr


_SERVER_UP = """
import sys
from beam_jobs import worker_pool
with worker_pool.pool(1, int) as workers:  # a worker from the server, through its socket
    assert workers.submit(abs, -1).result(timeout=60) == 1
print("up", flush=True)
sys.stdin.read()
"""


def test_a_killed_run_s_socket_folder_goes_with_the_next_run():
    # multiprocessing's folder for the server's socket, TMPDIR/pymp-*, stayed behind every
    # run killed by SIGKILL (the OOM killer's), one a kill, for ever. It now lies in a work
    # folder, which the next run removes.
    import shutil
    import tempfile

    temp = tempfile.mkdtemp(prefix="s", dir="/tmp")  # short: the socket's path must fit
    env = dict(os.environ, TMPDIR=temp)
    try:
        run = lambda: subprocess.Popen([sys.executable, "-c", _SERVER_UP], env=env, text=True,  # noqa: E731
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE)  # fmt: skip
        killed = run()
        assert killed.stdout.readline() == "up\n"
        killed.kill()
        killed.wait(timeout=60)
        (left,) = os.listdir(temp)
        assert left.startswith(fork_server.SOCKETS_PREFIX), left
        assert [name for name in os.listdir(os.path.join(temp, left)) if name.startswith("pymp-")]
        ended = run()
        assert ended.stdout.readline() == "up\n"
        assert left not in os.listdir(temp)  # removed as the next run started
        ended.communicate("", timeout=60)
        assert ended.returncode == 0 and os.listdir(temp) == []  # and its own at its end
        # A machine's name of 63 characters (EC2's, a pod's) is cut to fit, a digest of it
        # added; the folder swept as any other.
        long_name = "import socket; socket.gethostname = lambda: 'h' * 63\n" + _SERVER_UP
        named = subprocess.Popen([sys.executable, "-c", long_name], env=env, text=True,
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE)  # fmt: skip
        assert named.stdout.readline() == "up\n"
        (left,) = os.listdir(temp)
        assert left.startswith(fork_server.SOCKETS_PREFIX + "h" * 15 + "~"), left
        named.kill()
        named.wait(timeout=60)
        named = subprocess.Popen([sys.executable, "-c", long_name], env=env, text=True,
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE)  # fmt: skip
        assert named.stdout.readline() == "up\n"
        assert left not in os.listdir(temp)
        named.communicate("", timeout=60)
        assert os.listdir(temp) == []
        # A TMPDIR that is a short link to a long path: measured as resolved, as the folder's
        # path is (measured as given, every command failed).
        real = os.path.join(temp, "r" * (fork_server.SOCKET_PATH_MOST - fork_server.SOCKET_BELOW_TEMP
                                         - len(temp) - 1))  # fmt: skip
        os.mkdir(real)
        link = os.path.join(temp, "l")
        os.symlink(real, link)
        linked = subprocess.run([sys.executable, "-c", _SERVER_UP], env=dict(env, TMPDIR=link),
                                input="", capture_output=True, text=True, timeout=60)  # fmt: skip
        assert linked.stdout == "up\n" and linked.returncode == 0, linked.stderr[-2000:]
    finally:
        shutil.rmtree(temp, ignore_errors=True)


_SERVER_SIGNALS = """
from multiprocessing import forkserver
from beam_jobs import worker_pool
worker_pool.start_server()
pid = forkserver._forkserver._forkserver_pid
status = dict(line.split(":", 1) for line in open(f"/proc/{pid}/status").read().splitlines())
print(int(status["SigBlk"], 16) >> 1 & 1)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_the_workers_server_starts_with_ctrl_c_blocked():
    # multiprocessing starts its resource tracker as it starts the server, and unblocks SIGINT
    # after: the server started with it open, and a Ctrl-C in its first 0.1 s (its imports)
    # printed its KeyboardInterrupt under the command's "error: interrupted", or broke the
    # pool ("the server that starts the worker processes has ended").
    done = run_python(_SERVER_SIGNALS)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "1"
