"""What a seeded pipeline's positions cost and how well its epochs are shuffled.

- restore: time to the first batch of a seeded training pipeline started at a position half
  an epoch in (`start_batches`, as after a preemption), against one started afresh, each in a
  fresh process after TensorFlow is imported; the ceiling of the comparison is the fresh start.
- shuffle: for one pipeline's first epoch of records, how far records move from the order
  they are stored in (mean and largest move, as a fraction of the epoch), and how many
  distinct records the first epoch-length of the stream holds: seeded (file order drawn,
  windows of `shuffle_buffer` permuted) against the unseeded reader (a shuffle buffer of the
  same size after the repeat), at the default 10,000 (more than the benchmark's epoch) and
  at 500 (a sixth of it).

Run: .venv/bin/python -m benchmarks.resume_bench [--images N] [--repeats R]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

from benchmarks import command_line, reader_bench


def first_batch_seconds(data: str, start_batches: int, batch: int) -> float:
    """Seconds from building a seeded training pipeline to its first batch."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    from tfrecord_pipe import reader

    config = reader.ReaderConfig(data, is_training=True, batch_size=batch, seed=1)
    began = time.perf_counter()
    next(iter(reader.build_dataset(config, start_batches=start_batches)))
    return time.perf_counter() - began


def stored_order_keys(data: str, seeded: bool, count: int, buffer: int) -> list[int]:
    """The first `count` records of a training pipeline, as their places in stored order."""
    import tensorflow as tf

    from tfrecord_pipe import reader, schema
    from tfrecord_pipe._reading import epochs
    from tfrecord_pipe._reading.seeded import pipeline_layout

    config = reader.ReaderConfig(data, is_training=True, batch_size=1,
                                 seed=1 if seeded else None, shuffle_buffer=buffer)  # fmt: skip
    source = reader.resolve_source(config)
    if seeded:
        layout = pipeline_layout(config)

        def read_piece(file, count_, first, start, skip):
            keys = tf.data.Dataset.range(start + skip, start + count_)
            return tf.data.Dataset.zip((keys, tf.data.TFRecordDataset(file).skip(skip)))

        stream = epochs.stream(layout, read_piece).map(lambda e, i, key, record: key)
        return [int(key) for key in stream.take(count).as_numpy_iterator()]
    names = {}
    place = 0
    for file in source.split.files:
        for record in tf.data.TFRecordDataset(file).as_numpy_iterator():
            names[schema.decode_example(record, label_offset=1).filename] = place
            place += 1
    records = reader.read_records(config).take(count).as_numpy_iterator()
    return [names[schema.decode_example(record, label_offset=1).filename] for record in records]


def shuffle_quality(keys: list[int], epoch: int) -> tuple[float, float, float, int]:
    """(mean move, largest move) as fractions of the epoch, the share of records stored next
    to each other that come out within 10 places of each other, and distinct records."""
    moves = [abs(place - key) / epoch for place, key in enumerate(keys)]
    where = {key: place for place, key in enumerate(keys)}
    pairs = [(key, key + 1) for key in range(epoch - 1) if key in where and key + 1 in where]
    close = sum(abs(where[a] - where[b]) <= 10 for a, b in pairs) / max(len(pairs), 1)
    return statistics.mean(moves), max(moves), close, len(set(keys))


def main(argv=None):
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--images", type=int, default=3000)
    parser.add_argument("--shards", type=int, default=16)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--shuffle-buffer", type=int, nargs="+", default=[10_000, 500],
                        help="windows / buffers whose shuffle is measured")  # fmt: skip
    parser.add_argument("--data", help="existing shards (from an earlier run) to reuse")
    parser.add_argument("--first-batch", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.first_batch is not None:
        print("RESULT", first_batch_seconds(args.data, args.first_batch, args.batch))
        return

    with reader_bench.shards_for(args.data, args.images, args.shards) as data:
        half = args.images // args.batch // 2
        times = {"fresh start": [], f"restore at batch {half} (half an epoch)": []}
        for _ in range(args.repeats):  # alternating, each in a fresh process
            for (name, measured), start in zip(times.items(), (0, half)):
                command = [sys.executable, "-m", "benchmarks.resume_bench", "--data", data,
                           "--batch", str(args.batch), "--first-batch", str(start)]  # fmt: skip
                out = subprocess.run(command, stdout=subprocess.PIPE, text=True, check=True)
                line = next(li for li in out.stdout.splitlines() if li.startswith("RESULT"))
                measured.append(float(line.split()[1]))
        fresh = times["fresh start"]
        print("\n" + command_line("benchmarks.resume_bench", argv))
        print(f"{args.images} images, {args.shards} shards, batch {args.batch}\n")
        print("| seeded pipeline | first batch, s (median) | range | / fresh start |")
        print("|---|---|---|---|")
        for name, measured in times.items():
            ratios = [m / f for m, f in zip(measured, fresh)]
            print(f"| {name} | {statistics.median(measured):.2f} | "
                  f"{min(measured):.2f}-{max(measured):.2f} | "
                  f"{statistics.median(ratios):.2f}x |")  # fmt: skip
        print("\n| order | mean move | largest move | stored neighbours within 10 places | "
              "distinct in the first epoch-length |")
        print("|---|---|---|---|---|")
        for buffer in args.shuffle_buffer:
            for seeded, name in ((True, f"seeded, windows of {buffer}"),
                                 (False, f"unseeded, a {buffer}-record buffer")):  # fmt: skip
                mean, largest, close, distinct = shuffle_quality(
                    stored_order_keys(data, seeded, args.images, buffer), args.images
                )
                print(f"| {name} | {mean:.3f} | {largest:.3f} | {close:.3f} | "
                      f"{distinct} of {args.images} |")  # fmt: skip


if __name__ == "__main__":
    main()
