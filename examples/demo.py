"""`make demo`: the end-to-end slice that exists today, on generated images, local disk only.

1. Generates a small labelled image folder (coloured shapes), with one corrupt file in it.
2. Converts it with the Beam job (beam_jobs.convert), exactly as a user would.
3. Reads the dataset back with tf.data and the record schema, and checks every record.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pathlib  # noqa: E402
import random  # noqa: E402

import tensorflow as tf  # noqa: E402
from PIL import Image, ImageDraw  # noqa: E402

from beam_jobs import convert  # noqa: E402
from tfrecord_pipe import manifest, schema  # noqa: E402

OUT = pathlib.Path("demo-output")
SHAPES = ("circle", "square", "triangle")


def draw(shape: str, rng: random.Random) -> Image.Image:
    """A 64x64 image of one shape, with random colours, position and size."""
    image = Image.new("RGB", (64, 64), tuple(rng.randrange(0, 120) for _ in range(3)))
    pen = ImageDraw.Draw(image)
    colour = tuple(rng.randrange(130, 256) for _ in range(3))
    size = rng.randrange(18, 30)
    x, y = rng.randrange(2, 62 - size), rng.randrange(2, 62 - size)
    if shape == "circle":
        pen.ellipse((x, y, x + size, y + size), fill=colour)
    elif shape == "square":
        pen.rectangle((x, y, x + size, y + size), fill=colour)
    else:
        pen.polygon([(x + size // 2, y), (x, y + size), (x + size, y + size)], fill=colour)
    return image


def generate(folder: pathlib.Path, per_label: int = 40) -> int:
    rng = random.Random(0)
    for shape in SHAPES:
        (folder / shape).mkdir(parents=True, exist_ok=True)
        for i in range(per_label):
            draw(shape, rng).save(folder / shape / f"{i:03d}.jpg", quality=90)
    good = (folder / "circle" / "000.jpg").read_bytes()
    (folder / "circle" / "corrupt.jpg").write_bytes(good[: len(good) // 2])  # cut short
    return per_label * len(SHAPES) + 1


def main():
    images_dir, dataset_dir = OUT / "images", OUT / "dataset"
    count = generate(images_dir)
    print(f"[1/3] generated {count} images in {images_dir} (one of them corrupt on purpose)")

    print(f"[2/3] converting with the Beam job: python -m beam_jobs.convert {images_dir} "
          f"{dataset_dir} --validation_fraction 0.2 --overwrite")
    result = convert.run([str(images_dir), str(dataset_dir), "--validation_fraction", "0.2",
                          "--num_shards", "2", "--overwrite"])

    print(f"[3/3] reading {dataset_dir} back with tf.data and schema.parse_spec()")
    seen = 0
    for split, info in result.splits.items():
        files = [str(dataset_dir / name) for name in info.files]
        dataset = tf.data.TFRecordDataset(files).map(
            lambda x: tf.io.parse_single_example(x, schema.parse_spec()))
        per_label = {}
        for parsed in dataset:
            image = tf.io.decode_jpeg(parsed[schema.ENCODED], channels=3)
            label = int(parsed[schema.LABEL]) - result.label_offset
            assert tuple(image.shape) == (64, 64, 3)
            assert result.labels[label] == parsed[schema.SYNSET].numpy().decode()
            per_label[result.labels[label]] = per_label.get(result.labels[label], 0) + 1
            seen += 1
        print(f"      {split:10s} {info.num_examples:3d} records in {len(info.files)} shards "
              f"{info.shard_lengths}; per label {dict(sorted(per_label.items()))}")
    for line in (dataset_dir / manifest.REJECTED_DIR).glob("*.jsonl"):
        for row in line.read_text().splitlines():
            print(f"      rejected: {row}")
    assert seen + result.num_rejected == count, "inputs were lost"
    print(f"demo: OK, {seen} records read back, {result.num_rejected} rejected, none lost")


if __name__ == "__main__":
    main()
