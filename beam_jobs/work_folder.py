"""A run's folder of temporary files (its sorts' runs, some 0.7 kB an input) that no run
outlives: removed as the run ends, and, where the run was killed before it could remove it
(SIGKILL, the kernel's OOM killer), by the next run that makes one in the same place.

A run holds a lock (flock) on a file in its folder for its whole life, which the kernel lets
go of however the process ends; making a folder, a run first removes those with its prefix
whose lock it can take. A folder gets its name only once its lock is held, so that no run
takes another's between its making and its lock. Folders without the lock file (made by an
older version, or where the filesystem has no locks) are never removed by another run.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import socket
import tempfile
from collections.abc import Iterator

LOCK_NAME = ".held-while-its-run-lives"
MAKING = ".making-"  # a folder's name until its lock is held


@contextlib.contextmanager
def work_folder(prefix: str, parent: str | None = None) -> Iterator[str]:
    """A new folder in `parent` (default: the system's temporary folder) named `prefix`, this
    machine's name and random characters, removed on leaving; those a killed run on this
    machine left there removed first."""
    parent = parent or tempfile.gettempdir()
    remove_orphans(prefix, parent)
    making = tempfile.mkdtemp(prefix=MAKING + _of_this_machine(prefix), dir=parent)
    held = None
    try:
        held = _hold(os.path.join(making, LOCK_NAME))
        folder = os.path.join(parent, os.path.basename(making)[len(MAKING) :])
        os.rename(making, folder)
        making = folder
        yield folder
    finally:
        shutil.rmtree(making, ignore_errors=True)  # under the lock: no other run takes it
        if held is not None:
            os.close(held)


def remove_orphans(prefix: str, parent: str) -> list[str]:
    """Removes the folders `work_folder(prefix)` made in `parent` on this machine whose run is
    gone; returns their paths."""
    prefix = _of_this_machine(prefix)
    try:
        with os.scandir(parent) as children:
            names = sorted(child.name for child in children if child.name.startswith(prefix))
    except OSError:  # the folder cannot be listed: making one in it says why
        return []
    removed = []
    for name in names:
        folder = os.path.join(parent, name)
        try:
            lock = os.open(os.path.join(folder, LOCK_NAME), os.O_RDWR | os.O_NOFOLLOW)
        except OSError:  # not a folder of this module's, not ours, or removed meanwhile
            continue
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # its run lives (or locks cannot tell: kept)
            os.close(lock)
            continue
        try:
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
        finally:
            os.close(lock)
    return removed


def _of_this_machine(prefix: str) -> str:
    """`prefix` with this machine's name: a run on another machine sharing the folder
    (network storage, where some mounts keep locks to each machine) is never judged gone."""
    return f"{prefix}{socket.gethostname()}-"


def _hold(path: str) -> int | None:
    """The lock on a new file at `path`, held by the returned descriptor; None (and no file)
    where the filesystem has no locks: that folder is then never another run's to remove."""
    lock = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(lock)
        os.remove(path)
        return None
    return lock
