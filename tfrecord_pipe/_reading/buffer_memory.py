"""What a training pipeline's shuffle buffer holds in memory, warned of before it fills.

The buffer is sized in records, and holds them encoded: 10,000 records of 20 KB JPEGs are
200 MB, of 9.6 MB photos kept at their size 96 GB. Filling it, a process was killed by the
system for want of memory after a minute and a half, without a word (a helper's trial).
A record's size is taken from the first record of the first file (its 8-byte length): one
small read, and enough to see a buffer that cannot fit.
"""

from __future__ import annotations

import functools
import gzip
import logging
import os
import struct

import tensorflow as tf

from tfrecord_pipe._core import naming

log = logging.getLogger(__name__)

SHARE_OF_MEMORY = 0.5  # a buffer estimated to hold more of the machine's memory is warned of
ADVISED_SHARE = 0.1  # the buffer the warning advises holds about this much

_SAID: set = set()  # (files, buffer) warned of in this process


def warn_if_too_large(files: tuple[str, ...], compression: str, buffer: int) -> None:
    """Warns, once, where `buffer` records of the size of the first of `files` would hold more
    than half of this machine's memory, saying what to give instead."""
    record = first_record_bytes(files, compression)
    memory = machine_bytes()
    if not record or not memory or buffer * record <= SHARE_OF_MEMORY * memory:
        return
    if (files, buffer) in _SAID:
        return
    _SAID.add((files, buffer))
    advised = max(1, int(ADVISED_SHARE * memory // record))
    log.warning(
        "The shuffle buffer of %d records would hold about %.1f GB of encoded images (%.1f MB a "
        "record, as the first of %s), more than half of this machine's %.1f GB: the process may "
        "be killed for want of memory. Give shuffle_buffer=%d or less, or convert again with "
        "--max_side to store smaller images.",
        buffer, buffer * record / 1e9, record / 1e6, files[0], memory / 1e9, advised,
    )  # fmt: skip


@functools.lru_cache(maxsize=64)
def first_record_bytes(files: tuple[str, ...], compression: str) -> int | None:
    """The length of the first record of the first of `files`; None where it cannot be read
    (no file, an empty one, a storage error: the pipeline says those itself). Read once a
    process for each list of files, however many training pipelines are built over it."""
    if not files:
        return None
    try:
        with tf.io.gfile.GFile(files[0], "rb") as raw:
            f = gzip.GzipFile(fileobj=raw) if compression == naming.GZIP else raw
            head = f.read(8)
    except (OSError, tf.errors.OpError, EOFError):
        return None
    return struct.unpack("<Q", head)[0] if len(head) == 8 else None


def machine_bytes() -> int | None:
    """This machine's physical memory; None where the system does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None
