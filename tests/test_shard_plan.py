"""Shard planning without I/O: balance, ranks, and the stable split."""

import random

import pytest

from beam_jobs import shard_plan
from beam_jobs.source_file import split_by_hash
from tfrecord_pipe._core import naming


@pytest.mark.parametrize("n, shards", [(10, 3), (1026, 8), (7, 7), (5, 1), (100, 16)])
def test_shard_lengths_differ_by_at_most_one_and_sum_to_n(n, shards):
    lengths = shard_plan.shard_lengths(n, shards)
    assert len(lengths) == shards
    assert sum(lengths) == n
    assert max(lengths) - min(lengths) <= 1


@pytest.mark.parametrize(
    "n, size, requested, expected",
    [(0, 0, None, 0), (3, 10 << 30, None, 3), (1000, 1 << 20, None, 64), (500, 50 << 20, None, 64),
     (40, 1 << 20, None, 40), (10**6, 64 * (128 << 20) + 1, None, 128), (5, 100, 16, 5),
     (100, 100, 16, 16)],
)  # fmt: skip
def test_default_shards_are_a_multiple_of_64_within_the_size_and_never_exceed_records(
    n, size, requested, expected
):
    assert shard_plan.num_shards(n, size, requested) == expected


@pytest.mark.parametrize("n, shards", [(10, 3), (1026, 8), (7, 7), (5, 1), (100, 16)])
def test_shard_of_rank_follows_the_shard_lengths(n, shards):
    expected = [i for i, length in enumerate(shard_plan.shard_lengths(n, shards)) for _ in range(length)]
    assert [shard_plan.shard_of_rank(rank, n, shards) for rank in range(n)] == expected


@pytest.mark.parametrize("shards", [1, 2, 7, 50])
def test_ranking_within_buckets_cuts_the_global_order_into_balanced_runs(shards):
    # What the job does: count keys per bucket, give each bucket its start rank, then rank
    # each bucket's sorted keys on their own; no place ever sees all the keys.
    rng = random.Random(shards)
    keys = [shard_plan.order_key(f"label{rng.randrange(5)}/{i}.jpg") for i in range(997)]
    buckets = {}
    for key in keys:
        buckets.setdefault(shard_plan.bucket_of(key), []).append(key)
    starts = shard_plan.bucket_start_ranks({b: len(k) for b, k in buckets.items()})

    assigned = {}
    for bucket, bucket_keys in buckets.items():
        for rank, key in enumerate(sorted(bucket_keys), start=starts[bucket]):
            assigned.setdefault(shard_plan.shard_of_rank(rank, len(keys), shards), []).append(key)
    ordered = sorted(keys)
    expected, position = [], 0
    for length in shard_plan.shard_lengths(len(keys), shards):
        expected.append(ordered[position:position + length])
        position += length
    assert [sorted(assigned[i]) for i in range(shards)] == expected


def test_bucket_order_is_key_order():
    keys = sorted(shard_plan.order_key(f"{i}.jpg") for i in range(500))
    assert [shard_plan.bucket_of(k) for k in keys] == sorted(shard_plan.bucket_of(k) for k in keys)
    assert all(0 <= shard_plan.bucket_of(k) < shard_plan.NUM_BUCKETS for k in keys)


def test_validation_split_is_stable_when_images_are_added():
    before = {f"daisy/{i}.jpg": split_by_hash(f"daisy/{i}.jpg", 0.2) for i in range(1000)}
    after = {f"daisy/{i}.jpg": split_by_hash(f"daisy/{i}.jpg", 0.2) for i in range(3000)}
    assert all(after[path] == split for path, split in before.items())
    share = sum(s == naming.VALIDATION for s in after.values()) / len(after)
    assert 0.17 < share < 0.23


def test_bucket_totals_count_and_sum_per_bucket_across_merged_workers():
    from beam_jobs.write_shards import BucketTotals

    combine = BucketTotals()
    rows = [(7, 100), (3, 10), (7, 50), (4095, 1), (3, 5)]
    whole = combine.create_accumulator()
    for row in rows:
        whole = combine.add_input(whole, row)
    parts = []
    for chunk in (rows[:2], rows[2:]):  # as two workers would, then merged
        part = combine.create_accumulator()
        for row in chunk:
            part = combine.add_input(part, row)
        parts.append(part)
    expected = {3: (2, 15), 7: (2, 150), 4095: (1, 1)}
    assert combine.extract_output(whole) == expected
    assert combine.extract_output(combine.merge_accumulators(parts)) == expected
