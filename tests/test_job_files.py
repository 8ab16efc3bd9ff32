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
    for text, said in (('{"reason": "truncated"}', "no text path, split"),
                       ("[1, 2]", "not a JSON object"),
                       ('{"path": 1, "split": "s", "reason": "r"}', "no text path$"),
                       ("[" * 100_000, "nested too deeply"),
                       ("not json", "Expecting value")):  # fmt: skip
        with pytest.raises(ValueError, match=said):
            Rejection.from_json(text)


def test_a_summary_left_by_a_run_of_the_version_before_reads_as_the_same_summary():
    # A killed run of 0.3.0 leaves this in its temporary folder; the next run reads it.
    old = (
        '{"counts": [{"n": 11, "split": "train", "what": "listed"}, '
        '{"n": 1, "split": "train", "what": "rejected:truncated"}], '
        '"duplicates": [{"n": 1, "what": "groups"}], "labels": [["a", "b"]], '
        '"shards": [{"bytes": 5, "count": 10, "file": "train-00000-of-00001.tfrecord", '
        '"index": 0, "shards": 1, "split": "train"}]}'
    )
    read = summary.Summary.from_json(old)
    assert read.counts == (summary.SplitCount("train", None, 11),
                           summary.SplitCount("train", "truncated", 1))  # fmt: skip
    assert read.labels == ("a", "b") and read.duplicates == {"groups": 1}
    assert read.shards[0].file == "train-00000-of-00001.tfrecord"


def test_a_policy_recorded_before_colour_profiles_were_kept_says_they_were_not():
    # verify re-makes each record with the recorded policy: a dataset of 0.3.0 has none.
    from beam_jobs.config import ConvertConfig

    record = ConvertConfig(source="s", output="o").to_record()
    assert ConvertConfig.from_record(record).policy.keep_icc_profile
    del record["policy"]["keep_icc_profile"]
    assert not ConvertConfig.from_record(record).policy.keep_icc_profile

