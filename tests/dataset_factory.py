"""Small datasets in the real on-disk format, written directly (no Beam) for reader tests.

Uses the library's own `schema.serialize` and `dataset.write_manifest`, so what the reader
sees is exactly what the converter writes, but with shard layouts chosen by the test.
"""

from __future__ import annotations

import hashlib

import tensorflow as tf

from tfrecord_pipe._core import manifest, naming, paths, schema
from tfrecord_pipe._reading import dataset

from helpers import COLOURS, RGB, jpeg_bytes


def write_dataset(
    folder: str,
    shards: dict[str, list[list[int]]],
    labels: tuple[str, ...] = RGB,
    label_offset: int = 1,
    compression: str = "",
    size: tuple[int, int] = (48, 36),
    noisy: bool = False,
) -> manifest.Manifest:
    """Writes shards whose records carry the given 0-based label indices, then the manifest.

    Args:
      folder: dataset folder, local or gs://.
      shards: split name to a list of shards, each a list of label indices, one per record.
      labels: label texts; label i's images have the i-th colour of COLOURS.
      label_offset: added to each label index on write.
      compression: "" or "GZIP".
      size: (width, height) of every image.
      noisy: images of random pixels (JPEGs of realistic size) instead of one colour.

    Returns:
      The manifest written.
    """
    tf.io.gfile.makedirs(folder)
    colours = list(COLOURS.values())
    splits = {}
    serial = 0
    for split, split_shards in shards.items():
        files, lengths, num_bytes = [], [], 0
        for number, shard in enumerate(split_shards):
            name = naming.shard_name(split, number, len(split_shards), bool(compression))
            path = paths.join(folder, name)
            with tf.io.TFRecordWriter(path, options=compression or None) as writer:
                for index in shard:
                    serial += 1
                    filename = f"{labels[index]}/{serial}.jpg"
                    record = schema.ImageRecord(
                        encoded=(noise_jpeg(size, serial) if noisy
                                 else jpeg_bytes(*size, colours[index % len(colours)])),
                        height=size[1],
                        width=size[0],
                        label_index=index,
                        label_text=labels[index],
                        filename=filename,
                        sha256=hashlib.sha256(filename.encode()).hexdigest(),
                    )
                    writer.write(schema.serialize(record, label_offset=label_offset))
            files.append(name)
            lengths.append(len(shard))
            num_bytes += tf.io.gfile.stat(path).length
        splits[split] = manifest.SplitInfo(
            num_examples=sum(lengths),
            shard_lengths=tuple(lengths),
            num_bytes=num_bytes,
            listed=sum(lengths),
            rejected=0,
            files=tuple(files),
        )
    result = manifest.Manifest(
        labels=tuple(labels),
        label_offset=label_offset,
        compression=compression,
        splits=splits,
    )
    dataset.write_manifest(folder, result)
    return result


def noise_jpeg(size: tuple[int, int], seed: int) -> bytes:
    """A JPEG of random pixels: it compresses about as badly as a photo does."""
    import io

    import numpy as np
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "JPEG", quality=90)
    return out.getvalue()


def read_split(folder: str, split: str) -> list[schema.ImageRecord]:
    """Every record of a split, read in plain Python (not through the reader under test)."""
    found = dataset.read_manifest(folder)
    return [
        schema.decode_example(raw.numpy(), label_offset=found.label_offset)
        for name in found.splits[split].files
        for raw in tf.data.TFRecordDataset(
            paths.join(folder, name), compression_type=found.compression
        )
    ]


def accuracy_on(model, folder: str, image_size: int, split: str = naming.VALIDATION) -> float:
    """The model's accuracy on every record of a split, each counted once, computed here with
    the evaluation preprocessing: what a padded evaluation must report."""
    import numpy as np

    logits, labels = _logits_on(model, folder, image_size, split)
    return float(np.mean(np.argmax(logits, axis=1) == labels))


def loss_on(model, folder: str, image_size: int, split: str = naming.VALIDATION) -> float:
    """The model's mean cross-entropy (it gives logits) over every record of a split, each
    once: what a padded evaluation must report as its loss."""
    logits, labels = _logits_on(model, folder, image_size, split)
    losses = tf.keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)
    return float(tf.reduce_mean(losses))


def _logits_on(model, folder, image_size, split):
    import numpy as np

    from tfrecord_pipe._reading import preprocess

    found = read_split(folder, split)
    images = tf.stack([preprocess.eval_image(r.encoded, image_size) for r in found])
    return model.predict(images, verbose=0), np.array([r.label_index for r in found])
