"""Reader throughput against the decode ceiling measured in the same run, and peak memory.

On one set of shards (photo-like JPEGs, 256..480 px a side unless --sides), each pipeline
runs in its own process for a fixed time after a warm-up, and reports images/s and its peak
RSS (baseline in brackets: the RSS right after importing TensorFlow):

- ceiling: the records read by the reader's own stages (`reader.read_records`: interleave,
  shuffle), then only parsed and fully decoded with `tf.io.decode_jpeg`, in parallel;
- train: `reader.build_dataset`, training (random crop decoded with decode_and_crop_jpeg,
  flip, float32, batched with drop_remainder, default shuffle buffer);
- train, seeded: the same with `seed=1`: the seeded, position-addressable order (`epochs.py`),
  stateless augmentation, deterministic element order;
- article: the same reading and batching with the original Cloud TPU article's preprocessing
  (full decode, to float, resize to size+10, random crop, flip, brightness, contrast);
- eval: `reader.build_dataset`, evaluation (centre crop, padded last batch), whole passes,
  each from a new iterator as Keras `evaluate` makes one: each pass pays the pipeline's
  start-up (creating the iterator, filling it for the first batch), which a pass of a few
  thousand images does not hide;
- eval, one iterator: the same passes one after another from one iterator (`.repeat()`),
  the steady rate the ceiling is also measured at;
- grain, train / grain, eval: `tfrecord_pipe.grain.make_dataset` over the same records in
  ArrayRecord shards, training (seeded) and evaluation (passes from one iterator), each on
  the default threads in this process, as the tf.data pipelines run.

Machines here are shared and noisy (benchmarks/RESULTS.md, "Reader"), so the pipelines run
in rounds (ceiling, train, article, eval, ..., then again), every measurement
is printed, and the table shows medians; a ratio is the median of its per-round ratios.

Run: .venv/bin/python -m benchmarks.reader_bench [--images N] [--seconds S] [--repeats R]
                                                 [--sides MIN MAX]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import pathlib
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile

from benchmarks import command_line

PIPELINES = ("ceiling", "train", "train, seeded", "article", "eval", "eval, one iterator",
             "grain, train", "grain, eval")  # fmt: skip
LABELS = tuple(f"class{i}" for i in range(10))


@contextlib.contextmanager
def shards_for(data: str | None, count: int, num_shards: int, **options):
    """`data` (shards from an earlier run), or `count` images written into `num_shards` shards
    in a temporary folder for this run, removed after it (`write_shards`' `options`)."""
    if data is not None:
        yield data
        return
    folder = tempfile.mkdtemp(prefix="bench-shards-")
    try:
        write_shards(pathlib.Path(folder), count, num_shards, **options)
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def write_shards(
    folder: pathlib.Path, count: int, num_shards: int, seed: int = 0, sides=(256, 480)
) -> None:
    """`count` photo-like JPEGs (`sides` px a side) in `num_shards` shards, TFRecord and
    ArrayRecord, plus a manifest."""
    import hashlib

    import numpy as np
    import tensorflow as tf

    from benchmarks import photos
    from tfrecord_pipe import manifest, schema
    from tfrecord_pipe._reading import dataset
    from tfrecord_pipe._core import array_records, naming, progress

    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    names = [naming.shard_name("train", i, num_shards, False) for i in range(num_shards)]
    lengths = [len(range(i, count, num_shards)) for i in range(num_shards)]
    twins = [naming.shard_name("train", i, num_shards, False, naming.ARRAY_RECORD)
             for i in range(num_shards)]  # fmt: skip
    writers = [tf.io.TFRecordWriter(str(folder / name)) for name in names]
    twin_writers = [array_records.Writer(str(folder / name)) for name in twins]
    line = progress.StatusLine()
    for i in range(count):
        width, height = (int(side) for side in rng.integers(sides[0], sides[1] + 1, 2))
        encoded = photos.photo_like_jpeg(rng, width, height)
        record = schema.ImageRecord(
            encoded=encoded,
            height=height,
            width=width,
            label_index=i % len(LABELS),
            label_text=LABELS[i % len(LABELS)],
            filename=f"{LABELS[i % len(LABELS)]}/{i:06d}.jpg",
            sha256=hashlib.sha256(encoded).hexdigest(),
        )
        serialized = schema.serialize(record, label_offset=1)
        writers[i % num_shards].write(serialized)
        twin_writers[i % num_shards].write(serialized)
        line.update(f"  writing shards: {i + 1}/{count} images")
    for writer in writers + twin_writers:
        writer.close()
    line.finish(f"  wrote {count} images in {num_shards} shards")
    info = manifest.SplitInfo(
        num_examples=count,
        shard_lengths=tuple(lengths),
        num_bytes=sum((folder / name).stat().st_size for name in names + twins),
        listed=count,
        rejected=0,
        files=tuple(names),
        array_record_files=tuple(twins),
    )
    # Evaluation reads the same shards, as its own split: links named as a manifest must
    # name a split's files.
    named_again = {}
    for name in names + twins:
        again = name.replace("train-", "validation-", 1)
        (folder / again).unlink(missing_ok=True)
        os.link(folder / name, folder / again)
        named_again[name] = again
    validation = dataclasses.replace(
        info, files=tuple(named_again[n] for n in names),
        array_record_files=tuple(named_again[n] for n in twins),
    )  # fmt: skip
    splits = {"train": info, "validation": validation}
    dataset.write_manifest(
        str(folder), manifest.Manifest(labels=LABELS, label_offset=1, compression="", splits=splits)
    )


def article_image_fn(image_size: int):
    """The original Cloud TPU article's training preprocessing, for comparison."""
    import tensorflow as tf

    def preprocess(encoded):
        image = tf.io.decode_jpeg(encoded, channels=3)
        image = tf.image.convert_image_dtype(image, tf.float32)
        image = tf.image.resize(image, [image_size + 10, image_size + 10])
        image = tf.image.random_crop(image, [image_size, image_size, 3])
        image = tf.image.random_flip_left_right(image)
        image = tf.image.random_brightness(image, max_delta=32.0 / 255.0)
        image = tf.image.random_contrast(image, lower=0.5, upper=1.5)
        return image

    return preprocess


def build(name: str, data: str, image_size: int, batch: int):
    """The dataset of pipeline `name`, and a function giving the images in one of its batches."""
    from tfrecord_pipe import reader
    from tfrecord_pipe._tools import bench

    if name.startswith("grain"):
        return build_grain(name, data, image_size, batch)
    train = reader.ReaderConfig(
        data=data, split="train", is_training=True, batch_size=batch, image_size=image_size
    )
    if name == "ceiling":
        return bench.ceiling_dataset(train), bench.batch_images(train)
    if name == "train":
        return reader.build_dataset(train), bench.batch_images(train)
    if name == "train, seeded":
        seeded = dataclasses.replace(train, seed=1)
        return reader.build_dataset(seeded), bench.batch_images(seeded)
    if name == "article":
        dataset = reader.build_dataset(train, image_fn=article_image_fn(image_size))
        return dataset, bench.batch_images(train)
    evaluation = reader.ReaderConfig(
        data=data, split="validation", is_training=False, batch_size=batch, image_size=image_size
    )
    dataset = reader.build_dataset(evaluation)
    if name == "eval, one iterator":
        dataset = dataset.repeat()
    return dataset, bench.batch_images(evaluation)


def build_grain(name: str, data: str, image_size: int, batch: int):
    """The Grain pipeline `name` over the ArrayRecord twins, and its images per batch."""
    from tfrecord_pipe import grain

    if name == "grain, train":
        dataset = grain.make_dataset(
            data, "train", is_training=True, batch_size=batch, image_size=image_size, seed=1
        )
        return dataset, lambda element: len(element[1])
    dataset = grain.make_dataset(
        data, "validation", is_training=False, batch_size=batch, image_size=image_size
    )
    return _repeated(dataset), lambda element: int((element[2] > 0).sum())


class _repeated:
    """Passes one after another from one iterable (as `.repeat()` does for tf.data)."""

    def __init__(self, dataset):
        self._dataset = dataset

    def __iter__(self):
        while True:
            yield from self._dataset


def measure(name: str, data: str, image_size: int, batch: int, seconds: float) -> None:
    """Runs one pipeline (in this process) and prints `RESULT images/s peak_rss baseline_rss`."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf  # noqa: F401  (imported before the baseline RSS is taken)

    from tfrecord_pipe._tools import bench

    baseline = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    dataset, images_in = build(name, data, image_size, batch)
    result = bench.measure(name, dataset, seconds, images_in)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"RESULT {result.images_per_s} {peak} {baseline}")


def run_pipeline(name, data, args) -> tuple[float, float, float]:
    command = [
        sys.executable, "-m", "benchmarks.reader_bench", "--measure", name, "--data", data,
        "--image-size", str(args.image_size), "--batch", str(args.batch),
        "--seconds", str(args.seconds),
    ]  # fmt: skip
    result = subprocess.run(command, stdout=subprocess.PIPE, text=True, check=True)
    line = next(li for li in result.stdout.splitlines() if li.startswith("RESULT"))
    rate, peak, baseline = (float(value) for value in line.split()[1:])
    return rate, peak, baseline


def summarise(rounds: list[dict]) -> dict:
    """Per pipeline: median images/s, median and range of its per-round ratios to the
    ceiling and to the article, and the largest peak RSS (with its baseline)."""
    summary = {}
    for name in rounds[0]:
        rates = [measured[name][0] for measured in rounds]
        to_ceiling = [measured[name][0] / measured["ceiling"][0] for measured in rounds]
        to_article = [measured[name][0] / measured.get("article", (float("nan"),))[0]
                      for measured in rounds]  # fmt: skip
        to_train = [measured[name][0] / measured.get("train", (float("nan"),))[0]
                    for measured in rounds]  # fmt: skip
        peak, baseline = max((measured[name][1], measured[name][2]) for measured in rounds)
        summary[name] = {
            "rate": statistics.median(rates),
            "ceiling": statistics.median(to_ceiling),
            "ceiling_range": (min(to_ceiling), max(to_ceiling)),
            "article": statistics.median(to_article),
            "train": statistics.median(to_train),
            "peak": peak,
            "baseline": baseline,
        }
    return summary


def main(argv=None):
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--images", type=int, default=3000, help="records in the shards")
    parser.add_argument("--shards", type=int, default=16)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--seconds", type=float, default=8.0, help="timed run per pipeline")
    parser.add_argument("--repeats", type=int, default=3, help="rounds over all pipelines")
    parser.add_argument("--sides", type=int, nargs=2, default=(256, 480), metavar=("MIN", "MAX"),
                        help="range of the generated images' width and height, px")  # fmt: skip
    parser.add_argument("--data", help="existing shards (from an earlier run) to reuse")
    parser.add_argument("--pipelines", nargs="+", choices=PIPELINES, default=PIPELINES,
                        help="which to run (the ceiling always runs)")  # fmt: skip
    parser.add_argument("--measure", choices=PIPELINES, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.measure:
        return measure(args.measure, args.data, args.image_size, args.batch, args.seconds)

    rounds = []
    with shards_for(args.data, args.images, args.shards, sides=args.sides) as data:
        for round_index in range(args.repeats):
            measured = {}
            for name in PIPELINES:
                if name != "ceiling" and name not in args.pipelines:
                    continue
                measured[name] = run_pipeline(name, data, args)
                print(f"  round {round_index + 1}/{args.repeats}: {name:18s} "
                      f"{measured[name][0]:6.0f} img/s", flush=True)  # fmt: skip
            rounds.append(measured)
    summary = summarise(rounds)
    print(
        "\n" + command_line("benchmarks.reader_bench", argv)
        + f"   ({os.cpu_count()} cores; {_described(args)}; "
        f"{args.image_size}x{args.image_size}, batch {args.batch}; medians of {args.repeats} "
        "rounds)"
    )
    columns = ("pipeline", "images/s", "/ ceiling (range)", "/ article", "/ train",
               "peak RSS MiB (baseline)")  # fmt: skip
    print("| " + " | ".join(columns) + " |")
    print("|---" * len(columns) + "|")
    for name, row in summary.items():
        low, high = row["ceiling_range"]
        print(
            f"| {name} | {row['rate']:.0f} | {row['ceiling']:.2f}x ({low:.2f}-{high:.2f}) | "
            f"{_ratio(row['article'])} | {_ratio(row['train'])} | {row['peak']:.0f} "
            f"({row['baseline']:.0f}) |"
        )
    print("targets: train >= 0.9x ceiling and >= 1.3x article; train, seeded >= 0.9x train; "
          "eval >= 0.9x ceiling; grain, train >= 0.8x train")  # fmt: skip
    return summary


def _described(args) -> str:
    """What the pipelines read: the generated shards, or the --data dataset's training split."""
    if args.data is None:
        return f"{args.images} JPEGs {args.sides[0]}..{args.sides[1]} px in {args.shards} shards"
    lengths = json.loads((pathlib.Path(args.data) / "manifest.json").read_text())
    lengths = lengths["splits"]["train"]["shard_lengths"]
    return f"{args.data}: {sum(lengths)} training records in {len(lengths)} shards"


def _ratio(value: float) -> str:
    """A ratio for the table; "-" where its reference pipeline was not run."""
    return "-" if value != value else f"{value:.2f}x"  # NaN: no reference


if __name__ == "__main__":
    main()
