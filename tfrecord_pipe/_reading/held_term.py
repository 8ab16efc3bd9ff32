"""SIGTERM held until a training step ends, so that the run can save where it is first.

A spot or preemptible VM's first notice is SIGTERM, some 30 s before it is stopped; by default
it ends the process at once, and the steps since the last backup are trained again. Held, it
is noted, the step in flight ends, the caller saves, then ends the process with SIGTERM as it
would have ended (`end`): nothing after it runs, as before.

A signal's Python handler runs only once the main thread is back in Python: a step that never
ended (a hang) would hold SIGTERM for ever. A watcher thread hears the signal where the
handler cannot (the C handler writes its number to a wakeup pipe), and ends the process
with exit status 128 + SIGTERM if no save has begun WAIT_S after it.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)

WAIT_S = 60.0  # for the step in flight to end and its save to begin
_STOP = b"\0"  # (no signal's number: the watcher's sign to end)
_installed: HeldTerm | None = None  # (one left installed by a loop that ended by an error)


class HeldTerm:
    """SIGTERM noted (`asked`) instead of ending the process, while `install`ed.

    Args:
      still_held: called in the handler with the interrupted frame; False where the code
        that would save is no longer running (its loop ended by an error), and the process
        then ends at once, as by default.
      wait_s: how long the watcher waits for `saving` after SIGTERM.
    """

    def __init__(self, still_held: Callable[[object], bool], wait_s: float = WAIT_S):
        self._still_held, self._wait_s = still_held, wait_s
        self.asked = False  # the handler ran
        self._heard = False  # the watcher read the signal's number (the handler may not run)
        self._pid = os.getpid()
        self._settled = threading.Event()  # a save began, or SIGTERM is no longer held
        self._pipe: tuple[int, int] | None = None
        self._watcher: threading.Thread | None = None

    def install(self) -> str | None:
        """Holds SIGTERM from now; returns why it cannot instead (None where it is held): not
        in the main thread, a SIGTERM handler of the program's own, or a wakeup pipe in use
        (an event loop's), each of which is left as it is."""
        global _installed
        if threading.current_thread() is not threading.main_thread():
            return "training runs outside the main thread, where no signal handler can be set"
        if _installed is not None and _installed.uninstall():
            # Left by a loop that ended by an error after SIGTERM came: it ends the process now.
            log.warning("SIGTERM came during a training that then failed: ending now")
            _end_by_sigterm()
        if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
            return "the program handles (or ignores) SIGTERM itself"
        read, write = os.pipe()
        os.set_blocking(write, False)  # (as set_wakeup_fd requires)
        try:
            before = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
        except ValueError as err:  # (an fd it will not take)
            os.close(read), os.close(write)
            return f"no wakeup pipe can be set ({err})"
        if before != -1:
            signal.set_wakeup_fd(before)
            os.close(read), os.close(write)
            return "another part of the program (an event loop) listens for signals"
        self._pipe = (read, write)
        self._watcher = threading.Thread(target=self._watch, args=(read,), name="held-sigterm",
                                         daemon=True)  # fmt: skip
        self._watcher.start()
        signal.signal(signal.SIGTERM, self._handle)
        _installed = self
        return None

    def saving(self) -> None:
        """A save has begun: the watcher no longer ends the process."""
        self._settled.set()

    def end(self) -> None:
        """Ends the process as SIGTERM would have ended it, had it not been held."""
        self.uninstall()
        _end_by_sigterm()

    def uninstall(self) -> bool:
        """SIGTERM's default again (where the handler is still this one's); the watcher ends.
        Returns whether SIGTERM came while it was held (its handler may not have run yet: the
        caller then ends the process, or the signal would be lost)."""
        global _installed
        if _installed is self:
            _installed = None
        if self._pipe is None:
            return self.asked
        read, write = self._pipe
        self._pipe = None
        self._settled.set()
        self._give_back_signals(write)
        try:
            os.write(write, _STOP)
        except OSError:
            pass
        self._watcher.join(timeout=5)
        os.close(write)
        os.close(read)
        return self.asked or self._heard

    def _give_back_signals(self, write: int) -> None:
        """SIGTERM's default, where the handler is still this one's, and no wakeup pipe, where
        it is still this one's (one set since by another part of the program is theirs)."""
        if signal.getsignal(signal.SIGTERM) == self._handle:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        found = signal.set_wakeup_fd(-1)
        if found not in (write, -1):
            signal.set_wakeup_fd(found)

    def _handle(self, signum, frame) -> None:
        if os.getpid() != self._pid:  # a process forked meanwhile: SIGTERM ends it, as by default
            _end_by_sigterm()
        if not self._still_held(frame):
            log.warning("SIGTERM after training stopped: ending now")
            self.end()
        if not self.asked:
            log.warning("SIGTERM: held until the step in flight ends")
        self.asked = True

    def _watch(self, read: int) -> None:
        while True:
            try:
                got = os.read(read, 64)
            except OSError:
                return
            if signal.SIGTERM in got:
                self._heard = True
                break
            if not got or _STOP in got:
                return
        # Not where the program has set a handler of its own since (this hold was left by a
        # loop that ended by an error): the signal is the program's to handle.
        if self._settled.wait(self._wait_s) or signal.getsignal(signal.SIGTERM) != self._handle:
            return
        print(f"SIGTERM: training reached no step's end within {self._wait_s:.0f} s (a hung "
              "step, or training left by an error): ending without a save; the run resumes "
              "from its last backup.", file=sys.stderr, flush=True)  # fmt: skip
        os._exit(128 + signal.SIGTERM)


# A process forked while SIGTERM is held gets SIGTERM's default, and neither writes nor reads
# the parent's pipe: a child's SIGTERM woke the parent's watcher, and the child outlived it.
# SIGTERM is blocked in the forking thread across the fork, so that one sent to the child
# before it lets go of the handler waits, then ends it.
_mask_before_fork: set | None = None


def _before_fork() -> None:
    global _mask_before_fork
    if _installed is not None:
        _mask_before_fork = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})


def _after_fork_in_parent() -> None:
    global _mask_before_fork
    if _mask_before_fork is not None:
        mask, _mask_before_fork = _mask_before_fork, None
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def _end_by_sigterm() -> None:
    logging.shutdown()  # (lines still buffered in handlers)
    sys.stdout.flush(), sys.stderr.flush()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.raise_signal(signal.SIGTERM)  # delivered to this thread before it returns
    os._exit(128 + signal.SIGTERM)  # (not reached: the signal's default ends the process)


def _forget_in_child() -> None:
    global _installed, _mask_before_fork
    held, _installed = _installed, None
    mask, _mask_before_fork = _mask_before_fork, None
    if held is not None and held._pipe is not None:
        read, write = held._pipe
        held._pipe = None
        try:
            held._give_back_signals(write)
        except ValueError:  # not this child's main thread: the handler ends it by its pid
            pass
        os.close(read)
        os.close(write)
    if mask is not None:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent,
                    after_in_child=_forget_in_child)  # fmt: skip
