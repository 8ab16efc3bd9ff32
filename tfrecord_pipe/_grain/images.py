"""The reader's preprocessing in numpy and Pillow, for the Grain path: the same crops, decode
scales, resize and output as `_reading/preprocess.py` (every number from `core.crops`).

Evaluation gives the TensorFlow path's pixels within what two JPEG decoders differ by
(TensorFlow decodes with libjpeg's fast integer DCT, Pillow with its accurate one): the same
centre window, decoded at the same DCT scale, resized by the same arithmetic (bilinear with
half-pixel centres and no antialiasing, as `tf.image.resize` does), rounded the same way.

Training draws the Inception-style crop and the flip from a numpy Generator that Grain seeds
per record, so a record's augmentation is a function of the seed and its place in the stream,
as on the TensorFlow path (whose stateless random numbers are TensorFlow's own: the two paths
draw different crops from the same seed).
"""

from __future__ import annotations

import io
import math
import threading

import numpy as np
from PIL import Image

from tfrecord_pipe._core import crops

_SCALE = np.asarray([1 / s for s in crops.STDDEV_RGB], np.float32)
_SHIFT = np.asarray([-m / s for m, s in zip(crops.MEAN_RGB, crops.STDDEV_RGB)], np.float32)


def eval_image(encoded: bytes, image_size: int, dtype: str = "float32") -> np.ndarray:
    """The centre crop of a JPEG, resized to image_size x image_size x 3, as `dtype`."""
    crops.check_dtype(dtype)
    image = _open(encoded)
    width, height = image.size
    window = crops.centre_window(height, width, image_size)
    return _finish(_resize(_decode_crop(image, window, image_size), image_size), dtype)


def train_image(encoded: bytes, image_size: int, rng: np.random.Generator,
                dtype: str = "float32") -> np.ndarray:  # fmt: skip
    """A random crop of a JPEG (Inception-style), flipped at random, as image_size x
    image_size x 3; every choice drawn from `rng`."""
    crops.check_dtype(dtype)
    image = _open(encoded)
    width, height = image.size
    window = random_window(height, width, rng)
    crop = _decode_crop(image, window, image_size)
    if rng.random() < 0.5:
        crop = crop[:, ::-1]
    return _finish(_resize(crop, image_size), dtype)


def random_window(height: int, width: int, rng: np.random.Generator) -> tuple[int, int, int, int]:
    """(top, left, height, width) of an Inception-style crop: a random area share and aspect
    ratio in `crops`' ranges, covering at least CROP_MIN_OBJECT_COVERED of the image; the whole
    image when no attempt fits (as `tf.image.sample_distorted_bounding_box` does)."""
    area = height * width
    for _ in range(crops.CROP_MAX_ATTEMPTS):
        target = rng.uniform(*crops.CROP_AREA_RANGE) * area
        aspect = rng.uniform(*crops.CROP_ASPECT_RANGE)
        h = int(round(math.sqrt(target / aspect)))
        w = int(round(math.sqrt(target * aspect)))
        if 0 < h <= height and 0 < w <= width and h * w >= crops.CROP_MIN_OBJECT_COVERED * area:
            top = int(rng.integers(0, height - h + 1))
            left = int(rng.integers(0, width - w + 1))
            return top, left, h, w
    return 0, 0, height, width


def normalize(images: np.ndarray) -> np.ndarray:
    """`preprocess.normalize` in numpy: the ImageNet mean and deviation, channels last."""
    pixels = images.astype(np.float32)  # a copy, worked on in place
    flat = pixels.reshape(-1, _ROW * 3)  if pixels.size % (_ROW * 3) == 0 else None
    if flat is None:
        return pixels * _SCALE + _SHIFT
    # Whole rows of constants: numpy's inner loop then runs along a row, not the 3 channels.
    flat *= _SCALE_ROW
    flat += _SHIFT_ROW
    return pixels


_ROW = 64  # pixels per row of the constants
_SCALE_ROW, _SHIFT_ROW = np.tile(_SCALE, _ROW), np.tile(_SHIFT, _ROW)


def _open(encoded: bytes) -> Image.Image:
    image = Image.open(io.BytesIO(encoded))
    if image.format != "JPEG":  # every record of the format holds one
        raise ValueError(f"the record's image is {image.format}, not a JPEG")
    return image


def _decode_crop(image: Image.Image, window, image_size: int) -> np.ndarray:
    """The crop `window` (top, left, height, width) of a JPEG as uint8 RGB, decoded at the
    DCT scale the TensorFlow path uses, the window taken in the scaled image's pixels."""
    top, left, height, width = window
    ratio = crops.dct_ratio(height, width, image_size)
    full_width, full_height = image.size
    if ratio > 1:
        # Pillow picks the largest scale whose image is still at least the size asked for.
        image.draft("RGB", (full_width // ratio, full_height // ratio))
        expected = (crops.scaled_size(full_width, ratio), crops.scaled_size(full_height, ratio))
        if image.size != expected:  # not the scale TensorFlow decodes at: never silently
            raise ValueError(f"JPEG decoded at {image.size}, not at 1/{ratio}: {expected}")
    else:
        image.draft("RGB", None)
    pixels = np.asarray(image if image.mode == "RGB" else image.convert("RGB"))
    top, left = top // ratio, left // ratio
    return pixels[top : top + height // ratio, left : left + width // ratio]


def _axis(in_size: int, out_size: int):
    """Source indices and weights along one axis of a bilinear resize with half-pixel centres
    (TensorFlow's `compute_interpolation_weights`, in float32)."""
    scale = np.float32(in_size / out_size)
    where = (np.arange(out_size, dtype=np.float32) + np.float32(0.5)) * scale - np.float32(0.5)
    floor = np.floor(where)
    lower = np.maximum(floor, 0).astype(np.intp)
    upper = np.minimum(np.ceil(where), in_size - 1).astype(np.intp)
    return lower, upper, (where - floor).astype(np.float32)


_scratch = threading.local()


def _buffer(name: str, shape: tuple[int, ...], dtype) -> np.ndarray:
    """A thread's scratch array of `shape`, reused from call to call: the resize's temporaries
    are each hundreds of kilobytes, and fresh ones cost as much in page faults as the
    arithmetic (glibc returns such blocks to the system when freed)."""
    buffers = _scratch.__dict__.setdefault("buffers", {})
    size = math.prod(shape)
    kept = buffers.get(name)
    if kept is None or kept.size < size or kept.dtype != dtype:
        kept = buffers[name] = np.empty(max(size, 1 << 18), dtype)
    return kept[:size].reshape(shape)


def _resize(crop: np.ndarray, image_size: int) -> np.ndarray:
    """Bilinear resize to image_size x image_size, float32 on the 0..255 scale, as
    `tf.image.resize(..., BILINEAR)` computes it: each output pixel is
    top + (bottom - top) * y_lerp, with top and bottom interpolated along x first.

    Along x once per source row (the rows' interpolations are shared by the output rows
    that use them), then along y. The result is this thread's scratch: `_finish` copies it.
    """
    top, bottom, y_lerp = _axis(crop.shape[0], image_size)
    left, right, x_lerp = _axis(crop.shape[1], image_size)
    rows = np.union1d(top, bottom)  # the source rows used, sorted
    used = np.take(crop, rows, axis=0, out=_buffer("rows", (len(rows), *crop.shape[1:]), np.uint8))
    # Rows of image_size * 3 values: numpy's inner loops then run along whole rows, not
    # along the 3 channels (which made this four times slower).
    shape = (len(rows), image_size, 3)
    start = _buffer("start", shape, np.float32)
    end = _buffer("end", shape, np.float32)
    start[...] = np.take(used, left, axis=1, out=_buffer("left", shape, np.uint8))
    end[...] = np.take(used, right, axis=1, out=_buffer("right", shape, np.uint8))
    start, end = start.reshape(len(rows), -1), end.reshape(len(rows), -1)
    end -= start
    end *= np.repeat(x_lerp, 3)
    end += start  # the source rows interpolated along x
    out = (image_size, image_size * 3)
    upper = np.take(end, np.searchsorted(rows, top), axis=0, out=_buffer("upper", out, np.float32))
    lower = np.take(end, np.searchsorted(rows, bottom), axis=0, out=_buffer("lower", out, np.float32))
    lower -= upper
    lower *= y_lerp[:, None]
    lower += upper
    return lower.reshape(image_size, image_size, 3)


def _finish(image: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "uint8":  # bilinear resizing only averages: values stay in 0..255
        return (image + np.float32(0.5)).astype(np.uint8)
    normalised = normalize(image)
    if dtype == "bfloat16":
        import ml_dtypes  # comes with JAX and TensorFlow

        return normalised.astype(ml_dtypes.bfloat16)
    return normalised


def blank(image_size: int, dtype: str) -> np.ndarray:
    """The image of a padding example: zeros, as the tf.data reader's."""
    if dtype == "bfloat16":
        import ml_dtypes

        return np.zeros((image_size, image_size, 3), ml_dtypes.bfloat16)
    return np.zeros((image_size, image_size, 3), dtype)
