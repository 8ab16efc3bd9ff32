"""Where the reader's time goes: the training preprocessing built up one step at a time.

Each row adds one step to the one before, on the same records held in memory (no file
reading, so the steps themselves are compared), mapped in parallel and batched 128 at a
time; images/s and the ratio to the first row, the full-decode ceiling:

  ceiling        parse-free full tf.io.decode_jpeg (what the reader benchmark's ceiling decodes)
  crop           the training crop window + decode_and_crop_jpeg
  + resize       ... cast to float32 and resized to 224x224 (not batched: a scalar goes out)
  + flip, batch  ... flipped, and the float32 image batched (600 KB per image)
  + normalise    ... normalised: preprocess.train_image, float32 (the default)
  uint8 output   preprocess.train_image(dtype="uint8"): a quarter of the bytes to batch
  eval           preprocess.eval_image, float32
  top tenth      decode_and_crop_jpeg of the first tenth of the rows, full width
  bottom tenth   ... of the last tenth: libjpeg must still entropy-decode every row above a
                 crop (only the rows below it are skipped for free), so what a crop costs
                 follows its bottom edge more than its area

Run: .venv/bin/python -m benchmarks.reader_breakdown [--data SHARDS_FOLDER] [--seconds S]
"""

from __future__ import annotations

import argparse
import os
import pathlib
import tempfile

from benchmarks import command_line


def steps(image_size: int):
    """(name, function of one JPEG string tensor) for each row, in order."""
    import tensorflow as tf

    from tfrecord_pipe._reading import preprocess

    def window(encoded):
        shape = tf.image.extract_jpeg_shape(encoded)
        begin, size, _ = tf.image.sample_distorted_bounding_box(
            shape,
            bounding_boxes=tf.constant([0.0, 0.0, 1.0, 1.0], shape=[1, 1, 4]),
            min_object_covered=preprocess.CROP_MIN_OBJECT_COVERED,
            aspect_ratio_range=preprocess.CROP_ASPECT_RANGE,
            area_range=preprocess.CROP_AREA_RANGE,
            max_attempts=preprocess.CROP_MAX_ATTEMPTS,
            use_image_if_no_bounding_boxes=True,
        )
        return tf.stack([begin[0], begin[1], size[0], size[1]])

    def crop(encoded):
        return tf.image.decode_and_crop_jpeg(encoded, window(encoded), channels=3)

    def tenth(encoded, top_fraction):
        shape = tf.image.extract_jpeg_shape(encoded)
        height = tf.maximum(shape[0] // 10, 1)
        top = tf.cast(top_fraction * tf.cast(shape[0] - height, tf.float32), tf.int32)
        window = tf.stack([top, 0, height, shape[1]])
        return tf.shape(tf.image.decode_and_crop_jpeg(encoded, window, channels=3))[0]

    def resized(encoded):
        image = preprocess._resize(crop(encoded), image_size)  # the library's own resize
        image.set_shape([image_size, image_size, 3])
        return image

    def flipped(encoded):
        image = preprocess._resize(tf.image.random_flip_left_right(crop(encoded)), image_size)
        image.set_shape([image_size, image_size, 3])
        return image

    return [
        ("ceiling", lambda e: tf.shape(tf.io.decode_jpeg(e, channels=3))[0]),
        ("crop", lambda e: tf.shape(crop(e))[0]),
        ("+ resize", lambda e: resized(e)[0, 0, 0]),
        ("+ flip, batch", flipped),
        ("+ normalise", lambda e: preprocess.train_image(e, image_size)),
        ("uint8 output", lambda e: preprocess.train_image(e, image_size, dtype="uint8")),
        ("eval", lambda e: preprocess.eval_image(e, image_size)),
        ("top tenth", lambda e: tenth(e, 0.0)),
        ("bottom tenth", lambda e: tenth(e, 1.0)),
    ]


def main(argv=None):
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--data", help="shards from the reader benchmark (default: write 1500)")
    parser.add_argument("--images", type=int, default=1500, help="records held in memory")
    parser.add_argument("--seconds", type=float, default=8.0, help="timed run per row")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--batch", type=int, default=128)
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf

    from benchmarks import reader_bench
    from tfrecord_pipe import reader, schema
    from tfrecord_pipe._reading import records
    from tfrecord_pipe._tools import bench

    data = args.data
    if data is None:
        data = tempfile.mkdtemp(prefix="reader-breakdown-")
        reader_bench.write_shards(pathlib.Path(data), args.images, 4)
    files = sorted(str(p) for p in pathlib.Path(data).glob("train-*.tfrecord"))
    spec = records.parse_spec(schema.ENCODED)
    encoded = [
        tf.io.parse_single_example(record, spec)[schema.ENCODED].numpy()
        for record in tf.data.TFRecordDataset(files).take(args.images)
    ]
    source = tf.data.Dataset.from_tensor_slices(encoded).cache().repeat()
    config = reader.ReaderConfig(data=data)  # for the reader's tf.data options and prefetch

    rows = []
    for name, fn in steps(args.image_size):
        dataset = source.map(fn, num_parallel_calls=tf.data.AUTOTUNE, deterministic=False)
        dataset = dataset.batch(args.batch, drop_remainder=True)
        dataset = dataset.prefetch(reader.prefetch_size(config))
        dataset = dataset.with_options(reader.data_options(config))
        result = bench.measure(name, dataset, args.seconds, lambda _: args.batch)
        rows.append((name, result.images_per_s))

    print("\n" + command_line("benchmarks.reader_breakdown", argv)
          + f"   ({os.cpu_count()} cores; {len(encoded)} JPEGs 256..480 px in memory; "
          f"{args.image_size}x{args.image_size}, batch {args.batch})")  # fmt: skip
    print("| step | images/s | / ceiling |")
    print("|---|---|---|")
    for name, rate in rows:
        print(f"| {name} | {rate:.0f} | {rate / rows[0][1]:.2f}x |")
    return rows


if __name__ == "__main__":
    main()
