"""What the preprocessing is, whatever runs it: the crops, the DCT scale a crop is decoded at,
the ImageNet statistics, the output dtypes. TensorFlow (`_reading/preprocess.py`) and numpy
(`_grain/images.py`) implement it; both take every number from here.
"""

from __future__ import annotations

import math

# ImageNet statistics on the 0..255 scale, as in the Cloud TPU reference models.
MEAN_RGB = (0.485 * 255, 0.456 * 255, 0.406 * 255)
STDDEV_RGB = (0.229 * 255, 0.224 * 255, 0.225 * 255)

# Evaluation crops the centre (size / (size + CROP_PADDING)) of the shorter side, i.e. 224 of
# 256 at the default size: the standard ImageNet evaluation crop.
CROP_PADDING = 32

# Random crop of the training path (Inception-style), as in the reference ResNet preprocessing.
CROP_AREA_RANGE = (0.08, 1.0)
CROP_ASPECT_RANGE = (3 / 4, 4 / 3)
CROP_MIN_OBJECT_COVERED = 0.1
CROP_MAX_ATTEMPTS = 10

DTYPES = ("float32", "bfloat16", "uint8")

# libjpeg can decode at 1/2, 1/4 or 1/8 scale in the DCT, skipping most of the work (entropy
# decoding, which every scale pays, is the rest). Used when the crop is at least that many
# times the output side, so the decoded crop still needs shrinking (never enlarging) by the
# resize (benchmarks/RESULTS.md, "Preprocessing").
DCT_RATIOS = (1, 2, 4, 8)


def dtype_problem(dtype: str) -> str | None:
    """What is wrong with `dtype` as an output dtype, or None if it is one of DTYPES. A dtype
    object (`jnp.bfloat16`, `np.float32`, `tf.uint8`) is told to give its name."""
    if isinstance(dtype, str) and dtype in DTYPES:
        return None
    name = getattr(dtype, "__name__", None) or getattr(dtype, "name", None)
    hint = f": give its name, {name!r}" if isinstance(name, str) and name in DTYPES else ""
    return f"dtype must be one of {DTYPES}, got {dtype!r}{hint}"


def check_dtype(dtype: str) -> None:
    """Raises ValueError unless `dtype` is one of DTYPES."""
    if dtype_problem(dtype):
        raise ValueError(dtype_problem(dtype))


def centre_window(height: int, width: int, image_size: int) -> tuple[int, int, int, int]:
    """(top, left, side, side) of the evaluation crop: a centred square of the shorter side."""
    side = max(int(image_size / (image_size + CROP_PADDING) * float(min(height, width))), 1)
    return (height - side + 1) // 2, (width - side + 1) // 2, side, side


def dct_ratio(crop_height: int, crop_width: int, image_size: int) -> int:
    """The scale to decode a crop at: the most halvings that leave its shorter side at least
    `image_size`."""
    side = min(crop_height, crop_width)
    return DCT_RATIOS[sum(side >= k * image_size for k in (2, 4, 8))]


def scaled_size(size: int, ratio: int) -> int:
    """A side of a JPEG decoded at 1/ratio, as libjpeg rounds it."""
    return math.ceil(size / ratio)
