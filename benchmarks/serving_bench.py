"""What serving's preprocessing costs next to the bare evaluation crop, on the same requests.

    python -m benchmarks.serving_bench [--requests 40] [--batch 16] [--rounds 5]

Three request kinds, photo-like JPEGs of 480x360: upright (stored as they are: the header walk
is the only extra), EXIF-rotated (decoded, turned and re-encoded, as the converter does), and
PNG (the same). The ceiling is `preprocess.eval_image` mapped over the upright JPEGs, in the
same round: what serving cost before it made files into the converter's pixels. Ratios are
per-image time over the ceiling's, medians of the rounds (range in brackets).
"""

from __future__ import annotations

import argparse
import io
import statistics
import time

import numpy as np
import tensorflow as tf
from PIL import Image

from benchmarks import command_line
from benchmarks.photos import photo_like
from tfrecord_pipe._reading import preprocess, serving

SIZE = 224


def requests(batch: int) -> dict[str, list[bytes]]:
    rng = np.random.default_rng(0)
    photos = [Image.fromarray(photo_like(rng, 480, 360)) for _ in range(batch)]
    exif = Image.Exif()
    exif[0x0112] = 6

    def encoded(image, fmt, **options):
        buffer = io.BytesIO()
        image.save(buffer, format=fmt, **options)
        return buffer.getvalue()

    return {
        "upright JPEG": [encoded(p, "JPEG", quality=90) for p in photos],
        "EXIF-rotated JPEG": [encoded(p, "JPEG", quality=90, exif=exif.tobytes()) for p in photos],
        "PNG": [encoded(p, "PNG") for p in photos],
    }


def per_image(fn, files, count: int) -> float:
    """Seconds per image over `count` calls of fn on the batch `files` (after one warm-up)."""
    batch = tf.constant(files)
    fn(batch)
    start = time.perf_counter()
    for _ in range(count):
        fn(batch)
    return (time.perf_counter() - start) / (count * len(files))


def main(argv=None) -> list[str]:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--requests", type=int, default=40, help="requests timed per kind")
    parser.add_argument("--batch", type=int, default=16, help="images per request")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    config = serving.ServingConfig(labels=("a", "b"), image_size=SIZE)
    signature = tf.TensorSpec([None], tf.string)
    served = tf.function(lambda b: serving.model_inputs(b, config), input_signature=[signature])
    spec = tf.TensorSpec([SIZE, SIZE, 3], tf.float32)
    bare = tf.function(
        lambda b: tf.map_fn(lambda e: preprocess.eval_image(e, SIZE), b, fn_output_signature=spec),
        input_signature=[signature],
    )
    kinds = requests(args.batch)
    ratios = {kind: [] for kind in kinds}
    ceilings = []
    for _ in range(args.rounds):
        ceiling = per_image(bare, kinds["upright JPEG"], args.requests)
        ceilings.append(ceiling)
        for kind, files in kinds.items():
            ratios[kind].append(per_image(served, files, args.requests) / ceiling)
    lines = [
        command_line("benchmarks.serving_bench", argv),
        f"ceiling (eval_image on upright JPEGs): {1e3 * statistics.median(ceilings):.2f} ms/image",
        "| request | time per image / ceiling |",
        "|---|---|",
    ]
    for kind, values in ratios.items():
        lines.append(
            f"| {kind} | {statistics.median(values):.2f}x ({min(values):.2f}-{max(values):.2f}) |"
        )
    print("\n".join(lines))
    return lines


if __name__ == "__main__":
    main()
