"""Keeps a worker's memory from growing with the number of images it has handled.

Every image read, decoded or re-encoded passes through buffers of hundreds of kilobytes that
live for milliseconds. glibc's malloc gives blocks that large their own mmap, returned to the
system when freed, but each such free raises the size limit for mmap (up to 32 MiB): after
the first few images the buffers come from the heap instead, between the small objects the
runner keeps per input, and a heap can only shrink from its top. Fixing the limit at its
default keeps large buffers in mmap: peak memory grows about half as fast with the number of
images, at the same speed (benchmarks/RESULTS.md, "Conversion: memory").
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import sys

# glibc's malloc.h: the mallopt parameter, and the limit glibc starts with.
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 128 << 10


def keep_large_buffers_in_mmap() -> bool:
    """Fixes glibc's mmap threshold at 128 KiB for this process; False where there is no glibc.

    Idempotent and cheap: DoFns call it in `setup`, on every worker.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # musl has a mallopt that does nothing; only glibc has this
        return bool(libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD))
    except (OSError, AttributeError):
        return False


@contextlib.contextmanager
def objects_so_far_frozen():
    """The objects that exist as a job starts out of the garbage collector's reach while it
    runs (`gc.freeze`), then back: the launcher's every full collection walked the modules'
    objects (Beam's, when the job uses it: benchmarks/RESULTS.md, "Conversion: peers"). Put back
    after, so that a long-lived caller's garbage from before is still collected then. Left
    as it is where objects are frozen already: by the caller (it may fork, and count on
    them), or by Python 3.12 itself (375 of its own tuples, from its start), whose
    collections then walk the modules as before."""
    if gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
