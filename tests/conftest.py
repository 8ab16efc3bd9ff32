"""Shared fixtures: small generated images, and a real local GCS (see local_gcs.py)."""

import io
import os
import pathlib

# Read by TensorFlow's GCS filesystem and google-auth when they are first loaded, so they must
# be set before anything imports them: fail fast instead of retrying for minutes offline.
os.environ.setdefault("GCS_RETRY_CONFIG_MAX_RETRIES", "2")
os.environ.setdefault("NO_GCE_CHECK", "true")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest  # noqa: E402
from PIL import Image  # noqa: E402

import local_gcs  # noqa: E402

# Real odd image files from Pillow's and libjpeg-turbo's test suites (licences beside them).
ODD_IMAGES = pathlib.Path(__file__).resolve().parent / "data" / "odd-images"


def jpeg_bytes(width: int = 8, height: int = 8, color=(200, 30, 30), quality: int = 90) -> bytes:
    """A small baseline RGB JPEG of one colour."""
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), color).save(buffer, format="JPEG", quality=quality)
    return buffer.getvalue()


@pytest.fixture(scope="session")
def gcs(tmp_path_factory):
    """A real GCS endpoint on 127.0.0.1 with bucket `test-bucket`, exported to this process.

    Fails (never skips) when it cannot start: a test that needs GCS must not pass without it.
    """
    with local_gcs.LocalGcs(tmp_path_factory.mktemp("gcs")) as server, server.exported():
        yield server
