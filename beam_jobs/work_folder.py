"""A run's folder of temporary files (its sorts' runs, the progress line's counts) that no run
outlives: removed as the run ends, and, where the run was killed before it could remove it
(SIGKILL, the kernel's OOM killer), by the next run that makes one in the same place.

A run holds a lock (flock) on a file in its folder for its whole life, which the kernel lets
go of however the process ends; making a folder, a run first removes those of its kind, made
on this machine, whose lock it can take. A folder gets its name only once its lock is held,
so that no run takes another's between its making and its lock; one left half-made (killed
in that instant) is removed once MAKING_STALE_S old. Folders not named exactly so, or without
the lock file (an older version's, or where the filesystem has no locks), are left alone.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import shutil
import socket
import tempfile
import time
from collections.abc import Iterator

LOCK_NAME = ".held-while-its-run-lives"
MAKING = ".making-"  # a folder's name until its lock is held
MAKING_STALE_S = 60.0  # a half-made folder this old was left by a run killed as it made it
_RANDOM = re.compile(r"[a-z0-9_]{8}")  # what tempfile.mkdtemp adds to a name
# The folders this process holds: never its own to sweep, even where locks do not tell one
# process's holders apart (on NFS, flock is a POSIX lock, which a process never conflicts with).
_HELD: set[str] = set()


@contextlib.contextmanager
def work_folder(prefix: str, parent: str | None = None) -> Iterator[str]:
    """A new folder in `parent` (default: the system's temporary folder) named `prefix`, this
    machine's name and random characters, removed on leaving (by this process, not one forked
    from it); those a killed run on this machine left there removed first."""
    parent = os.path.realpath(parent or tempfile.gettempdir())
    remove_orphans(prefix, parent)
    made = held = None
    owner = os.getpid()  # a process forked meanwhile leaves the folder to this one
    try:
        made = tempfile.mkdtemp(prefix=MAKING + _of_this_machine(prefix), dir=parent)
        held = _hold(os.path.join(made, LOCK_NAME))
        folder = os.path.join(parent, os.path.basename(made)[len(MAKING) :])
        os.rename(made, folder)
        made = folder
        _HELD.add(folder)
        yield folder
    finally:
        if os.getpid() == owner:
            _HELD.discard(made)
            if made is not None:
                shutil.rmtree(made, ignore_errors=True)  # under the lock: no other run takes it
        if held is not None:
            os.close(held)


def longest_name(prefix: str) -> str:
    """The name of a folder `work_folder(prefix)` gives, at its longest (mkdtemp adds 8)."""
    return _of_this_machine(prefix) + "x" * 8


def remove_orphans(prefix: str, parent: str) -> list[str]:
    """Removes the folders `work_folder(prefix)` made in `parent` on this machine whose run is
    gone; returns their paths."""
    own, parent = _of_this_machine(prefix), os.path.realpath(parent)
    try:
        with os.scandir(parent) as children:
            names = sorted(child.name for child in children)
    except OSError:  # the folder cannot be listed: making one in it says why
        return []
    removed = []
    for name in names:
        if os.path.join(parent, name) in _HELD:
            continue
        if name.startswith(own) and _RANDOM.fullmatch(name[len(own) :]):
            gone = _remove_if_free(os.path.join(parent, name), lock_needed=True)
        elif name.startswith(MAKING + own) and _RANDOM.fullmatch(name[len(MAKING + own) :]):
            gone = _stale(os.path.join(parent, name)) and _remove_if_free(
                os.path.join(parent, name), lock_needed=False)  # fmt: skip
        else:
            continue
        if gone:
            removed.append(os.path.join(parent, name))
    return removed


def _remove_if_free(folder: str, lock_needed: bool) -> bool:
    """Removes `folder` if its lock can be taken (or, unless `lock_needed`, it has none);
    returns whether it is gone."""
    lock_path = os.path.join(folder, LOCK_NAME)
    try:
        lock = os.open(lock_path, os.O_RDWR | os.O_NOFOLLOW)
    except FileNotFoundError:
        if lock_needed or os.path.islink(folder):
            return False
        lock = None  # half-made before its lock file was: nobody holds it
    except OSError:  # not a folder of this module's, or not this user's
        return False
    try:
        if lock is not None:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:  # its run lives (or locks cannot tell: kept)
        return False
    else:
        shutil.rmtree(folder, ignore_errors=True)  # (never follows a link)
        return not os.path.lexists(folder)
    finally:
        if lock is not None:
            os.close(lock)


def _stale(folder: str) -> bool:
    try:
        return time.time() - os.lstat(folder).st_mtime > MAKING_STALE_S
    except OSError:
        return False


def _of_this_machine(prefix: str) -> str:
    """`prefix` with this machine's name: a run on another machine sharing the folder
    (network storage, where some mounts keep locks to each machine) is never judged gone. A
    long name is cut and a digest of it added ("~" tells it from a name that is not cut),
    so that a socket's path in the folder fits (`fork_server`)."""
    name = re.sub(r"[^A-Za-z0-9._-]", "_", socket.gethostname())  # a name anyhow
    if len(name) > MACHINE_NAME_MOST:
        digest = hashlib.sha256(name.encode()).hexdigest()[:8]
        name = f"{name[: MACHINE_NAME_MOST - len(digest) - 1]}~{digest}"
    return f"{prefix}{name}-"


MACHINE_NAME_MOST = 24  # characters of a machine's name in a folder's name


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
