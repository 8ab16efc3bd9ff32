"""The job's own files as dataclasses: the summary finalise reads, the rejected/ lines verify
reads. Written and read back, they are what was written; anything else is refused."""

import pytest

from beam_jobs import summary
from tfrecord_pipe._core.rejection import Rejection


def test_a_summary_reads_back_as_written_in_one_order_whatever_order_it_was_made_in():
    shards = [summary.ShardWritten("validation", 0, 1, 3, 300, "validation-00000-of-00001.tfrecord"),
              summary.ShardWritten("train", 1, 2, 5, 500, "train-00001-of-00002.tfrecord"),
              summary.ShardWritten("train", 0, 2, 5, 510, "train-00000-of-00002.tfrecord")]  # fmt: skip
    counts = [summary.SplitCount("train", "truncated", 1), summary.SplitCount("train", None, 11)]
    made = summary.Summary.of(shards, counts, ("a", "b"), {"groups": 1, "copies": 2})
    assert [(s.split, s.index) for s in made.shards] == [("train", 0), ("train", 1), ("validation", 0)]
    assert summary.Summary.from_json(made.to_json()) == made
    assert made.to_json() == summary.Summary.of(shards[::-1], counts[::-1], ("a", "b"),
                                                {"copies": 2, "groups": 1}).to_json()  # fmt: skip


def test_a_rejection_line_reads_back_and_what_is_not_one_is_refused():
    line = Rejection("/in/red/a.jpg", "red/a.jpg", "train", "truncated", "cut short")
    assert Rejection.from_json(line.to_json()) == line
    assert Rejection.from_json('{"path": "p", "split": "s", "reason": "r"}').relpath == "p"
    for text in ('{"reason": "truncated"}', "[1, 2]", '{"path": 1, "split": "s", "reason": "r"}',
                 "[" * 100_000, "not json"):  # fmt: skip
        with pytest.raises(ValueError):
            Rejection.from_json(text)
