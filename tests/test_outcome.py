"""outcome.decide: what becomes of one input, in the one order the job and verify share."""

import pytest

from beam_jobs import outcome
from beam_jobs.source_file import SourceFile
from tfrecord_pipe._core import images

from helpers import jpeg_bytes

POLICY = images.ImagePolicy()
LABELS = frozenset({"red"})


def source(label="red", problem=None):
    return SourceFile(path="/nowhere/a.jpg", relpath="red/a.jpg", label=label, split="train",
                      problem=problem)  # fmt: skip


def never_read():
    raise AssertionError("read although the verdict needed no bytes")


@pytest.mark.parametrize(
    "listed, reason",
    [
        (source(problem=(images.DUPLICATE, "listed twice")), images.DUPLICATE),
        (source(label=None), images.NO_LABEL),
        (source(label="blue"), images.UNKNOWN_LABEL),
    ],
)
def test_what_the_listing_decides_is_decided_without_reading(listed, reason):
    result = outcome.decide(listed, LABELS, POLICY, never_read)
    assert (result.reason, result.stored, result.data) == (reason, None, b"")
    assert result.detail


def test_a_read_that_fails_is_unreadable_and_bad_bytes_are_judged_by_the_image_checks():
    def broken():
        raise OSError("the disk went away")

    unreadable = outcome.decide(source(), LABELS, POLICY, broken)
    assert unreadable.reason == images.UNREADABLE and "the disk went away" in unreadable.detail
    not_an_image = outcome.decide(source(), LABELS, POLICY, lambda: b"plain text")
    assert (not_an_image.reason, not_an_image.data) == (images.NOT_AN_IMAGE, b"plain text")
    good = jpeg_bytes(8, 8, (200, 10, 10))
    stored = outcome.decide(source(), LABELS, POLICY, lambda: good)
    assert stored.reason is None and stored.stored.encoded == good and stored.data == good
