"""One record to one example: parse the two features needed, decode, preprocess, check the
label; evaluation examples carry a weight."""

from __future__ import annotations

import tensorflow as tf

from tfrecord_pipe._core import schema
from tfrecord_pipe._reading import preprocess, records

def parse_fn(config, source, image_fn=None):
    """Record (and, seeded, the example's augmentation seed) to (image, label[, weight]):
    parse the two keys needed, decode, preprocess."""
    spec = records.parse_spec(schema.ENCODED, schema.LABEL)
    offset = source.label_offset
    num_classes = source.num_classes

    def parse(record, seed=None):
        features = tf.io.parse_single_example(record, spec)
        encoded = features[schema.ENCODED]
        if image_fn is not None:
            image = checked_image(image_fn(encoded), config)
        elif config.is_training:
            image = preprocess.train_image(
                encoded, config.image_size, config.dtype, config.color_jitter, seed
            )
        else:
            image = preprocess.eval_image(encoded, config.image_size, config.dtype)
        label = features[schema.LABEL] - offset
        checks = [
            tf.debugging.assert_non_negative(
                label, message=f"Label below 0 after subtracting label_offset={offset}"
            )
        ]
        if num_classes is not None:
            checks.append(
                tf.debugging.assert_less(
                    label,
                    tf.constant(num_classes, tf.int64),
                    message=f"Label not below num_classes={num_classes} (label_offset={offset})",
                )
            )
        with tf.control_dependencies(checks):
            label = tf.cast(label, tf.int32)
        if config.padded:
            return image, label, tf.constant(1.0)
        return image, label

    return converted_for(image_fn, parse)


def converted_for(image_fn, fn):
    """`fn`, which calls `image_fn`: left to autograph where there is one (a user's Python
    control flow on tensors becomes graph ops), else not converted, as the rest of our graph
    code (docs/development.md)."""
    return fn if image_fn is not None else tf.autograph.experimental.do_not_convert(fn)


@tf.autograph.experimental.do_not_convert
def checked_image(image, config):
    """image_fn's result, if it has the config's static shape and dtype (checked when traced)."""
    expected = (config.image_size, config.image_size, 3)
    if image.dtype != tf.as_dtype(config.dtype) or not image.shape.is_compatible_with(expected):
        raise ValueError(
            f"image_fn returned {image.dtype.name} {image.shape}; the config asks for "
            f"{config.dtype} {list(expected)}. Resize/crop to image_size and cast to dtype."
        )
    return tf.ensure_shape(image, expected)
