"""Shard planning: how many shards, which record goes where. Pure functions, no I/O.

Records of a split are ordered by `order_key` (a hash of the record's relative path), then cut
into contiguous runs whose lengths differ by at most one. The hash order mixes classes; using
the path (not the content) keeps the order stable when images are re-encoded differently, and
running twice over the same input gives the same bytes.
"""

from __future__ import annotations

import hashlib
import math

# At most 100-200 MB a shard, big enough that reading is sequential and few enough files that
# listing them is cheap; the tf.data guide and the TPU performance guide give this range.
DEFAULT_SHARD_BYTES = 128 << 20  # 128 MiB

# Default shard counts are a multiple of this, records allowing: the hosts of a TPU pod slice
# (up to 64, or any power of two below) then each read as many files of their own, and none
# reads a file another host reads (with one shard, every host read it and kept 1/n).
SHARD_MULTIPLE = 64

# Records are grouped into this many key-prefix buckets and ranked within them, so no place
# ever holds a whole split's keys (a bucket holds about 1/4096 of a split).
NUM_BUCKETS = 4096

# Bytes a serialized record takes beyond its image and strings: feature keys, the fixed
# values and protobuf framing (about 260 bytes besides the 64-digit hash, counted on records
# `schema.serialize` wrote).
_RECORD_OVERHEAD = 260


def record_size(image_bytes: int, filename: str, label: str) -> int:
    """The bytes a record counts for when shards are sized: about its serialized size, known
    without serializing the image to measure. `verify` counts them again from the records."""
    return image_bytes + len(filename.encode()) + len(label.encode()) + 64 + _RECORD_OVERHEAD


def order_key(relpath: str) -> str:
    """The key records are sorted by: hex SHA-256 of the path, then the path (unique)."""
    return hashlib.sha256(relpath.encode("utf-8")).hexdigest() + ":" + relpath


def bucket_of(key: str) -> int:
    """The key-prefix bucket of `key`; bucket order is key order."""
    return int(key[:3], 16)  # 16**3 == NUM_BUCKETS


def num_shards(num_examples: int, num_bytes: int, requested: int | None = None,
               shard_bytes: int = DEFAULT_SHARD_BYTES) -> int:
    """Shards for a split: as requested; else the least multiple of SHARD_MULTIPLE whose
    shards hold at most `shard_bytes` each. Never more than records (a split of 10 records
    has 10 shards of one)."""
    if num_examples == 0:
        return 0
    if requested is None:
        by_size = max(1, math.ceil(num_bytes / shard_bytes))
        requested = math.ceil(by_size / SHARD_MULTIPLE) * SHARD_MULTIPLE
    return max(1, min(requested, num_examples))


def shard_lengths(num_examples: int, shards: int) -> list[int]:
    """Records per shard: the first num_examples % shards shards get one more."""
    if shards == 0:
        return []
    base, extra = divmod(num_examples, shards)
    return [base + (1 if i < extra else 0) for i in range(shards)]


def shard_of_rank(rank: int, num_examples: int, shards: int) -> int:
    """The shard holding the record at `rank` (its 0-based position in key order), for the
    lengths `shard_lengths` gives: the first num_examples % shards shards one longer."""
    base, extra = divmod(num_examples, shards)
    longer = extra * (base + 1)  # records in the longer shards
    if rank < longer:
        return rank // (base + 1)
    return extra + (rank - longer) // base


def bucket_start_ranks(bucket_counts: dict[int, int]) -> dict[int, int]:
    """Rank of the first key of each bucket, from the number of keys per bucket."""
    starts, rank = {}, 0
    for bucket in sorted(bucket_counts):
        starts[bucket] = rank
        rank += bucket_counts[bucket]
    return starts
