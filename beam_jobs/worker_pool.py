"""Worker processes for the jobs that run on this machine without Beam's runner (the local
engine of the conversion, and `verify`): one per core, forked, ended whatever happens.

What every such pool needs, written once: a Ctrl-C is the launcher's alone, and is never
lost during a fork or the pool's shutdown; a worker ends with its launcher, even one killed
by SIGKILL; a worker's error comes back whole, as a `WorkerError`.
"""

from __future__ import annotations

import contextlib
import functools
import multiprocessing
import os
import signal
import threading
import traceback
from concurrent import futures

from beam_jobs import malloc
from tfrecord_pipe._core import parent_watch

IN_FLIGHT = 4  # tasks per worker submitted ahead, so none waits for the next


def processes() -> int:
    """Worker processes: one per core this process may use."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


@contextlib.contextmanager
def pool(count: int, initializer, initargs: tuple = ()):
    """`count` worker processes, forked (nothing to import again), each set up by
    `initializer(*initargs)`; ended whatever happens: on an error or Ctrl-C the tasks not
    started are dropped, and a worker ends with this process."""
    context = multiprocessing.get_context("fork")
    executor = futures.ProcessPoolExecutor(
        count, mp_context=context, initializer=_start, initargs=(initializer, initargs)
    )
    failed = True
    try:
        # Every worker is forked at the first task. A Ctrl-C during a fork is raised in
        # logging's fork handler, where Python ignores it (and the job went on to the end):
        # held back until the forks are done, it stops the job.
        with ctrl_c_held():
            executor.submit(int).result()
        yield executor
        failed = False
    finally:
        # Held back here too: raised midway through the shutdown, it left the workers waiting
        # for work, and the process waiting for them at exit, for ever.
        with ctrl_c_held():
            if failed:  # nothing they do now is used: a task under way is not waited for
                for process in list((getattr(executor, "_processes", None) or {}).values()):
                    process.terminate()
            executor.shutdown(wait=True, cancel_futures=True)


def _start(initializer, initargs) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the launcher's to handle
    parent_watch.exit_with_parent()
    malloc.keep_large_buffers_in_mmap()
    initializer(*initargs)


@contextlib.contextmanager
def ctrl_c_held():
    """A Ctrl-C (SIGINT) during the block is held back, then handled as it would have been.
    (Python runs signal handlers in the main thread, whichever thread the signal reached:
    the handler is swapped, not the signal blocked.)"""
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread handles signals, and may set handlers
        return
    caught = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: caught.append(frame))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if caught and callable(previous):
            previous(signal.SIGINT, caught[0])
        elif caught and previous in (signal.SIG_DFL, None):
            os.kill(os.getpid(), signal.SIGINT)


class WorkerError(RuntimeError):
    """A worker's task failed: its error as `Type: message`, and its traceback. (The error
    itself may not survive the trip back: one that pickle cannot rebuild broke the pool,
    and a worker's FileNotFoundError or ValueError read as bad input, exit 2.)"""

    def __init__(self, message: str, worker_traceback: str = ""):
        super().__init__(message, worker_traceback)
        self.worker_traceback = worker_traceback

    def __str__(self) -> str:
        return self.args[0]


def in_worker(task):
    """A worker's task, whose errors come back as WorkerError."""

    @functools.wraps(task)
    def run(*args):
        try:
            return task(*args)
        except Exception as err:
            raise WorkerError(f"{type(err).__name__}: {err}", traceback.format_exc()) from None

    return run
