"""Image preprocessing in TensorFlow, shared by the reader (training and evaluation) and serving.

One module so that training, evaluation and the exported serving function cannot drift apart:
serving calls `eval_image`, exactly what evaluation runs, never the training augmentation.

Both paths decode only the part of the JPEG they keep (`tf.image.decode_and_crop_jpeg`), then
resize the crop to a fixed square. The output is in one of three dtypes:
- "float32" / "bfloat16": normalised with the ImageNet mean and standard deviation;
- "uint8": resized pixels rounded back to 0..255, four times fewer bytes to move to the
  accelerator; normalise there: `Normalize()` as the model's first layer, or `normalize` in
  the step function.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from tfrecord_pipe._core.crops import (  # noqa: F401 (MEAN_RGB, STDDEV_RGB: public here)
    CROP_AREA_RANGE,
    CROP_ASPECT_RANGE,
    CROP_MAX_ATTEMPTS,
    CROP_MIN_OBJECT_COVERED,
    CROP_PADDING,
    DCT_RATIOS,
    DTYPES,
    MEAN_RGB,
    STDDEV_RGB,
    check_dtype,
    dtype_problem,
)

# normalize(x) = x * _SCALE + _SHIFT, per channel.
_SCALE = np.asarray([1 / s for s in STDDEV_RGB], np.float32)
_SHIFT = np.asarray([-m / s for m, s in zip(MEAN_RGB, STDDEV_RGB)], np.float32)


@tf.autograph.experimental.do_not_convert
def train_image(
    encoded: tf.Tensor,
    image_size: int,
    dtype: str = "float32",
    color_jitter: float = 0.0,
    seed: tf.Tensor | None = None,
) -> tf.Tensor:
    """A random crop of a JPEG, flipped at random, as image_size x image_size x 3.

    Args:
      encoded: scalar string tensor, a JPEG (every record of the format is one).
      image_size: side of the square output, in pixels.
      dtype: one of DTYPES (see the module docstring).
      color_jitter: 0 for none; else the strength (0..1) of random brightness, contrast and
        saturation changes.
      seed: a [2] int tensor: every random choice (crop box, flip, jitter) is then a function
        of it alone (TensorFlow's stateless random ops), so the same seed gives the same
        pixels. None: fresh randomness on every call.

    Returns:
      A [image_size, image_size, 3] tensor of `dtype`.
    """
    check_dtype(dtype)
    crop_seed, flip_seed, jitter_seed = _seeds(seed, 3)
    shape = tf.image.extract_jpeg_shape(encoded)
    box = dict(
        bounding_boxes=tf.constant([0.0, 0.0, 1.0, 1.0], shape=[1, 1, 4]),
        min_object_covered=CROP_MIN_OBJECT_COVERED,
        aspect_ratio_range=CROP_ASPECT_RANGE,
        area_range=CROP_AREA_RANGE,
        max_attempts=CROP_MAX_ATTEMPTS,
        use_image_if_no_bounding_boxes=True,
    )
    if seed is None:
        begin, size, _ = tf.image.sample_distorted_bounding_box(shape, **box)
    else:
        begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
            shape, seed=crop_seed, **box
        )
    window = tf.stack([begin[0], begin[1], size[0], size[1]])
    # Flipped before resizing: bilinear resizing commutes with a mirror, and the uint8 crop
    # is a quarter of the bytes of the float32 output.
    image = _decode_crop(encoded, window, image_size)
    if seed is None:
        image = tf.image.random_flip_left_right(image)
    else:
        image = tf.image.stateless_random_flip_left_right(image, flip_seed)
    image = _resize(image, image_size)
    if color_jitter:
        image = _jitter(image, color_jitter, jitter_seed)
    return _finish(image, image_size, dtype)


def _seeds(seed: tf.Tensor | None, count: int) -> list[tf.Tensor | None]:
    """`count` independent [2] seeds made from `seed` (Nones without one)."""
    if seed is None:
        return [None] * count
    return list(tf.unstack(tf.random.experimental.stateless_split(seed, count)))


@tf.autograph.experimental.do_not_convert
def eval_image(encoded: tf.Tensor, image_size: int, dtype: str = "float32") -> tf.Tensor:
    """The centre crop of a JPEG, resized to image_size x image_size x 3.

    Deterministic: the same bytes always give the same pixels. Serving uses this too.

    Args:
      encoded: scalar string tensor, a JPEG.
      image_size: side of the square output, in pixels.
      dtype: one of DTYPES.

    Returns:
      A [image_size, image_size, 3] tensor of `dtype`.
    """
    check_dtype(dtype)
    shape = tf.image.extract_jpeg_shape(encoded)
    window = centre_window(shape[0], shape[1], image_size)
    image = _decode_crop(encoded, window, image_size)
    return _finish(_resize(image, image_size), image_size, dtype)


@tf.autograph.experimental.do_not_convert
def centre_window(height: tf.Tensor, width: tf.Tensor, image_size: int) -> tf.Tensor:
    """[top, left, side, side] of the evaluation crop: a centred square of the shorter side
    (`crops.centre_window`, in tensors)."""
    side = tf.cast(
        image_size / (image_size + CROP_PADDING) * tf.cast(tf.minimum(height, width), tf.float64),
        tf.int32,
    )
    side = tf.maximum(side, 1)
    return tf.stack([(height - side + 1) // 2, (width - side + 1) // 2, side, side])


@tf.autograph.experimental.do_not_convert
def normalize(images: tf.Tensor, dtype: tf.DType = tf.float32) -> tf.Tensor:
    """Subtracts the ImageNet mean and divides by its standard deviation, channels last.

    For "uint8" pipelines, call this on the accelerator (in the step function, or use the
    `Normalize` layer in the model), on NHWC images (transpose HWCN batches back first).
    """
    images = tf.cast(images, tf.float32)
    # A multiply-add with constants of the image's full shape: broadcasting a [3] vector over
    # channels takes Eigen's slow broadcast path on CPU (benchmarks/RESULTS.md, "Preprocessing").
    shape = images.shape
    if shape.is_fully_defined() and shape.num_elements() <= _MAX_FULL_CONSTANT:
        scale, shift = tf.constant(_full(shape, _SCALE)), tf.constant(_full(shape, _SHIFT))
    else:
        scale, shift = tf.constant(_SCALE), tf.constant(_SHIFT)
    return tf.cast(images * scale + shift, dtype)


_MAX_FULL_CONSTANT = 64 * 1024 * 1024  # elements (256 MB of float32): a batch of 224s is 19M


def _full(shape, per_channel):
    """A numpy array of `shape` (channels last) holding `per_channel` along the last axis."""
    return np.broadcast_to(np.asarray(per_channel, np.float32), shape.as_list()).copy()


# libjpeg crops from a column that starts an MCU (16 pixels wide in 4:2:0 and 4:2:2 JPEGs, 8 in
# 4:4:4 and grayscale); for any other left edge TensorFlow decodes each row into a scratch line
# and copies it into place. Asking for the crop from the MCU boundary to its left and slicing
# the extra columns off afterwards gives the same pixels, faster (benchmarks/RESULTS.md,
# "Preprocessing").
_MCU_WIDTH = 16


def _decode_crop(encoded: tf.Tensor, window: tf.Tensor, image_size: int) -> tf.Tensor:
    """The crop `window` ([top, left, height, width]) of a JPEG, decoded at the smallest useful scale."""
    side = tf.minimum(window[2], window[3])
    index = tf.reduce_sum(
        tf.cast(side >= tf.constant([2, 4, 8]) * image_size, tf.int32)
    )  # 0..3: how many halvings still leave the crop at least image_size on its shorter side

    def at(ratio):
        def decode():
            # The window is given in the scaled image's coordinates.
            top, left, height, width = tf.unstack(window // ratio)
            extra = left % _MCU_WIDTH
            aligned = tf.stack([top, left - extra, height, width + extra])
            image = tf.image.decode_and_crop_jpeg(encoded, aligned, channels=3, ratio=ratio)
            return image[:, extra : extra + width]

        return decode

    return tf.switch_case(index, [at(ratio) for ratio in DCT_RATIOS])


def _resize(image: tf.Tensor, image_size: int) -> tf.Tensor:
    """Bilinear resize of a decoded crop to the square output; float32 on the 0..255 scale.

    The crop is cast to float32 first: TensorFlow's float resize kernel is faster than its uint8
    one, even with the cast, and gives bit-identical results (benchmarks/RESULTS.md,
    "Preprocessing").
    """
    image = tf.cast(image, tf.float32)
    return tf.image.resize(image, [image_size, image_size], method=tf.image.ResizeMethod.BILINEAR)


def _jitter(image: tf.Tensor, strength: float, seed: tf.Tensor | None = None) -> tf.Tensor:
    """Random brightness, contrast and saturation, on the 0..255 float scale, clipped back;
    from `seed` alone when given (stateless ops)."""
    delta, low, high = strength * 255 * 0.4, 1 - 0.4 * strength, 1 + 0.4 * strength
    if seed is None:
        image = tf.image.random_brightness(image, max_delta=delta)
        image = tf.image.random_contrast(image, low, high)
        image = tf.image.random_saturation(image, low, high)
    else:
        brightness, contrast, saturation = _seeds(seed, 3)
        image = tf.image.stateless_random_brightness(image, delta, brightness)
        image = tf.image.stateless_random_contrast(image, low, high, contrast)
        image = tf.image.stateless_random_saturation(image, low, high, saturation)
    return tf.clip_by_value(image, 0.0, 255.0)


def _finish(image: tf.Tensor, image_size: int, dtype: str) -> tf.Tensor:
    """Fixes the static shape and converts to the output dtype."""
    image.set_shape([image_size, image_size, 3])
    if dtype == "uint8":
        # Bilinear resizing only averages pixels, so values stay in 0..255: round, no clip.
        return tf.cast(image + 0.5, tf.uint8)
    return normalize(image, tf.as_dtype(dtype))


class Normalize(tf.keras.layers.Layer):
    """`normalize` as a Keras layer: the first layer of a model fed "uint8" batches.

    Runs on the accelerator, so the host moves 1 byte per pixel instead of 4 (or 2). Works on
    every Keras 3 backend: TensorFlow runs `normalize` itself, others the same arithmetic in
    `keras.ops`.
    """

    def call(self, images):
        if tf.keras.backend.backend() == "tensorflow":
            return normalize(images, tf.float32)
        ops = tf.keras.ops
        return ops.cast(images, "float32") * _SCALE + _SHIFT
