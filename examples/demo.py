"""`make demo`: the end-to-end slice that exists today, on generated images, local disk only.

Generates a few small labelled JPEGs, writes them as TFRecords with the project's record
schema, reads them back with tf.data and the schema's parse spec, and checks every record.
"""

import hashlib
import io
import pathlib

import tensorflow as tf
from PIL import Image

from tfrecord_pipe import schema

OUT = pathlib.Path("demo-output")
COLOURS = {"red": (220, 30, 30), "green": (30, 200, 40), "blue": (30, 40, 220)}


def generated_images():
    """Two 32x24 JPEGs per colour, with the colour as the label."""
    for label_index, (label, rgb) in enumerate(sorted(COLOURS.items())):
        for n in range(2):
            buffer = io.BytesIO()
            Image.new("RGB", (32, 24), rgb).save(buffer, format="JPEG", quality=95)
            data = buffer.getvalue()
            yield schema.ImageRecord(
                encoded=data, height=24, width=32, label_index=label_index, label_text=label,
                filename=f"{label}/{n}.jpg", sha256=hashlib.sha256(data).hexdigest(),
            )


def main():
    OUT.mkdir(exist_ok=True)
    path = OUT / "demo.tfrecord"
    written = list(generated_images())
    print(f"[1/2] writing {len(written)} generated images to {path}")
    with tf.io.TFRecordWriter(str(path)) as writer:
        for record in written:
            writer.write(schema.serialize(record))

    print(f"[2/2] reading {path} back with tf.data and schema.parse_spec()")
    dataset = tf.data.TFRecordDataset(str(path)).map(
        lambda x: tf.io.parse_single_example(x, schema.parse_spec())
    )
    for record, parsed in zip(written, dataset, strict=True):
        image = tf.io.decode_jpeg(parsed[schema.ENCODED], channels=3)
        label = int(parsed[schema.LABEL]) - schema.DEFAULT_LABEL_OFFSET
        assert label == record.label_index and tuple(image.shape) == (24, 32, 3)
        print(f"      {record.filename:12s} label={label} ({parsed[schema.SYNSET].numpy().decode()})"
              f" image={tuple(image.shape)}")
    print(f"demo: OK, {len(written)} records written and read back")


if __name__ == "__main__":
    main()
