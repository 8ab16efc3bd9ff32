"""Worker processes that end with the process that started them.

Pools stop their workers only when told to: a parent killed with SIGKILL (the OOM killer, a
scheduler) left them running for ever, each holding its memory and a share of a core (Grain's
workers, the conversion's). Each worker calls `exit_with_parent` as it starts.
"""

from __future__ import annotations

import multiprocessing
import os
import threading

POLL_S = 1.0  # at most this long between the parent's end and the worker's


def exit_with_parent(forked_by: int | None = None) -> None:
    """Ends this multiprocessing worker within POLL_S of its parent's end (a no-op elsewhere).

    Two signs, either enough: the parent's sentinel (made before the worker started, so it
    also tells of a parent that died while the worker was starting; but a process the parent
    forked later holds it open), and a parent pid that is no longer the parent's: the pid of
    the process that forked this one, `forked_by` when not the parent itself (a fork server,
    which ends with the parent).
    """
    parent = multiprocessing.parent_process()
    if parent is None:  # not a multiprocessing child: nothing to watch
        return
    forked_by = forked_by or parent.pid

    def watch() -> None:
        while os.getppid() == forked_by and parent.is_alive():
            parent.join(POLL_S)  # returns early when the sentinel says it ended
        os._exit(1)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()
