"""Small datasets in the real on-disk format, written directly (no Beam) for reader tests.

Uses the library's own `schema.serialize` and `manifest.write`, so what the reader sees is
exactly what the converter writes, but with shard layouts chosen by the test.
"""

from __future__ import annotations

import hashlib
import io
import posixpath

import tensorflow as tf
from PIL import Image

from tfrecord_pipe import manifest, schema

# One colour per class, far apart so that a centre crop still shows which class it is.
COLORS = ((220, 40, 40), (40, 200, 40), (40, 40, 220), (220, 220, 40), (200, 40, 200))


def jpeg(width: int, height: int, color) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), color).save(buffer, format="JPEG", quality=90)
    return buffer.getvalue()


def write_dataset(
    folder: str,
    shards: dict[str, list[list[int]]],
    labels: tuple[str, ...] = ("red", "green", "blue"),
    label_offset: int = 1,
    compression: str = "",
    size: tuple[int, int] = (48, 36),
) -> manifest.Manifest:
    """Writes shards whose records carry the given 0-based label indices, then the manifest.

    Args:
      folder: dataset folder, local or gs://.
      shards: split name to a list of shards, each a list of label indices, one per record.
      labels: label texts.
      label_offset: added to each label index on write.
      compression: "" or "GZIP".
      size: (width, height) of every image.

    Returns:
      The manifest written.
    """
    tf.io.gfile.makedirs(folder)
    suffix = ".tfrecord.gz" if compression else ".tfrecord"
    splits = {}
    serial = 0
    for split, split_shards in shards.items():
        files, lengths, num_bytes = [], [], 0
        for number, shard in enumerate(split_shards):
            name = f"{split}-{number:05d}-of-{len(split_shards):05d}{suffix}"
            path = posixpath.join(folder, name)
            with tf.io.TFRecordWriter(path, options=compression or None) as writer:
                for index in shard:
                    serial += 1
                    filename = f"{labels[index]}/{serial}.jpg"
                    record = schema.ImageRecord(
                        encoded=jpeg(*size, COLORS[index % len(COLORS)]),
                        height=size[1],
                        width=size[0],
                        label_index=index,
                        label_text=labels[index],
                        filename=filename,
                        sha256=hashlib.sha256(filename.encode()).hexdigest(),
                    )
                    writer.write(schema.serialize(record, label_offset))
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
    manifest.write(folder, result)
    return result
