"""What a fresh process pays to start: CPU seconds, after the imports, to a pipeline's first
batch, to a SavedModel export, and for `serving.model_inputs` called eagerly, each case in a
process of its own, rounds alternating. A preempted run pays the first batch again at every
restart. The ceiling is a plain tf.data pipeline (TFRecordDataset, parse, decode_jpeg, resize,
batch) to its first batch, in the same run.

Run: .venv/bin/python -m benchmarks.start_bench [--images N] [--repeats R]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from benchmarks import command_line, reader_bench

CEILING = "tf.data alone (ceiling)"
CASES = (CEILING, "training, seeded", "training", "evaluation", "export",
         "model_inputs, eager")  # fmt: skip
SIZE, BATCH = 224, 32


def measure(case: str, data: str) -> dict[str, float]:
    """CPU seconds of `case` in this (fresh) process, after its imports: {figure: seconds}."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import glob

    import keras
    import tensorflow as tf

    from tfrecord_pipe import reader, serving

    def cpu(run) -> float:
        began = time.process_time()
        run()
        return time.process_time() - began

    if case == CEILING:
        spec = {"image/encoded": tf.io.FixedLenFeature([], tf.string)}

        def decoded(record):
            encoded = tf.io.parse_single_example(record, spec)["image/encoded"]
            return tf.image.resize(tf.io.decode_jpeg(encoded, channels=3), [SIZE, SIZE])

        def first():
            files = sorted(glob.glob(os.path.join(data, "train-*.tfrecord")))
            return next(iter(tf.data.TFRecordDataset(files).map(decoded).batch(BATCH)))

        return {case: cpu(first)}
    if case.startswith(("training", "evaluation")):
        config = reader.ReaderConfig(data, is_training=case.startswith("training"),
                                     batch_size=BATCH, image_size=SIZE,
                                     seed=1 if case.endswith("seeded") else None)  # fmt: skip
        return {case: cpu(lambda: next(iter(reader.build_dataset(config))))}
    config = serving.ServingConfig.for_dataset(data, image_size=SIZE)
    if case == "export":
        inputs = keras.Input((SIZE, SIZE, 3))
        x = keras.layers.GlobalAveragePooling2D()(inputs)
        model = keras.Model(inputs, keras.layers.Dense(len(config.labels))(x))
        folder = tempfile.mkdtemp(prefix="start-bench-export-")
        try:
            return {case: cpu(lambda: serving.export(model, folder, config))}
        finally:
            shutil.rmtree(folder)
    shards = glob.glob(os.path.join(data, "validation-*.tfrecord"))
    spec = {"image/encoded": tf.io.FixedLenFeature([], tf.string)}
    request = tf.stack([tf.io.parse_single_example(record, spec)["image/encoded"]
                        for record in tf.data.TFRecordDataset(shards).take(1)])  # fmt: skip
    return {f"{case}, call {n}": cpu(lambda: serving.model_inputs(request, config))
            for n in (1, 2)}  # fmt: skip


def main(argv=None):
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--images", type=int, default=512)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--data", help="existing shards (from an earlier run) to reuse")
    parser.add_argument("--case", choices=CASES, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.case is not None:
        for name, seconds in measure(args.case, args.data).items():
            print(f"RESULT {seconds} {name}")
        return

    with reader_bench.shards_for(args.data, args.images, args.shards) as data:
        figures: dict[str, list[float]] = {}
        for _ in range(args.repeats):  # alternating, each in a fresh process
            for case in CASES:
                command = [sys.executable, "-m", "benchmarks.start_bench", "--data", data,
                           "--case", case]  # fmt: skip
                out = subprocess.run(command, stdout=subprocess.PIPE, text=True, check=True)
                for line in out.stdout.splitlines():
                    if line.startswith("RESULT "):
                        _, seconds, name = line.split(" ", 2)
                        figures.setdefault(name, []).append(float(seconds))
        ceiling = statistics.median(figures[CEILING])
        print("\n" + command_line("benchmarks.start_bench", argv))
        print(f"{args.images} images, {args.shards} shards, batch {BATCH}, {SIZE} px; "
              f"medians of {args.repeats} fresh processes each\n")  # fmt: skip
        print("| after the imports | CPU s (median) | range | / ceiling |")
        print("|---|---|---|---|")
        for name, seconds in figures.items():
            median = statistics.median(seconds)
            print(f"| {name} | {median:.2f} | {min(seconds):.2f}-{max(seconds):.2f} | "
                  f"{median / ceiling:.2f}x |")  # fmt: skip


if __name__ == "__main__":
    main()
