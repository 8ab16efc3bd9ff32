"""Worker processes forked from a server process that has imported the job's modules and
runs no other thread (multiprocessing's "forkserver", as Python 3.14 does by default).

Forked from the launcher, a worker inherited every lock as the launcher's threads held it at
that instant, and nothing in the worker ever let it go: verify on gs:// hung for ever on a
lock google-auth holds while a Cloud Storage request of another thread copies its session.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import logging
import os
import pickle
import signal
import sys
import tempfile
import threading
import time
from concurrent.futures.process import BrokenProcessPool
from multiprocessing import (context, forkserver, popen_forkserver, reduction, resource_tracker,
                             spawn, util)

from beam_jobs import work_folder


def start(modules) -> None:
    """Starts the server, once per process, with `modules` imported so that each worker
    starts without importing them again. SIGINT is blocked while it starts: the server and
    its workers keep it blocked (Ctrl-C is the launcher's), and one sent meanwhile reaches
    this process once unblocked."""
    # The server must import from this process's module path, not from the working folder
    # (Python 3.11 starts it with `-c`, which puts the folder first and drops the path it is
    # given): a proto.py where the user stood was imported in Beam's place. Under `python -E`
    # the environment cannot say so, and the server imports nothing: each worker imports
    # for itself, from this process's path.
    preload = [] if sys.flags.ignore_environment else [*modules, "beam_jobs.fork_server_freeze"]
    forkserver.set_forkserver_preload(preload)
    path = os.pathsep.join(_module_path())
    with _STARTING, _in_a_folder_that_exists(), _environment(PYTHONSAFEPATH="1", PYTHONPATH=path):
        _make_socket_folder()
        # Started first: the server's start starts it, and its own start unblocks SIGINT in
        # this thread once done, so that the server started with Ctrl-C open (a Ctrl-C then
        # printed the server's KeyboardInterrupt, or broke the pool).
        resource_tracker.ensure_running()
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            forkserver.ensure_running()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


_STARTING = threading.Lock()  # one thread at a time sets the environment the server gets
SOCKET_PATH_MOST = 107  # bytes in a Unix socket's path (sun_path's 108, less its NUL)
# multiprocessing's sockets lie in a folder it makes in TMPDIR once a process, the server's
# "TMPDIR/pymp-XXXXXXXX/listener-XXXXXXXX".
SOCKET_BELOW_TEMP = len("/pymp-XXXXXXXX/listener-XXXXXXXX")
SHORT_TEMP = ("/tmp", "/var/tmp", "/dev/shm")  # where it goes when TMPDIR is too long for that
SOCKETS_PREFIX = "tfrecord-pipe-sockets-"  # the work folder it goes in (`work_folder`)
END_S = 5.0  # how long the server has to end as this process exits


def stop() -> None:
    """Ends the server and waits for it (END_S at most); the next `start` starts another.
    Not while a pool of its workers runs: the server ends only after its workers.

    Run as this process exits, after multiprocessing has ended its daemon workers: nothing
    of the command outlives it, and the server's CPU time and its workers' (which it waited
    for) count as this process's children's, as `time` and a benchmark read them. Left to
    end on its own, it was nobody's child: a conversion's workers' time went uncounted. In a
    process forked from the launcher it does nothing: the server is not its child."""
    server = forkserver._forkserver
    with _STARTING, getattr(server, "_lock", contextlib.nullcontext()):
        pid = getattr(server, "_forkserver_pid", None)
        alive = getattr(server, "_forkserver_alive_fd", None)
        if pid is None or alive is None:  # not started, or another Python's private names
            return
        try:
            ended = os.waitpid(pid, os.WNOHANG) != (0, 0)
        except ChildProcessError:  # forked from the launcher: its server, not this one's
            return
        try:
            os.close(alive)  # the server's sign to end, once its workers hold it no more
            deadline = time.monotonic() + END_S
            while not ended and time.monotonic() < deadline:
                time.sleep(0.005)
                ended = os.waitpid(pid, os.WNOHANG) != (0, 0)
        finally:
            address = server._forkserver_address
            if address and not util.is_abstract_socket_namespace(address):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(address)
            # Forgotten, even one that did not end in time: the next start makes another.
            server._forkserver_alive_fd = server._forkserver_pid = None
            server._forkserver_address = None


# After multiprocessing's exit step has ended the daemon processes (a pool still open at
# exit, say): their copies of the server's pipe kept it running, and the wait took END_S.
util.Finalize(None, stop, exitpriority=-100)


def _make_socket_folder() -> None:
    """Has multiprocessing make its folder for sockets (once a process) inside a work folder
    of this process's life (`work_folder`), in TMPDIR or, where TMPDIR is too long for a
    socket's path, in the first writable SHORT_TEMP. Its own "TMPDIR/pymp-*" stayed behind
    each run killed by SIGKILL; a work folder goes with the next run. Under a TMPDIR of over
    75 bytes (a cluster job's own, a test's) every conversion and verify failed with
    "OSError: AF_UNIX path too long", on Pythons without a fallback of their own (CPython
    gh-132124). Run under _STARTING, as the launcher starts (tempfile's folder is the work
    folder for that instant, and no other thread of ours makes files then).

    Raises:
      OSError: TMPDIR is too long, and no SHORT_TEMP can be used instead.
    """
    most = SOCKET_PATH_MOST - SOCKET_BELOW_TEMP  # bytes of the path of multiprocessing's folder
    temp = tempfile.gettempdir()
    usable = (folder for folder in SHORT_TEMP if os.access(folder, os.W_OK | os.X_OK))
    # Measured as resolved: a work folder's path is (a TMPDIR through a link is longer).
    resolved = (os.path.realpath(folder) for folder in (temp, *filter(os.path.isdir, usable)))
    fitting = [folder for folder in resolved if len(os.fsencode(folder)) <= most]
    if not fitting:
        raise OSError(f"TMPDIR={temp} is too long for the worker processes' sockets (a socket's "
                      f"path has at most {SOCKET_PATH_MOST} bytes), and none of "
                      f"{', '.join(SHORT_TEMP)} is a writable folder. Set TMPDIR to a writable "
                      f"folder whose path has at most {most} bytes.")  # fmt: skip
    held = contextlib.ExitStack()
    parent = fitting[0]
    name_most = len(os.fsencode(work_folder.longest_name(SOCKETS_PREFIX)))
    roomy = [folder for folder in fitting if len(os.fsencode(folder)) + 1 + name_most <= most]
    if roomy:  # (else, in a long TMPDIR: multiprocessing's folder as it was)
        parent = held.enter_context(work_folder.work_folder(SOCKETS_PREFIX, roomy[0]))
    before, tempfile.tempdir = tempfile.tempdir, parent
    try:
        made = util.get_temp_dir()  # made now in `parent`, and kept for this process's life
    finally:
        tempfile.tempdir = before
    if os.path.dirname(made) == parent:
        # Removed at exit after multiprocessing's own folder in it (exitpriority -100).
        util.Finalize(None, held.close, exitpriority=-101)
        return
    held.close()  # this process made its folder before, and keeps it
    if len(os.fsencode(made)) > most + len("/pymp-XXXXXXXX"):  # made in a long TMPDIR
        raise OSError(f"This process's folder for sockets, {made}, was made in TMPDIR before "
                      f"the job started, and is too long for a socket's path (at most "
                      f"{SOCKET_PATH_MOST} bytes). Set TMPDIR to a folder whose path has at most "
                      f"{most} bytes before the process starts.")  # fmt: skip


def _module_path() -> list[str]:
    """sys.path, its "" (the working folder, for `python -c` and `-m`) spelled out; less
    folders whose names hold os.pathsep, which PYTHONPATH cannot say (the workers still get
    the whole path)."""
    here = _working_folder()
    return [entry for entry in (entry or here for entry in sys.path) if entry and os.pathsep not in entry]


@contextlib.contextmanager
def _environment(**values: str):
    """os.environ with `values` while the block runs (what a process started then gets)."""
    before = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


class _WorkerPopen(popen_forkserver.Popen):
    """Starts a worker from the fork server as multiprocessing does, less one step: the
    launcher's main script is not run again in the worker. (A spawned or fork server's child
    runs it to find what was pickled from `__main__`; our workers get nothing from there, and
    a script calling `convert.run` without `if __name__ == "__main__":` converted again in
    each worker.)"""

    def _launch(self, process_obj):
        with _in_a_folder_that_exists():
            setup = spawn.get_preparation_data(process_obj._name)
        setup.pop("init_main_from_name", None)
        setup.pop("init_main_from_path", None)
        message = io.BytesIO()
        context.set_spawning_popen(self)  # pickling may hand file descriptors to the child
        try:
            reduction.dump(setup, message)
            reduction.dump(process_obj, message)
        finally:
            context.set_spawning_popen(None)
        try:
            self.sentinel, to_child = forkserver.connect_to_new_process(self._fds)
            # The child's sign that this process lives: a copy of its pipe's write end, open
            # until this process ends.
            self.finalizer = util.Finalize(self, util.close_fds, (os.dup(to_child), self.sentinel))
            with open(to_child, "wb", closefd=True) as pipe:
                pipe.write(message.getbuffer())
            self.pid = forkserver.read_signed(self.sentinel)
        except (EOFError, OSError) as err:  # the server has ended, as it started or since
            raise BrokenProcessPool(
                f"the server that starts the worker processes has ended ({err!r}); what it "
                "said as it ended, if anything, is printed above"
            ) from err


class _WorkerProcess(context.ForkServerProcess):
    _Popen = _WorkerPopen


class _FromServer(context.ForkServerContext):
    Process = _WorkerProcess


CONTEXT = _FromServer()  # the multiprocessing context for a pool of such workers


@dataclasses.dataclass(frozen=True)
class Launcher:
    """What a forked worker had from its launcher and a fork server's does not: the
    environment (the Cloud Storage endpoint, TMPDIR), the working folder (relative paths;
    None once removed), the log levels and the log lines' formatter."""

    environ: dict
    cwd: str | None
    levels: dict
    formatter: logging.Formatter | None

    @classmethod
    def now(cls) -> "Launcher":
        loggers = logging.root.manager.loggerDict.values()
        levels = {log.name: log.level for log in loggers if isinstance(log, logging.Logger)}
        levels[""] = logging.root.level
        formatter = next((h.formatter for h in logging.root.handlers if h.formatter), None)
        try:
            pickle.dumps(formatter)
        except Exception:  # a formatter of the user's making: the workers log plainly
            formatter = None
        return cls(dict(os.environ), _working_folder(), levels, formatter)

    def restore(self) -> None:
        os.environ.clear()
        os.environ.update(self.environ)
        tempfile.tempdir = None  # found again from the environment
        if self.cwd is not None:
            os.chdir(self.cwd)
        for name, level in self.levels.items():
            logging.getLogger(name or None).setLevel(level)
        if self.formatter is not None and not logging.root.handlers:
            handler = logging.StreamHandler()
            handler.setFormatter(self.formatter)
            logging.root.addHandler(handler)


def _working_folder() -> str | None:
    try:
        return os.getcwd()
    except FileNotFoundError:  # removed while this process ran in it
        return None


@contextlib.contextmanager
def _in_a_folder_that_exists():
    """In "/" while the block runs if the working folder was removed (multiprocessing
    records it for the child, and fails), then back in it."""
    if _working_folder() is not None:
        yield
        return
    removed = os.open(".", os.O_RDONLY)
    try:
        os.chdir("/")
        yield
    finally:
        os.fchdir(removed)
        os.close(removed)
