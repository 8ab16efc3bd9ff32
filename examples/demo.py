"""`make demo`: the whole flow on generated images, on local disk, in about a minute.

1. Generates a labelled folder of shape images (circles, squares, triangles), one file corrupt.
2. Runs examples/train.py on it: the Beam conversion job, Keras fit under the strategy the
   machine has (CPU here), padded evaluation, SavedModel export, predictions from the loaded
   SavedModel on files from disk.
3. Checks that nothing was lost and that validation accuracy is well above chance.
"""

from tfrecord_pipe import tensorflow_start

# TensorFlow loaded as the `tfrecord-pipe` command loads it: without its start-up lines on a
# machine with no GPU ("failed call to cuInit", oneDNN notes), which read as failures and are
# not.
tensorflow_start.start()  # as the README shows it

import argparse  # noqa: E402
import pathlib  # noqa: E402
import random  # noqa: E402
import shutil  # noqa: E402

from PIL import Image, ImageDraw  # noqa: E402

from examples import train  # noqa: E402
from tfrecord_pipe import dataset  # noqa: E402

OUT = pathlib.Path("demo-output")
SHAPES = ("circle", "square", "triangle")


def draw(shape: str, rng: random.Random) -> Image.Image:
    """A 64x64 image of one large shape, with random colours, position and size."""
    image = Image.new("RGB", (64, 64), tuple(rng.randrange(0, 120) for _ in range(3)))
    pen = ImageDraw.Draw(image)
    colour = tuple(rng.randrange(130, 256) for _ in range(3))
    size = rng.randrange(30, 50)
    x, y = rng.randrange(2, 62 - size), rng.randrange(2, 62 - size)
    if shape == "circle":
        pen.ellipse((x, y, x + size, y + size), fill=colour)
    elif shape == "square":
        pen.rectangle((x, y, x + size, y + size), fill=colour)
    else:
        pen.polygon([(x + size // 2, y), (x, y + size), (x + size, y + size)], fill=colour)
    return image


def generate(folder: pathlib.Path, per_label: int) -> int:
    """Writes per_label images of each shape plus one corrupt file; returns the file count."""
    rng = random.Random(0)
    for shape in SHAPES:
        (folder / shape).mkdir(parents=True, exist_ok=True)
        for i in range(per_label):
            draw(shape, rng).save(folder / shape / f"{i:03d}.jpg", quality=90)
    good = (folder / "circle" / "000.jpg").read_bytes()
    (folder / "circle" / "corrupt.jpg").write_bytes(good[: len(good) // 2])  # cut short
    return per_label * len(SHAPES) + 1


def main(argv=None):
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--per_label", type=int, default=200)
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--out", default=str(OUT))
    args = parser.parse_args(argv)
    out = pathlib.Path(args.out)
    images_dir = out / "images"
    shutil.rmtree(images_dir, ignore_errors=True)
    count = generate(images_dir, args.per_label)
    print(f"demo: generated {count} images in {images_dir} (one of them corrupt on purpose)")

    result = train.main([str(images_dir), str(out), "--epochs", str(args.epochs)])

    found = dataset.read_manifest(str(out / "dataset"))
    written = sum(info.num_examples for info in found.splits.values())
    assert written + found.num_rejected == count, "inputs were lost"
    chance = 1 / len(found.labels)
    print(f"demo: {written} records written, {found.num_rejected} rejected "
          f"({dict(found.rejected_reasons)}), none lost")  # fmt: skip
    print(f"demo: validation accuracy {result['accuracy']:.2f} (chance {chance:.2f})")
    if result["accuracy"] < chance + 0.25:
        raise SystemExit("demo: FAILED, the model did not learn; accuracy is near chance")
    print("demo: OK")


if __name__ == "__main__":
    main()
