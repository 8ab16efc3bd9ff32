"""The reader's preprocessing in numpy and OpenCV, for the Grain path: the same crops, decode
scales, resize and output as `_reading/preprocess.py` (every number from `core.crops`).

Evaluation gives the TensorFlow path's pixels within what two JPEG decoders differ by
(TensorFlow decodes with libjpeg's fast integer IDCT, OpenCV with its accurate one): the same
centre window, decoded at the same DCT scale, resized by the same arithmetic (bilinear with
half-pixel centres and no antialiasing, as `tf.image.resize` does), rounded the same way.
OpenCV rather than Pillow: it decodes straight into a numpy array, and its resize is ten
times faster than numpy's (benchmarks/RESULTS.md, "Grain").

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

from tfrecord_pipe._core import crops, extras

_SCALE = np.asarray([1 / s for s in crops.STDDEV_RGB], np.float32)
_SHIFT = np.asarray([-m / s for m, s in zip(crops.MEAN_RGB, crops.STDDEV_RGB)], np.float32)
# The same as an affine map of a pixel's channels, for OpenCV (`cv2.transform`): one pass.
_NORMALIZE = np.concatenate([np.diag(_SCALE), _SHIFT[:, None]], axis=1)


def eval_image(encoded: bytes, image_size: int, dtype: str = "float32",
               size: tuple[int, int] | None = None) -> np.ndarray:  # fmt: skip
    """The centre crop of a JPEG, resized to image_size x image_size x 3, as `dtype`.

    `size`: the JPEG's (height, width), when known (a record says it); else read from it.
    """
    crops.check_dtype(dtype)
    height, width = size or _jpeg_size(encoded)
    out = np.empty((image_size, image_size, 3), numpy_dtype(dtype))
    window = crops.centre_window(height, width, image_size)
    write(out, encoded, (height, width), window, False, dtype)
    return out


def train_image(encoded: bytes, image_size: int, rng: np.random.Generator,
                dtype: str = "float32", size: tuple[int, int] | None = None) -> np.ndarray:  # fmt: skip
    """A random crop of a JPEG (Inception-style), flipped at random, as image_size x
    image_size x 3; every choice drawn from `rng` (the window, then the flip). `size` as for
    `eval_image`."""
    crops.check_dtype(dtype)
    height, width = size or _jpeg_size(encoded)
    out = np.empty((image_size, image_size, 3), numpy_dtype(dtype))
    window = random_window(height, width, rng)
    write(out, encoded, (height, width), window, rng.random() < 0.5, dtype)
    return out


def write(out: np.ndarray, encoded: bytes, size: tuple[int, int], window, flip: bool,
          dtype: str) -> None:  # fmt: skip
    """Makes the crop `window` (top, left, height, width) of a JPEG of `size`, mirrored if
    `flip`, resized to `out`'s side, into `out` (an image of a batch, of `dtype`).

    Into the batch itself: a fresh image per record, then a copy into the batch, cost a
    fifth of the rate (benchmarks/RESULTS.md, "Grain").
    """
    cv2 = _cv2()
    image_size = out.shape[0]
    crop = _decode_crop(encoded, size, window, image_size)
    source = _scratch("crop", crop.shape)
    np.copyto(source, crop, casting="unsafe")  # uint8 to float32
    resized = out if out.dtype == np.float32 else _scratch("resized", out.shape)
    cv2.resize(source, (image_size, image_size), dst=resized, interpolation=cv2.INTER_LINEAR)
    # Mirrored after the resize, on the smaller image: the same pixels as TensorFlow's flip
    # before it (the resize is symmetric) within float rounding (a level, rarely, in uint8),
    # and a mirrored copy of the crop cost more than the resize.
    if flip:
        cv2.flip(resized, 1, dst=resized)
    if dtype == "uint8":  # bilinear resizing only averages: values stay in 0..255
        resized += np.float32(0.5)
    else:
        cv2.transform(resized, _NORMALIZE, dst=resized)
    if resized is not out:
        np.copyto(out, resized, casting="unsafe")  # to uint8 (truncating) or bfloat16


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
    return _normalize_in_place(images.astype(np.float32))


def _normalize_in_place(pixels: np.ndarray) -> np.ndarray:
    """`normalize` of a float32 array, in it."""
    if pixels.size % (_ROW * 3):
        pixels *= _SCALE
        pixels += _SHIFT
        return pixels
    # Whole rows of constants: numpy's inner loop then runs along a row, not the 3 channels
    # (four times faster).
    flat = pixels.reshape(-1, _ROW * 3)
    flat *= _SCALE_ROW
    flat += _SHIFT_ROW
    return pixels


_ROW = 64  # pixels per row of the constants
_SCALE_ROW, _SHIFT_ROW = np.tile(_SCALE, _ROW), np.tile(_SHIFT, _ROW)


def _cv2():
    try:
        import cv2
    except ImportError as err:
        raise ImportError(
            f"The Grain path decodes with OpenCV: {extras.how_to_install('grain')}."
        ) from err
    return cv2


def _jpeg_size(encoded: bytes) -> tuple[int, int]:
    """(height, width) from the JPEG's header, without decoding it."""
    with Image.open(io.BytesIO(encoded)) as image:
        if image.format != "JPEG":  # every record of the format holds one
            raise ValueError(f"the image is {image.format}, not a JPEG")
        return image.height, image.width


# OpenCV's imdecode flags for 3-channel RGB at 1/ratio (its IMREAD_REDUCED_* scale bits).
_REDUCED = {1: 0, 2: 16, 4: 32, 8: 64}


def _decode_crop(encoded: bytes, size, window, image_size: int) -> np.ndarray:
    """The crop `window` (top, left, height, width) of a JPEG of `size` as uint8 RGB, decoded
    at the DCT scale the TensorFlow path uses, the window taken in the scaled image's pixels.

    Raises:
      ValueError: the bytes do not decode, or not to `size` at that scale.
    """
    cv2 = _cv2()
    top, left, height, width = window
    ratio = crops.dct_ratio(height, width, image_size)
    flags = _REDUCED[ratio] | cv2.IMREAD_COLOR_RGB | cv2.IMREAD_IGNORE_ORIENTATION
    pixels = cv2.imdecode(np.frombuffer(encoded, np.uint8), flags)
    expected = tuple(crops.scaled_size(side, ratio) for side in size)
    if pixels is None or pixels.shape[:2] != expected:  # never a silently other window
        found = "nothing" if pixels is None else f"{pixels.shape[1]}x{pixels.shape[0]}"
        raise ValueError(
            f"the JPEG decoded at 1/{ratio} to {found}, not to {expected[1]}x{expected[0]}"
        )
    top, left = top // ratio, left // ratio
    return pixels[top : top + height // ratio, left : left + width // ratio]


_thread = threading.local()


def _scratch(name: str, shape: tuple[int, ...]) -> np.ndarray:
    """A float32 array of `shape`, this thread's, reused from image to image: a crop made
    float is a megabyte or more, and a fresh one cost a third of the decode in page faults.
    It keeps the size of the largest crop the thread has met."""
    size = math.prod(shape)
    buffers = _thread.__dict__.setdefault("buffers", {})
    kept = buffers.get(name)
    if kept is None or kept.size < size:
        kept = buffers[name] = np.empty(max(size, 1 << 20), np.float32)
    return kept[:size].reshape(shape)


def numpy_dtype(dtype: str):
    """The numpy dtype of one of crops.DTYPES."""
    if dtype == "bfloat16":
        import ml_dtypes  # comes with JAX and TensorFlow

        return ml_dtypes.bfloat16
    return np.dtype(dtype)


