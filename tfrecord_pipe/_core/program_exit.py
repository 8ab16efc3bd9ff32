"""A command's exit that no thread a library left running can hold up.

Python waits at exit for every thread not marked daemon. Beam's runner, stopped mid-job by
Ctrl-C (a KeyboardInterrupt raised in its wait), can leave one running for ever: the command
printed that it was interrupted, then never ended. The entry points (`tfrecord-pipe`, `python
-m beam_jobs.convert`) end through `leave`.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from typing import NoReturn

GRACE_S = 5.0  # what other threads get to end on their own once the command is done


def leave(code: int) -> NoReturn:
    """Exits with `code`; threads still running GRACE_S after the command ended are left
    behind (the process ends without them), as the command's own work is over."""
    others = [t for t in threading.enumerate()
              if t is not threading.main_thread() and not t.daemon]  # fmt: skip
    deadline = time.monotonic() + GRACE_S
    for thread in others:
        thread.join(max(0.0, deadline - time.monotonic()))
    if any(thread.is_alive() for thread in others):
        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):  # a closed pipe: nothing more can be said there
                pass
        os._exit(code)
    sys.exit(code)
