"""Photo-like test images for the benchmarks: smooth gradients plus noise.

Flat colour fills compress to almost nothing and decode unrealistically fast; gradients with
sensor-like noise give JPEG sizes and decode costs close to real photos of the same size.
"""

from __future__ import annotations

import io

import numpy as np
from PIL import Image


def photo_like(rng: np.random.Generator, width: int, height: int) -> np.ndarray:
    """A height x width x 3 uint8 image: a random colour gradient with Gaussian noise."""
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    x /= width
    y /= height
    a, b, c = rng.uniform(0, 255, 3)
    base = np.stack([a * x, b * y, c * (1 - x) * y], axis=-1)
    noise = rng.normal(0, 18, (height, width, 3))
    return np.clip(base + noise, 0, 255).astype(np.uint8)


def photo_like_jpeg(rng: np.random.Generator, width: int, height: int, quality: int = 90) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(photo_like(rng, width, height)).save(buffer, format="JPEG", quality=quality)
    return buffer.getvalue()
