"""Every input becomes an upright RGB JPEG that TF decodes, or a rejection with a clear reason."""

import io
import struct
import zlib

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from tfrecord_pipe._core import images, jpeg_markers

from helpers import ODD_IMAGES, encode, jpeg_bytes


def odd(name: str) -> bytes:
    return (ODD_IMAGES / name).read_bytes()


def pixels(jpeg: bytes) -> np.ndarray:
    return tf.io.decode_jpeg(jpeg, channels=3).numpy().astype(np.float64)


@pytest.mark.parametrize(
    "name",
    ["hopper.jpg", "pil_sample_rgb.jpg", "app13-multiple.jpg", "icc_profile_big.jpg",
     "exif_typeerror.jpg", "testimgari.jpg"],
)
def test_good_rgb_jpegs_are_stored_byte_for_byte(name):
    stored = images.normalise(odd(name))
    assert stored.encoded == odd(name)
    assert not stored.reencoded
    assert pixels(stored.encoded).shape == (stored.height, stored.width, 3)


@pytest.mark.parametrize(
    "name", ["hopper.png", "hopper.gif", "hopper.webp", "hopper.bmp", "hopper.tif"]
)
def test_other_formats_become_jpegs_that_look_like_the_original(name):
    stored = images.normalise(odd(name))
    assert stored.encoded[:2] == b"\xff\xd8"
    decoded = pixels(stored.encoded)
    assert decoded.shape == (128, 128, 3)
    # tf.io.decode_jpeg alone would give 4-D output for WebP and fail on BMP/TIFF.
    reference = pixels(odd("hopper.jpg"))
    assert np.abs(decoded - reference).mean() < 12


def test_colour_profiles_are_kept_never_applied_whatever_the_format():
    # One rule for every format: a JPEG is stored with its profile, a PNG with the same profile
    # used to lose it on re-encoding (the same picture then looked different by format).
    profile = Image.open(io.BytesIO(odd("pil_sample_rgb.jpg"))).info["icc_profile"]
    assert profile[16:20] == b"RGB "
    hopper = Image.open(io.BytesIO(odd("hopper.png"))).convert("RGB")
    with_profile = images.normalise(encode(hopper, "PNG", icc_profile=profile))
    without = images.normalise(encode(hopper, "PNG"))
    assert Image.open(io.BytesIO(with_profile.encoded)).info["icc_profile"] == profile
    # The samples are the input's: the profile is not applied.
    assert np.array_equal(pixels(with_profile.encoded), pixels(without.encoded))
    # A grey image's profile would not describe the RGB samples it becomes: dropped.
    grey = images.normalise(encode(hopper.convert("L"), "PNG", icc_profile=profile[:16] + b"GRAY"
                                   + profile[20:]))  # fmt: skip
    assert "icc_profile" not in Image.open(io.BytesIO(grey.encoded)).info


def test_other_formats_can_be_refused_by_policy():
    with pytest.raises(images.Rejected) as err:
        images.normalise(odd("hopper.png"), images.ImagePolicy(allow_other_formats=False))
    assert err.value.reason == images.NOT_ALLOWED_FORMAT
    assert "PNG" in err.value.detail


def test_cmyk_jpeg_is_stored_as_rgb_that_looks_like_its_rgb_twin():
    stored = images.normalise(odd("pil_sample_cmyk.jpg"))
    assert stored.reencoded and "from CMYK" in stored.changes
    difference = np.abs(pixels(stored.encoded) - pixels(odd("pil_sample_rgb.jpg"))).mean()
    assert difference < 10, difference


def test_grayscale_jpeg_is_stored_with_three_channels():
    stored = images.normalise(odd("hopper_gray.jpg"))
    assert Image.open(io.BytesIO(stored.encoded)).mode == "RGB"
    decoded = pixels(stored.encoded)
    assert np.array_equal(decoded[..., 0], decoded[..., 1])


@pytest.mark.parametrize("orientation", [3, 6, 8])
def test_exif_rotated_jpegs_are_stored_upright_once(orientation):
    source = odd(f"hopper_orientation_{orientation}.jpg")
    stored = images.normalise(source)
    upright = pixels(odd("hopper.jpg"))
    assert np.abs(pixels(stored.encoded) - upright).mean() < 10
    # Without the rotation the stored pixels would be far from upright.
    assert np.abs(pixels(source) - upright).mean() > 30
    # And the orientation tag is gone, so no reader can rotate it a second time.
    assert Image.open(io.BytesIO(stored.encoded)).getexif().get(0x0112, 1) == 1


def test_truncated_jpeg_is_rejected_as_truncated():
    with pytest.raises(images.Rejected) as err:
        images.normalise(odd("truncated_jpeg.jpg"))
    assert err.value.reason == images.TRUNCATED


def test_twelve_bit_jpeg_is_rejected_with_the_real_reason():
    with pytest.raises(images.Rejected) as err:
        images.normalise(odd("monkey12.jpg"))
    assert err.value.reason == images.UNSUPPORTED_JPEG
    assert "12-bit" in err.value.detail


@pytest.mark.parametrize(
    "data, reason",
    [(b"", images.EMPTY_FILE), (b"just,some,csv\n1,2,3\n", images.NOT_AN_IMAGE),
     (b"\xff\xd8\xff\xe0 not really a jpeg", images.TRUNCATED)],
)
def test_non_images_are_rejected(data, reason):
    with pytest.raises(images.Rejected) as err:
        images.normalise(data)
    assert err.value.reason == reason


def png_claiming(width: int, height: int) -> bytes:
    """A tiny PNG whose header claims a huge size: a decompression bomb's calling card."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header)
            + chunk(b"IDAT", zlib.compress(b"\x00" * 64)) + chunk(b"IEND", b""))


@pytest.mark.parametrize("side", [20_000, 200_000])
def test_decompression_bombs_are_rejected_before_decoding(side):
    with pytest.raises(images.Rejected) as err:
        images.normalise(png_claiming(side, side))
    assert err.value.reason == images.TOO_MANY_PIXELS


def test_pixel_cap_is_configurable():
    with pytest.raises(images.Rejected) as err:
        images.normalise(jpeg_bytes(40, 30), images.ImagePolicy(max_pixels=1000))
    assert err.value.reason == images.TOO_MANY_PIXELS
    assert "1200" in err.value.detail


def test_an_image_wider_than_a_jpeg_holds_is_refused_saying_so_or_downscaled():
    # Re-encoded as it was, a 65,501 px wide PNG failed in libjpeg: a bare OSError, logged
    # with a traceback and rejected as unexpected_error.
    wide = encode(Image.new("RGB", (65_501, 2)), "PNG")
    with pytest.raises(images.Rejected) as err:
        images.normalise(wide)
    assert err.value.reason == images.TOO_MANY_PIXELS and "--max_side" in err.value.detail
    stored = images.normalise(wide, images.ImagePolicy(max_side=1000))
    assert (stored.width, stored.height) == (1000, 1)
    with pytest.raises(images.Rejected, match="set --max_side .* to 65500 or less"):
        images.normalise(wide, images.ImagePolicy(max_side=70_000))


def test_max_side_downscales_keeping_aspect():
    stored = images.normalise(jpeg_bytes(400, 100), images.ImagePolicy(max_side=100))
    assert (stored.width, stored.height) == (100, 25)
    assert pixels(stored.encoded).shape == (25, 100, 3)


def test_max_side_leaves_small_images_byte_for_byte():
    source = jpeg_bytes(64, 48)
    assert images.normalise(source, images.ImagePolicy(max_side=64)).encoded == source


def test_transparent_png_is_flattened_on_white():
    rgba = Image.new("RGBA", (16, 16), (0, 0, 0, 0))
    stored = images.normalise(encode(rgba, "PNG"))
    assert pixels(stored.encoded).mean() > 250


def test_animated_gif_keeps_the_first_frame():
    frames = [Image.new("RGB", (16, 16), c) for c in ((250, 0, 0), (0, 0, 250))]
    data = encode(frames[0], "GIF", save_all=True, append_images=frames[1:])
    stored = images.normalise(data)
    assert "first frame only" in stored.changes
    red, _, blue = pixels(stored.encoded).mean(axis=(0, 1))
    assert red > 200 and blue < 50


def test_sixteen_bit_png_is_scaled_to_eight_bits():
    wide = Image.fromarray(np.full((8, 8), 40000, dtype=np.uint16))
    stored = images.normalise(encode(wide, "PNG"))
    assert abs(pixels(stored.encoded).mean() - 40000 / 256) < 3


@pytest.mark.parametrize(
    "kwargs, field",
    [({"max_side": 0}, "max_side"), ({"jpeg_quality": 101}, "jpeg_quality"),
     ({"max_pixels": 0}, "max_pixels")],
)
def test_policy_rejects_bad_values_naming_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        images.ImagePolicy(**kwargs)


def test_the_marker_walk_reads_the_precision_from_the_frame_header():
    assert jpeg_markers.walk(jpeg_bytes()).precision == 8
    assert jpeg_markers.walk(odd("monkey12.jpg")).precision == 12
    assert jpeg_markers.walk(b"\x89PNG").precision is None


@pytest.mark.parametrize("orientation", [0, 9, 65535])
def test_an_invalid_exif_orientation_is_upright_and_stored_as_it_is(orientation):
    exif = Image.Exif()
    exif[0x0112] = orientation
    source = encode(Image.new("RGB", (16, 8), (10, 200, 30)), exif=exif.tobytes())
    stored = images.normalise(source)
    assert not any("orientation" in change for change in stored.changes)
    assert stored.encoded == source and (stored.width, stored.height) == (16, 8)
