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
        self.asked = False
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
        if _installed is not None:
            _installed.uninstall()
        if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
            return "the program handles SIGTERM itself"
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
        logging.shutdown()  # (lines still buffered in handlers)
        sys.stdout.flush(), sys.stderr.flush()
        signal.raise_signal(signal.SIGTERM)  # delivered to this thread before it returns
        os._exit(128 + signal.SIGTERM)  # (not reached: the signal's default ends the process)

    def uninstall(self) -> None:
        """SIGTERM's default again (where the handler is still this one's); the watcher ends."""
        global _installed
        if _installed is self:
            _installed = None
        if self._pipe is None:
            return
        if signal.getsignal(signal.SIGTERM) == self._handle:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        read, write = self._pipe
        self._pipe = None
        self._settled.set()
        found = signal.set_wakeup_fd(-1)
        if found not in (write, -1):  # set since by another part of the program: theirs
            signal.set_wakeup_fd(found)
        try:
            os.write(write, _STOP)
        except OSError:
            pass
        self._watcher.join(timeout=5)
        os.close(write)
        os.close(read)

    def _handle(self, signum, frame) -> None:
        if not self._still_held(frame):
            log.warning("SIGTERM after training stopped: ending now")
            self.end()
        if not self.asked:
            log.warning("SIGTERM: saving after the step in flight, then ending")
        self.asked = True

    def _watch(self, read: int) -> None:
        while True:
            try:
                got = os.read(read, 64)
            except OSError:
                return
            if not got or _STOP in got:
                return
            if signal.SIGTERM in got:
                break
        if self._settled.wait(self._wait_s):
            return
        print(f"SIGTERM: no training step ended within {self._wait_s:.0f} s to save after; "
              "ending without a save (the run resumes from its last backup).",
              file=sys.stderr, flush=True)  # fmt: skip
        os._exit(128 + signal.SIGTERM)
