"""A command's exit that no thread a library left running can hold up.

Python waits at exit for every thread not marked daemon. Beam's runner, stopped mid-job by
Ctrl-C (a KeyboardInterrupt raised in its wait), can leave one running for ever: the command
printed that it was interrupted, then never ended. The entry points (`tfrecord-pipe`, `python
-m beam_jobs.convert`) run through `run`.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Callable, NoReturn

GRACE_S = 5.0  # how long the exit may take (other threads ending, exit hooks) before it is cut


def run(main: Callable[[], int | None]) -> NoReturn:
    """Runs a command's `main` and exits with its code (130 on Ctrl-C, saying so), however it
    ends: an exception leaves through Python's own report, with code 1."""
    try:
        code = main()
    except SystemExit as done:  # argparse's --help and errors
        code = done.code
    except KeyboardInterrupt:
        print("\nerror: interrupted.", file=sys.stderr)
        code = 130
    except BaseException:
        leave_within_grace(1)
        raise
    leave(code)


def leave(code: int | str | None) -> NoReturn:
    """Exits with `code` as `sys.exit` does (exit hooks run, other threads are waited for),
    but ends the process after GRACE_S if that exit is still waiting then."""
    leave_within_grace(code)
    sys.exit(code)


def leave_within_grace(code: int | str | None) -> None:
    """Ends this process GRACE_S from now, with `code`, if it has not ended by then."""
    status = code if isinstance(code, int) else 0 if code is None else 1

    def cut_short():
        time.sleep(GRACE_S)
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):  # a closed pipe: nothing more can be said there
                pass
        os._exit(status)

    threading.Thread(target=cut_short, name="exit-grace", daemon=True).start()
