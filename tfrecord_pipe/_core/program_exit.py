"""A command's exit that no thread a library left running can hold up.

Python waits at exit for every thread not marked daemon. Beam's runner, stopped mid-job by
Ctrl-C (a KeyboardInterrupt raised in its wait), can leave one running for ever: the command
printed that it was interrupted, then never ended. The entry points (`tfrecord-pipe`, `python
-m beam_jobs.convert`) run through `run`.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import sys
import threading
import time
from typing import Callable, NoReturn

from tfrecord_pipe._core import extras

INTERRUPTED = 130  # a command's exit on Ctrl-C, as a shell gives it

GRACE_S = 5.0  # what other threads get to end once the command is done
HOOKS_S = 10.0  # and then the exit hooks (the workers' fork server's end waits up to 5 s)
STOP_GRACE_S = 10.0  # what a stopped command gets to clean up before its children are ended


def run(main: Callable[[], int | None]) -> NoReturn:
    """Runs a command's `main` and exits with its code (130 on Ctrl-C, saying so; 2 with one
    line where a package it needs is not installed), however it ends: any other exception
    leaves through Python's own report, with code 1, but a path this user may not read or
    write, said in one line, code 2."""
    try:
        code = main()
    except SystemExit as done:  # argparse's --help and errors
        code = done.code
    except KeyboardInterrupt:  # before main's own handling (its imports)
        code = interrupted()
    except ModuleNotFoundError as err:
        said = extras.missing(err.name)
        if said is None:
            _cut_short_if_stuck(1)
            raise
        print(f"error: {said}", file=sys.stderr)
        code = 2
    except BaseException as err:
        said = _denied(err)
        if said is None:
            _cut_short_if_stuck(1)
            raise
        print(f"error: {said}", file=sys.stderr)
        code = 2
    leave(code)


def _denied(err: BaseException) -> str | None:
    """A file or folder this user may not read or write (Python's error, or TensorFlow's
    for a path it opened), in words; None for any other error. Whichever step met it, its
    message names the path, and a traceback says nothing more."""
    if isinstance(err, PermissionError) and err.filename:  # (no path: a bug, traced)
        said = f"{err.filename}: {err.strerror or err}"
    elif type(err).__name__ == "PermissionDeniedError" and type(err).__module__.startswith(
        "tensorflow"
    ):  # (TensorFlow's message names the path: "o1/manifest.json; Permission denied")
        said = getattr(err, "message", None) or str(err)
    else:
        return None
    return (f"{said}. This user may not read or write it: give them the right to (chmod, "
            "chown), or give another path.")  # fmt: skip


@contextlib.contextmanager
def signals_as_interrupts():
    """Ctrl-C and SIGTERM (a scheduler's stop, a preempted VM's shutdown) raise
    KeyboardInterrupt in the main thread, so that a command cleans up and says which stopped
    it; yields the list of the signals received (`stopped_by`). Only where the signal would
    end the program anyway: not where it is ignored (SIGINT in a job started in the
    background) or handled by the caller, nor outside the main thread."""
    received, done, ending = [], threading.Event(), threading.Lock()

    def interrupt(signum, frame):
        if done.is_set():  # the watch's signal, come as the block ended: nothing to stop
            return
        if not received:
            threading.Thread(target=_unstick, args=(signum, done, ending), name="stop-watch",
                             daemon=True).start()  # fmt: skip
        received.append(signum)  # Beam may wrap the KeyboardInterrupt in its own error
        raise KeyboardInterrupt

    main_thread = threading.current_thread() is threading.main_thread()
    defaults = {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: signal.SIG_DFL}
    previous = {
        signum: signal.signal(signum, interrupt) for signum, default in defaults.items()
        if main_thread and signal.getsignal(signum) is default
    }  # fmt: skip
    try:
        yield received
    finally:
        done.set()
        with ending:  # a signal the watch is sending comes (and is let pass) before the
            pass  # handlers go back: the default one would end the process
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _unstick(signum: int, done: threading.Event, ending: threading.Lock) -> None:
    """Once a stopped command has had STOP_GRACE_S to clean up and is still at it, its child
    processes are ended (SIGTERM, then SIGKILL); still at it STOP_GRACE_S later, its main
    thread is interrupted again. Beam's runner, stopped while its worker processes started,
    waited for them for ever, and renewed the output's claim all the while: one Ctrl-C or
    SIGTERM in three hung (a helper's trial; a second Ctrl-C freed it, a scheduler's one
    SIGTERM never did). A clean-up of its own (the workers' pool, the claim given up) takes
    seconds, and is not cut short."""
    if done.wait(STOP_GRACE_S):
        return
    for sent in (signal.SIGTERM, signal.SIGKILL):
        children = _children()  # (again before SIGKILL: a pid reaped since may be reused)
        if not children:
            break
        for pid in children:
            with contextlib.suppress(OSError):
                os.kill(pid, sent)
        if done.wait(2.0):
            return
    if done.wait(STOP_GRACE_S):
        return
    with ending:
        if not done.is_set():  # a signal itself: a simulated one wakes no blocked wait
            signal.pthread_kill(threading.main_thread().ident, signum)


def _children() -> list[int]:
    """This process's child processes (Linux's /proc; none found elsewhere): when a command
    is stopped, all of them are its own work (the job's workers)."""
    found = []
    with contextlib.suppress(OSError):
        for task in os.listdir("/proc/self/task"):
            with contextlib.suppress(OSError), open(f"/proc/self/task/{task}/children") as f:
                found += [int(pid) for pid in f.read().split()]
    return found


def stopped_by(received: list[int]) -> tuple[str, int]:
    """What stopped a command (`signals_as_interrupts`), said, and its exit code: SIGTERM's
    143, Ctrl-C's 130."""
    if signal.SIGTERM in received:
        return "terminated (SIGTERM)", 128 + signal.SIGTERM
    return "interrupted", INTERRUPTED


def interrupted() -> int:
    """Says a command was interrupted (Ctrl-C), in one line; its exit code."""
    print("\nerror: interrupted.", file=sys.stderr)
    return INTERRUPTED


def leave(code: int | str | None) -> NoReturn:
    """Exits with `code` as `sys.exit` does (other threads waited for, exit hooks run); but
    where a thread is still running GRACE_S from now, the exit would wait for it for ever:
    then the hooks are run and the process ends without it."""
    _cut_short_if_stuck(code)
    if threading.current_thread() is threading.main_thread():
        # The command is done. A second Ctrl-C cut its exit hooks short (a traceback, and the
        # workers' sockets folder left in TMPDIR); what is left ends within GRACE_S + HOOKS_S.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.exit(code)


def _cut_short_if_stuck(code: int | str | None) -> None:
    status = code if isinstance(code, int) else 0 if code is None else 1
    main = threading.main_thread()

    def watch():
        time.sleep(GRACE_S)
        me = threading.current_thread()
        stuck = [thread for thread in threading.enumerate()
                 if thread not in (main, me) and not thread.daemon]  # fmt: skip
        if stuck:  # the exit waits on them, and would run its hooks only after
            atexit._run_exitfuncs()
        else:  # the exit is running its hooks: they get their time
            time.sleep(HOOKS_S)
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):  # a closed pipe: nothing more can be said there
                pass
        os._exit(status)

    threading.Thread(target=watch, name="exit-watch", daemon=True).start()
