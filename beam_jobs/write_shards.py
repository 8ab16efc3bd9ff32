"""Balanced, deterministic shards: count records per key bucket, rank them, write each shard.

The arithmetic lives in shard_plan.py and the writing of a shard in shard_writer.py; these
transforms only wire them into Beam.
"""

from __future__ import annotations

from concurrent import futures
from typing import Any

import apache_beam as beam
from apache_beam.metrics import Metrics

import beam_jobs
from beam_jobs import load, malloc, shard_plan
from beam_jobs.config import ConvertConfig
from beam_jobs.shard_writer import write_shard

NAMESPACE = beam_jobs.METRICS_NAMESPACE


class WriteShard(beam.DoFn):
    """Writes one shard (`write_shard`): its records sorted by key, read from their sources,
    to the temp folder."""

    def __init__(self, temp_dir: str, config: ConvertConfig):
        self._temp_dir = temp_dir
        self._config = config

    def setup(self):
        malloc.keep_large_buffers_in_mmap()
        # Sources are read again here, in key order. Remote ones in parallel, or a shard of
        # 10,000 images on GCS would wait for 10,000 requests one after another; local ones
        # in this thread: a local read takes microseconds, and threads fighting over the GIL
        # made writing a shard slower (benchmarks/RESULTS.md, "Writing shards").
        self._pool = futures.ThreadPoolExecutor(load.REMOTE_READERS)
        self._shards = Metrics.counter(NAMESPACE, "shards_written")
        self._records = Metrics.counter(NAMESPACE, "records_written")

    def teardown(self):
        self._pool.shutdown()

    def process(self, element, plans):
        (split, index), checked = element
        entries = sorted(checked, key=lambda c: c.key)
        written = write_shard(entries, split, index, plans[split]["shards"], self._temp_dir,
                              self._config, self._pool)  # fmt: skip
        self._shards.inc()
        self._records.inc(written[0].count)
        yield from written


class BucketTotals(beam.CombineFn):
    """A split's {bucket: (records, bytes)} from its (bucket, record size) rows.

    At most NUM_BUCKETS entries, whatever the number of records: each worker sends one
    such dict per split.
    """

    def create_accumulator(self):
        return {}

    def add_input(self, totals, bucket_and_size):
        bucket, size = bucket_and_size
        count, total = totals.get(bucket, (0, 0))
        totals[bucket] = (count + 1, total + size)
        return totals

    def merge_accumulators(self, accumulators):
        merged = {}
        for totals in accumulators:
            for bucket, (count, size) in totals.items():
                before = merged.get(bucket, (0, 0))
                merged[bucket] = (before[0] + count, before[1] + size)
        return merged

    def extract_output(self, totals):
        return totals


def _plan(totals, num_shards, shard_bytes):
    """A split's plan from its bucket totals: records, bytes, shard count, and the rank of
    the first key of each bucket."""
    counts = {bucket: count for bucket, (count, _) in totals.items()}
    examples = sum(counts.values())
    size = sum(total for _, total in totals.values())
    return {
        "examples": examples,
        "bytes": size,
        "shards": shard_plan.num_shards(examples, size, num_shards, shard_bytes),
        "starts": shard_plan.bucket_start_ranks(counts),
    }


class PlanShards(beam.PTransform):
    """Per split, from (split, (bucket, record size)) rows: a plan with its records, bytes,
    shard count, and the rank of the first key of each key-prefix bucket.

    One combine per split gives both the totals and the bucket counts (each worker sends at
    most NUM_BUCKETS counts per split, whatever the number of records).
    """

    def __init__(self, num_shards: int | None, shard_bytes: int):
        super().__init__()
        self._num_shards = num_shards
        self._shard_bytes = shard_bytes

    def expand(self, sizes):
        num_shards, shard_bytes = self._num_shards, self._shard_bytes
        return (
            sizes
            | "BucketTotals" >> beam.CombinePerKey(BucketTotals())
            | "Plan" >> beam.MapTuple(
                lambda split, totals: (split, _plan(totals, num_shards, shard_bytes))
            )
        )


_ENTRIES = "entries"


def _bucket_rows(split_and_checked):
    """(split, (bucket, size)) for the plan, and ((split, bucket), Checked) to _ENTRIES."""
    split, checked = split_and_checked
    bucket = shard_plan.bucket_of(checked.key)
    yield split, (bucket, checked.size)
    yield beam.pvalue.TaggedOutput(_ENTRIES, ((split, bucket), checked))


def _in_shards(bucket_entries, plans):
    """((split, shard index), Checked) for every entry of one bucket.

    A bucket's entries, sorted, have consecutive ranks from the bucket's start rank, and a
    rank says which shard the record is in.
    """
    (split, bucket), entries = bucket_entries
    plan = plans[split]
    rank = plan["starts"][bucket]
    for checked in sorted(entries, key=lambda c: c.key):
        yield (split, shard_plan.shard_of_rank(rank, plan["examples"], plan["shards"])), checked
        rank += 1


class WriteShards(beam.PTransform):
    """Assigns each record to its shard and writes the shards; emits one info dict per shard.

    Records are grouped by split and key-prefix bucket (never a whole split in one place;
    image bytes are never shuffled: WriteShard reads them from the sources), ranked within
    their bucket once the plan gives each bucket's start rank, then grouped by shard.
    """

    def __init__(self, config: ConvertConfig, temp_dir: str):
        super().__init__()
        self._config = config
        self._temp_dir = temp_dir

    def expand(self, records):
        bucketed = records | "ByBucket" >> beam.FlatMap(_bucket_rows).with_output_types(
            tuple[Any, Any]  # the main output's type; inferred, it would include TaggedOutput
        ).with_outputs(_ENTRIES, main="sizes")
        plans = bucketed.sizes | "PlanShards" >> PlanShards(
            self._config.num_shards, self._config.shard_bytes
        )
        return (
            bucketed[_ENTRIES]
            | "EntriesPerBucket" >> beam.GroupByKey()
            | "AssignShards" >> beam.FlatMap(_in_shards, plans=beam.pvalue.AsDict(plans))
            | "GroupShards" >> beam.GroupByKey()
            | "WriteShard" >> beam.ParDo(
                WriteShard(self._temp_dir, self._config),
                plans=beam.pvalue.AsDict(plans),
            )
        )
