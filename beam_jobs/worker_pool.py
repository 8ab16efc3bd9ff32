"""Worker processes for the jobs that run on this machine without Beam's runner (the local
engine of the conversion, and `verify`): one per core, ended whatever happens.

What every such pool needs, written once: workers that share no lock with the launcher's
threads; a Ctrl-C that is the launcher's alone, and never lost during the pool's start or
shutdown; a worker that ends with its launcher, even one killed by SIGKILL; a worker's error
that comes back whole, as a `WorkerError`.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import multiprocessing
import os
import resource
import signal
import threading
import time
import traceback
from concurrent import futures
from concurrent.futures.process import BrokenProcessPool
from multiprocessing import connection as connection_lib

from beam_jobs import fork_server, malloc, spill, storage
from tfrecord_pipe._core import parent_watch, paths

IN_FLIGHT = 4  # tasks per worker submitted ahead, so none waits for the next

# Workers come from a fork server (fork_server.py says why); "fork" forks them from this
# process, for tests that patch a worker's code here.
START_METHOD = "forkserver"
# What workers run; none of it imports Beam (tests/test_worker_pool.py), whose import costs
# most of a CPU-second in the server.
JOB_MODULES = ("beam_jobs.local_workers", "tfrecord_pipe._tools.verify_workers")
REMOTE_MODULES = ("apache_beam.io.filesystems",)  # also, for a job with remote paths (gs://)


def processes() -> int:
    """Worker processes: one per core this process may use."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


class TooFewFilesError(ValueError):
    """This process may not open the files its worker processes need (`ulimit -n`)."""


def files_needed(count: int) -> int:
    """Files open at once in a launcher of `count` workers, with room: its pipes to each,
    and theirs to the server (measured: 2 workers failed below 16 files, 8 below 40, 16
    below 64; each failure said nothing of the limit)."""
    return 32 + 4 * count


def allow_files(count: int) -> None:
    """Raises this process's limit of open files to what `count` workers need, and room for
    a sort's merge of every run at once in it or a worker (`spill.FAN_IN`, a run a piece or
    a shard), where its hard limit allows (a process may raise its own; `ulimit -n` lowers
    both), before the workers and their server start: they inherit it. Under a lower hard
    limit the merges take more steps (`spill.fan_in`).

    Raises:
      TooFewFilesError: the hard limit is lower than the workers need; it says what to do.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = files_needed(count)
    wanted = needed + spill.FAN_IN + 1
    if soft == resource.RLIM_INFINITY or soft >= wanted:
        return
    if hard != resource.RLIM_INFINITY and hard < needed:
        raise TooFewFilesError(
            f"This process may open at most {hard} files at once (ulimit -n), and {count} "
            f"worker processes need about {needed}. Raise the limit (ulimit -n 1024) and run "
            "the command again."
        )
    wanted = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if wanted > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))


@contextlib.contextmanager
def pool(count: int, initializer, initargs: tuple = ()):
    """`count` worker processes, each set up by `initializer(*initargs)` (its arguments must
    pickle; nothing defined in the main script) in this process's environment, working
    folder and log levels; ended whatever happens: on an error or Ctrl-C the tasks not
    started are dropped, and a worker ends with this process. While it runs (the job's main
    loop), this process's objects from before are out of the garbage collector's reach.

    Raises:
      TooFewFilesError: this process may not open the files `count` workers need.
      OSError: the workers' server cannot start (fork_server.start).
    """
    allow_files(count)
    _start_server()
    forked = fork_server.CONTEXT if START_METHOD == "forkserver" else multiprocessing.get_context("fork")
    start = (fork_server.Launcher.now(), START_METHOD, initializer, initargs)
    workers = None
    failed = True
    try:
        # A Ctrl-C while a worker is forked from this process is raised in logging's fork
        # handler, where Python ignores it (and the job went on to the end): held back until
        # the workers are up, it stops the job.
        with ctrl_c_held():
            workers = Pool(count, forked, start)
        with malloc.objects_so_far_frozen():
            yield workers
        failed = False
    finally:
        # Held back here too: raised midway through the shutdown, it left the workers waiting
        # for work, and the process waiting for them at exit, for ever.
        with ctrl_c_held():
            if workers is not None:
                workers.close(stop_work=failed)


class Pool(futures.Executor):
    """Worker processes, each with a pipe of its own to this process: a worker that ends
    midway (killed by the OOM killer, or by hand) fails every task not done with
    BrokenProcessPool, whatever it was doing. (In Python's ProcessPoolExecutor the workers
    share one pipe for their answers, and a lock on it: a worker killed while sending left
    the pipe half written and the lock held, and the job waited for ever.)

    Tasks go out and answers come back as (kind, value) over each worker's pipe, written by
    one thread at a time (the lock); futures are resolved outside the lock, so that their
    callbacks may submit."""

    def __init__(self, count: int, context, start: tuple):
        self._lock = threading.Lock()
        self._waiting: collections.deque = collections.deque()  # (future, fn, args)
        self._running: dict = {}  # connection -> the future of its worker's task
        self._idle: list = []
        self._broken: BaseException | None = None
        self._closing = False
        self._workers: dict = {}  # connection -> process
        try:
            for _ in range(count):
                ours, theirs = context.Pipe()
                process = context.Process(target=_serve, args=(theirs, *start), daemon=True)
                process.start()
                theirs.close()  # so that the worker's end reads as closed once it ends
                self._workers[ours] = process
                self._idle.append(ours)
        except BaseException:
            self._end_workers()
            raise
        self._wake_reader, self._wake = context.Pipe(duplex=False)
        self._collector = threading.Thread(target=self._collect, name="worker-answers", daemon=True)
        self._collector.start()

    def submit(self, fn, /, *args, **kwargs) -> futures.Future:
        if kwargs:
            raise TypeError("worker tasks take positional arguments only")
        future: futures.Future = futures.Future()
        with self._lock:
            if self._broken is not None:
                raise BrokenProcessPool(str(self._broken)) from self._broken
            if self._closing:
                raise RuntimeError("the worker pool is closed")
            self._waiting.append((future, fn, args))
            outcomes = self._send_waiting()
        _resolve(outcomes)
        return future

    def close(self, stop_work: bool) -> None:
        """Ends the workers: at once if `stop_work`, else once their tasks are done; the
        tasks not done fail, those not started are cancelled."""
        with self._lock:
            self._closing = True
            stop_work = stop_work or self._broken is not None  # nothing it does is used
            waiting = [future for future, _, _ in self._waiting]
            self._waiting.clear()
            outcomes = self._fail_all(BrokenProcessPool("the worker pool was stopped")) if stop_work else []
            for connection in self._idle:  # a busy one is told when it answers
                with contextlib.suppress(OSError):
                    connection.send(None)
            self._idle.clear()
        for future in waiting:
            future.cancel()
        _resolve(outcomes)
        if stop_work:
            self._end_workers()
        else:
            for process in self._workers.values():
                process.join()
        self._wake.send(None)
        self._collector.join()
        with self._lock:
            outcomes = self._fail_all(BrokenProcessPool("the worker pool was closed"))
        _resolve(outcomes)
        for connection in (*self._workers, self._wake, self._wake_reader):
            connection.close()
        for process in self._workers.values():
            process.close()

    def _send_waiting(self) -> list:
        """Hands waiting tasks to idle workers (with the lock held); the futures to resolve."""
        outcomes = []
        while self._idle and self._waiting and self._broken is None:
            future, fn, args = self._waiting.popleft()
            if not future.set_running_or_notify_cancel():
                continue
            connection = self._idle.pop()
            try:
                connection.send((fn, args))
            except OSError:  # the worker has ended: its sentinel fails the task
                pass
            except Exception as err:  # the task does not pickle; nothing was sent
                self._idle.append(connection)
                outcomes.append((future, _FAILED, err))
                continue
            self._running[connection] = future
        return outcomes

    def _collect(self) -> None:
        """The collector thread: each answer to its future, then the worker's next task. A
        worker that ends breaks the pool, unless it was told to end; so does anything that
        goes wrong here, rather than leave a future unresolved."""
        try:
            self._collect_answers()
        except BaseException as err:
            with self._lock:
                outcomes = self._fail_all(BrokenProcessPool(f"the pool failed: {err!r}"))
            _resolve(outcomes)

    def _collect_answers(self) -> None:
        sentinels = {process.sentinel: connection for connection, process in self._workers.items()}
        ends = set(self._workers)
        while True:
            ready = connection_lib.wait([*ends, *sentinels, self._wake_reader])
            if self._wake_reader in ready:
                return
            for end in [end for end in ready if end in ends]:
                try:
                    kind, value = end.recv()
                except (EOFError, OSError):  # it ended, midway or not: its sentinel says how
                    ends.discard(end)
                    continue
                except Exception as err:  # read whole, but it does not unpickle
                    kind, value = _FAILED, WorkerError(f"its answer could not be read: {err!r}")
                self._answered(end, kind, value)
            for sentinel in [sentinel for sentinel in ready if sentinel in sentinels]:
                ended = sentinels.pop(sentinel)
                ends.discard(ended)
                with self._lock:  # told to end, and nothing under way: as it should
                    told = self._closing and ended not in self._running
                    outcomes = [] if told else self._fail_all(BrokenProcessPool(_ended(self._workers[ended])))
                _resolve(outcomes)

    def _answered(self, connection, kind: str, value) -> None:
        with self._lock:
            if kind == _NOT_STARTED:
                outcomes = self._fail_all(value)
            else:
                future = self._running.pop(connection, None)  # None: failed as the pool broke
                if self._closing or self._broken is not None:  # nothing more for it to do
                    with contextlib.suppress(OSError):
                        connection.send(None)
                    outcomes = []
                else:
                    self._idle.append(connection)
                    outcomes = self._send_waiting()
                if future is not None:
                    outcomes.append((future, kind, value))
        _resolve(outcomes)

    def _fail_all(self, error: BaseException) -> list:
        """Every task not done fails with `error`, and any submitted later (with the lock
        held); the futures to resolve."""
        if self._broken is None:
            self._broken = error
        pending = [*self._running.values(), *(future for future, _, _ in self._waiting)]
        self._running.clear()
        self._waiting.clear()
        return [(future, _FAILED, error) for future in pending]

    def _end_workers(self) -> None:
        """SIGTERM, then SIGKILL for those not ended END_S later (ignoring SIGTERM): one
        deadline for all. SIGCONT too: a stopped worker (SIGSTOP, a debugger) ends at once
        rather than at the deadline."""
        for process in self._workers.values():
            process.terminate()
            if process.exitcode is None:  # as terminate: never a pid that may be another's now
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signal.SIGCONT)
        deadline = time.monotonic() + END_S
        for process in self._workers.values():
            process.join(max(0.0, deadline - time.monotonic()))
        for process in self._workers.values():
            if process.exitcode is None:
                process.kill()
                process.join()


END_S = 5.0  # how long a worker told to end (SIGTERM) has before it is killed
_DONE, _FAILED, _NOT_STARTED = "done", "failed", "not started"  # the kinds of answer


def _resolve(outcomes: list) -> None:
    for future, kind, value in outcomes:
        with contextlib.suppress(futures.InvalidStateError):  # cancelled meanwhile
            if kind == _DONE:
                future.set_result(value)
            else:
                future.set_exception(value)


def _ended(process) -> str:
    code = process.exitcode
    if code is not None and code < 0:
        try:
            how = f"killed by {signal.Signals(-code).name}"
        except ValueError:
            how = f"killed by signal {-code}"
        if -code == signal.SIGKILL:
            how += ", as the out-of-memory killer does"
    else:
        how = f"exit code {code}"
    return f"a worker process was terminated abruptly ({how}); nothing it did is used"


def _serve(connection, launcher: fork_server.Launcher, start_method: str, initializer, initargs):
    """A worker: set up, then runs each task it is sent and answers (_DONE, result) or
    (_FAILED, error), until told to end (None) or its launcher ends."""
    try:
        _start(launcher, start_method, initializer, initargs)
    except BaseException as err:
        error = WorkerError(f"{type(err).__name__} while a worker started: {err}", traceback.format_exc())
        with contextlib.suppress(OSError):  # the launcher gone: nobody to tell
            connection.send((_NOT_STARTED, error))
        return
    while True:
        try:
            task = connection.recv()
        except EOFError:
            return
        except Exception as err:  # read whole, but it does not unpickle here
            task = (_unreadable, (f"the task could not be read in the worker: {err!r}",))
        if task is None:
            return
        fn, args = task
        try:
            answer = (_DONE, fn(*args))
        except BaseException as err:
            answer = (_FAILED, err)
        try:
            connection.send(answer)
        except OSError:  # the launcher is gone (its end closed): nobody to answer, nor to tell
            return
        except Exception as err:  # it does not pickle; nothing was sent
            with contextlib.suppress(OSError):  # the launcher gone meanwhile
                connection.send((_FAILED, WorkerError(
                    f"{type(answer[1]).__name__}, which cannot be sent back: {err}",
                    traceback.format_exc())))  # fmt: skip


def _unreadable(message: str):
    raise WorkerError(message, traceback.format_exc())


def start_server(remote: bool = False) -> None:
    """Starts the workers' fork server now (once per process): it imports JOB_MODULES (and
    REMOTE_MODULES for a job with `remote` paths, which would cost each worker Beam's import)
    while this process does its own work, and a pool started later finds it ready. Where it
    cannot start (too few files, no folder for its socket), nothing: `pool` tries again, and
    the job says why as it says its errors."""
    try:
        allow_files(processes())
        _start_server(remote)
    except (TooFewFilesError, OSError):
        return


def _start_server(remote: bool = False) -> None:
    if START_METHOD == "forkserver":
        with ctrl_c_held():  # SIGINT may reach another thread, which the block does not cover
            fork_server.start(JOB_MODULES + (REMOTE_MODULES if remote else ()))


def start_server_for(args: list[str]) -> None:
    """`start_server`, as a command with these arguments starts, before it imports Beam:
    unless they give the job to Beam's runner (or ask for help), where no pool runs."""
    if not any(word.startswith(("--runner", "--direct_", "-h", "--help")) for word in args):
        start_server(remote=any(paths.is_remote(word.partition("=")[2] or word) for word in args))


def _start(launcher: fork_server.Launcher, start_method: str, initializer, initargs) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the launcher's to handle
    parent_watch.exit_with_parent(os.getppid() if start_method == "forkserver" else None)
    launcher.restore()
    malloc.keep_large_buffers_in_mmap()
    initializer(*initargs)


@contextlib.contextmanager
def ctrl_c_held():
    """A Ctrl-C (SIGINT) during the block is held back, then handled as it would have been;
    so is a SIGTERM where Python handles it (the command's `convert.main`). (Python runs
    signal handlers in the main thread, whichever thread the signal reached: the handler is
    swapped, not the signal blocked.)"""
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread handles signals, and may set handlers
        return
    caught = []
    python_term = callable(signal.getsignal(signal.SIGTERM))
    held = (signal.SIGINT, signal.SIGTERM) if python_term else (signal.SIGINT,)
    previous = {
        signum: signal.signal(signum, lambda signum, frame: caught.append((signum, frame)))
        for signum in held
    }  # fmt: skip
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if caught:
            signum, frame = caught[0]
            if callable(previous[signum]):
                previous[signum](signum, frame)
            elif previous[signum] in (signal.SIG_DFL, None):
                os.kill(os.getpid(), signum)


class WorkerError(RuntimeError):
    """A worker's task failed: its error as `Type: message`, and its traceback. (The error
    itself may not survive the trip back: one that pickle cannot rebuild broke the pool,
    and a worker's FileNotFoundError or ValueError read as bad input, exit 2.)"""

    def __init__(self, message: str, worker_traceback: str = "", outage: bool = False):
        super().__init__(message, worker_traceback, outage)
        self.worker_traceback = worker_traceback
        self.outage = outage  # the storage failed (`storage.is_outage`, in the worker)

    def __str__(self) -> str:
        return self.args[0]


def in_worker(task):
    """A worker's task, whose errors come back as WorkerError."""

    @functools.wraps(task)
    def run(*args):
        try:
            return task(*args)
        except Exception as err:
            raise WorkerError(f"{type(err).__name__}: {err}", traceback.format_exc(),
                              storage.is_outage(err)) from None  # fmt: skip

    return run
