"""What becomes of one input: the image to store, or the reason it is rejected.

One function decides, in one order (a problem found at listing, no label, a label not in the
list, unreadable, then the image checks), for the job's `LoadImages` and for `verify`, which
must reach the conversion's verdict on every input. No Beam in it: it is plain Python over the
listing's `SourceFile` and the bytes read.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable, Container

from beam_jobs import storage
from beam_jobs.source_file import SourceFile
from tfrecord_pipe._core import images, messages

LOG = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Outcome:
    """One input's fate.

    Attributes:
      data: the input's bytes, as read (b"" when it was not read).
      stored: the image to store, when the input is used.
      reason, detail: why it is rejected, when it is not.
    """

    data: bytes = b""
    stored: images.StoredImage | None = None
    reason: str | None = None
    detail: str = ""


def refused_unread(source: SourceFile, labels: Container[str]) -> Outcome | None:
    """The rejection decided without reading the input (its listing's problem, its label),
    or None: then it is read."""
    if source.problem is not None:
        return Outcome(reason=source.problem[0], detail=source.problem[1])
    if source.label is None:
        return Outcome(reason=images.NO_LABEL, detail="the input gives no label for this file")
    if source.label not in labels:
        return Outcome(
            reason=images.UNKNOWN_LABEL, detail=f"label {source.label!r} is not in the labels file"
        )
    return None


def decide(
    source: SourceFile,
    labels: Container[str],
    policy: images.ImagePolicy,
    read: Callable[[], bytes] | None = None,
) -> Outcome:
    """The outcome of `source`; raises only when the storage failed (one odd file must not
    fail a job of millions, and no file may be rejected for a network's fault).

    Args:
      source: the input as listed.
      labels: the dataset's labels.
      policy: the image checks.
      read: gives the source's bytes (a read started earlier, say); default: read it now.

    Raises:
      storage.StorageFailed: reading failed for the storage's sake (`storage.is_outage`).
    """
    refused = refused_unread(source, labels)
    if refused is not None:
        return refused
    read = read or functools.partial(storage.read_input, source.path, policy.max_file_bytes)
    try:
        data = read()
    except images.Rejected as err:
        return Outcome(reason=err.reason, detail=err.detail)
    except Exception as err:  # Beam wraps every filesystem's errors differently
        if storage.is_outage(err):
            raise storage.StorageFailed(
                f"Cannot read {source.path}: the storage failed, not the file "
                f"({messages.one_line(err)[:200]}). It is not rejected: run the job again "
                "when the storage answers."
            ) from err
        return Outcome(reason=images.UNREADABLE, detail=f"cannot read: {err}")
    try:
        return Outcome(data=data, stored=images.normalise(data, policy))
    except images.Rejected as err:
        return Outcome(data=data, reason=err.reason, detail=err.detail)
    except Exception as err:  # a bug of ours or a library's: recorded, never fatal
        LOG.exception("Unexpected error on %s", source.path)
        return Outcome(data=data, reason=images.UNEXPECTED, detail=f"{type(err).__name__}: {err}")
