"""The conversion at 1M, 10M and 100M images, on paper: shards, what a worker holds, what is
shuffled, how the listing goes, and Dataflow worker-hours and cost at a measured per-core rate.

Nothing here is measured at that scale. The inputs are: the rate per core (measured on this
machine by `benchmarks.convert_bench`; RESULTS.md), the mean record size, the shard plan
(`beam_jobs.shard_plan`, the job's own), the size of what each shuffle carries (the job's own
entries, encoded by Beam's coder here), and Dataflow's list prices as Beam itself records them
(`apache_beam.testing.load_tests.dataflow_cost_consts`, batch rates, of the pinned Beam
release). Region, discounts and price changes move the cost: multiply the vCPU-hours by your
own rate.

Run: .venv/bin/python -m benchmarks.at_scale [--rate_per_core R] [--record_kb K]
                                             [--vcpus_per_worker V] [--gb_per_vcpu G]
"""

from __future__ import annotations

import argparse
import hashlib

from benchmarks import command_line

SIZES = (1_000_000, 10_000_000, 100_000_000)
LIST_PAGE = 1000  # objects a GCS list request returns at most
# The job's steps that hold a group of entries in one worker's memory at once.
READ_AHEAD_IMAGES = 64  # shard_writer.READ_AHEAD


def entry_bytes() -> dict[str, int]:
    """Bytes Beam's coder writes for each kind of element a shuffle carries, for an
    ImageNet-like input on gs:// (a synset folder and file name)."""
    import apache_beam as beam

    from beam_jobs import load, shard_plan, source_file

    relpath = "n01440764/n01440764_10026.JPEG"
    path = "gs://my-bucket/imagenet/train/" + relpath
    digest = hashlib.sha256(b"").hexdigest()
    checked = load.Checked(
        key=shard_plan.order_key(relpath), path=path, relpath=relpath, label_index=0,
        label_text="n01440764", sha256=digest, crc32c=2**31, height=375, width=500,
        size=110_000, reencoded=False,
    )  # fmt: skip
    listed = source_file.SourceFile(path=path, relpath=relpath, label="n01440764", split="train")

    def size(value) -> int:
        return len(beam.coders.registry.get_coder(type(value)).encode(value))

    return {
        "listed input (Spread)": size(listed),
        "content hash (duplicates)": size((digest, relpath)),
        "entry (EntriesPerBucket)": size(((("train", 0), checked))),
        "entry (GroupShards)": size(((("train", 0), checked))),
    }


def plan(images: int, record_bytes: int, entries: dict[str, int]) -> dict:
    from beam_jobs import shard_plan

    shards = shard_plan.num_shards(images, images * record_bytes)
    per_shard = -(-images // shards)
    entry = entries["entry (GroupShards)"]
    return {
        "images": images,
        "data GB": images * record_bytes / 1e9,
        "shards": shards,
        "records per shard": per_shard,
        "WriteShard holds MB": (per_shard * entry + READ_AHEAD_IMAGES * record_bytes) / 1e6,
        "bucket holds MB": -(-images // shard_plan.NUM_BUCKETS) * entry / 1e6,
        "shuffled GB": images * sum(entries.values()) / 1e9,
        "list requests": -(-images // LIST_PAGE),
    }


def cost(images: int, rate_per_core: float, vcpus: int, gb_per_vcpu: float, shuffled_gb: float):
    from apache_beam.testing.load_tests import dataflow_cost_consts as prices

    vcpu_hours = images / rate_per_core / 3600
    memory_gb_hours = vcpu_hours * gb_per_vcpu
    dollars = (vcpu_hours * prices.VCPU_PER_HR_BATCH
               + memory_gb_hours * prices.MEM_PER_GB_HR_BATCH
               + shuffled_gb * prices.SHUFFLE_PER_GB_BATCH)  # fmt: skip
    return vcpu_hours, vcpu_hours / vcpus, dollars


def main(argv=None):
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--rate_per_core", type=float, default=646.0,
                        help="images/s per core (RESULTS.md: 1292 on 2 cores, real photos)")
    parser.add_argument("--record_kb", type=float, default=110.0,
                        help="mean record size in kB (ImageNet's training JPEGs: about 110)")
    parser.add_argument("--vcpus_per_worker", type=int, default=4)
    parser.add_argument("--gb_per_vcpu", type=float, default=3.75,
                        help="worker memory per vCPU (n1-standard: 3.75)")
    args = parser.parse_args(argv)
    entries = entry_bytes()
    print(command_line("benchmarks.at_scale", argv))
    print("bytes per element in each shuffle: "
          + ", ".join(f"{name} {n}" for name, n in entries.items()))  # fmt: skip
    columns = ("images", "data GB", "shards", "records/shard", "WriteShard holds MB",
               "a bucket holds MB", "shuffled GB", "list requests", "vCPU-hours",
               f"{args.vcpus_per_worker}-vCPU worker-hours", "cost $")  # fmt: skip
    print("| " + " | ".join(columns) + " |")
    print("|---" * len(columns) + "|")
    for images in SIZES:
        row = plan(images, int(args.record_kb * 1000), entries)
        vcpu_hours, worker_hours, dollars = cost(
            images, args.rate_per_core, args.vcpus_per_worker, args.gb_per_vcpu,
            row["shuffled GB"],
        )  # fmt: skip
        print(
            f"| {images:,} | {row['data GB']:,.0f} | {row['shards']:,} | "
            f"{row['records per shard']:,} | {row['WriteShard holds MB']:.1f} | "
            f"{row['bucket holds MB']:.1f} | {row['shuffled GB']:.1f} | "
            f"{row['list requests']:,} | {vcpu_hours:,.1f} | {worker_hours:,.1f} | "
            f"{dollars:,.2f} |"
        )


if __name__ == "__main__":
    main()
