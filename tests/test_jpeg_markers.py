"""A JPEG the converter stores decodes in TensorFlow: damage that makes `tf.io.decode_jpeg`
fail is refused, with where it is, though Pillow's decoder would have taken the file."""

import random

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from benchmarks.photos import photo_like, photo_like_jpeg
from tfrecord_pipe._core import images, jpeg_markers

from helpers import ODD_IMAGES, encode, with_scans


def tensorflow_decodes(data: bytes) -> bool:
    try:
        tf.io.decode_jpeg(data, channels=3)
        return True
    except tf.errors.InvalidArgumentError:
        return False


def verdict(data: bytes) -> str:
    """'stored', or the reason and detail of the rejection."""
    try:
        stored = images.normalise(data)
    except images.Rejected as err:
        return f"{err.reason}: {err.detail}"
    assert stored.encoded == data  # every image here is stored byte for byte when it is used
    return "stored"


def photo(seed: int = 0, side: int = 64, **options) -> bytes:
    if not options:
        return photo_like_jpeg(np.random.default_rng(seed), side, side)
    return encode(photo_like(np.random.default_rng(seed), side, side), **options)


def scan_data(data: bytes) -> int:
    """Where the first scan's image data begins."""
    sos = data.index(b"\xff\xda")
    return sos + 2 + int.from_bytes(data[sos + 2 : sos + 4], "big")


def middle_of_the_data(data: bytes) -> int:
    at = (scan_data(data) + len(data)) // 2
    while data[at - 1] == 0xFF:  # not between a 0xFF and the byte it stuffs
        at += 1
    return at


def test_a_jpeg_without_its_end_marker_is_refused_as_truncated():
    # Pillow decodes some of these (the last bits of image data are there); TensorFlow reads
    # past the end looking for the marker and fails, in the middle of training.
    for seed in range(40):
        cut = photo(seed, side=32)[:-2]
        assert not tensorflow_decodes(cut)
        assert verdict(cut).startswith(
            "truncated: JPEG data is damaged: its image data ends before its end-of-image marker"
        ), seed


def _inserted(what: bytes) -> bytes:
    data = photo()
    at = middle_of_the_data(data)
    return data[:at] + what + data[at:]


def _frame_header(data: bytes) -> bytes:
    at = data.index(b"\xff\xc0")
    return data[at : at + 2 + int.from_bytes(data[at + 2 : at + 4], "big")]


def _scan_header(data: bytes) -> bytes:
    return data[data.index(b"\xff\xda") : scan_data(data)]


@pytest.mark.parametrize(
    "damaged, expected",
    [
        # A segment whose length runs past the end: Pillow took this one.
        (_inserted(b"\xff\xe4\xff\xf0"), "truncated: JPEG data is damaged: the segment at byte"),
        (_inserted(_scan_header(photo())), "a scan header out of place at byte"),
        (_inserted(b"\xff\x42"), "a marker 0xFF42 that has no place at byte"),
        (_inserted(b"\xff\xf0\x00\x02"), "a marker 0xFFF0 that has no place at byte"),
        (_inserted(b"\xff\xd8"), "a marker 0xFFD8 that has no place at byte"),
        (_inserted(_frame_header(photo())), "a second frame header at byte"),
        # libjpeg decodes this one with its blocks after the marker grey: damaged all the same.
        (_inserted(b"\xff\xd0"), "a restart marker out of order at byte"),
    ],
)
def test_damage_the_markers_show_is_refused_saying_where(damaged, expected):
    assert expected in verdict(damaged)


def test_damage_past_the_decoders_first_block_is_found():
    # Fed 64 KiB at a time, libjpeg stopped once every row was out: a bad table after a long
    # comment after the image data went unseen, and TensorFlow, which reads on, failed.
    comment = b"\xff\xfe" + (65000).to_bytes(2, "big") + b"x" * 64998
    bad_table = b"\xff\xc4\x00\x05\x00\x00\x00"
    damaged = photo()[:-2] + comment + bad_table + b"\xff\xd9"
    assert not tensorflow_decodes(damaged)
    assert verdict(damaged).startswith("not_an_image: JPEG data cannot be decoded")


def test_an_arithmetic_coded_jpeg_larger_than_the_decoders_block_is_stored(monkeypatch):
    # libjpeg cannot pause inside arithmetic-coded data: fed in blocks, a sound file failed.
    from PIL import ImageFile

    data = (ODD_IMAGES / "testimgari.jpg").read_bytes()
    monkeypatch.setattr(ImageFile, "MAXBLOCK", 1024)  # the file is 5 KiB
    assert verdict(data) == "stored"


def test_tables_before_the_image_are_refused():
    # Pillow skips a datastream of tables alone and decodes the image after it; TensorFlow
    # finds no image.
    damaged = b"\xff\xd8\xff\xd9" + photo()
    assert not tensorflow_decodes(damaged)
    assert "an end-of-image marker before any image data at byte 2" in verdict(damaged)


@pytest.mark.parametrize("frame", [0xC3, 0xC5, 0xCB])
def test_lossless_and_hierarchical_jpegs_are_refused_undecoded(frame):
    # TensorFlow cannot decode them, and Pillow's 1/8-scale decode of a lossless one corrupted
    # the worker's memory (the process aborted): the frame type alone decides.
    data = photo()
    at = data.index(b"\xff\xc0")
    other = data[:at] + bytes([0xFF, frame]) + data[at + 2 :]
    assert not tensorflow_decodes(other)
    assert verdict(other).startswith(f"unsupported_jpeg: a lossless or hierarchical JPEG "
                                     f"(frame type 0x{frame:02X})")  # fmt: skip


@pytest.mark.parametrize(
    "sound",
    [
        photo() + b"bytes after the end-of-image marker",
        photo()[:-2] + b"\xff\xfe\x00\x07a note\xff\xd9",  # a comment after the image data
        photo()[:-2] + b"\xff\xff\xff\xd9",  # fill bytes before the end marker
    ],
)
def test_sound_files_of_unusual_layout_are_stored_byte_for_byte(sound):
    assert tensorflow_decodes(sound)
    assert verdict(sound) == "stored"


@pytest.mark.parametrize(
    "where, value",
    [
        ("scan", 0x33),  # the first component's Huffman tables: undefined ones
        ("huffman", 0xFF),  # 255 one-bit codes: no Huffman table
        ("quantisation", 0x05),  # a table number out of range
        ("frame", 0x55),  # the first component's sampling factors
    ],
)
def test_a_plain_file_with_damaged_headers_is_refused(where, value):
    # Of a plain file only the headers are decoded: libjpeg still judges every one of them.
    data = photo()
    assert jpeg_markers.walk(data).plain
    offset = {"scan": data.index(b"\xff\xda") + 6, "huffman": data.index(b"\xff\xc4") + 5,
              "quantisation": data.index(b"\xff\xdb") + 4,
              "frame": data.index(b"\xff\xc0") + 11}[where]  # fmt: skip
    damaged = data[:offset] + bytes([value]) + data[offset + 1 :]
    assert not tensorflow_decodes(damaged)
    assert verdict(damaged).startswith("not_an_image: JPEG data cannot be decoded")


ENCODINGS = [
    {},
    {"progressive": True},
    {"restart_marker_blocks": 3},
    {"progressive": True, "restart_marker_rows": 1},
    {"optimize": True, "subsampling": 0},
]


@pytest.mark.parametrize("options", ENCODINGS, ids=lambda o: ",".join(o) or "baseline")
def test_whatever_the_damage_every_jpeg_stored_decodes_in_tensorflow(options):
    # Before the marker walk, 44 of 2,100 such damaged files (320 px photos) were stored and
    # then failed in TensorFlow.
    rng = random.Random(repr(options))
    data = photo(side=48, quality=90, **options)
    assert verdict(data) == "stored"
    stored = 0
    for _ in range(60):
        damaged = bytearray(data)
        kind = rng.choice(["bytes", "block", "marker", "cut"])
        if kind == "bytes":
            for _ in range(rng.randint(1, 6)):
                damaged[rng.randrange(2, len(data))] = rng.randrange(256)
        elif kind == "block":
            at = rng.randrange(2, len(data) - 8)
            damaged[at : at + rng.randint(1, 200)] = rng.randbytes(rng.randint(1, 200))
        elif kind == "marker":
            at = rng.randrange(2, len(data) - 2)
            damaged[at : at + 2] = bytes([0xFF, rng.randrange(256)])
        else:
            del damaged[rng.randrange(2, len(data) - 1) :]
        if verdict(bytes(damaged)) == "stored":
            stored += 1
            assert tensorflow_decodes(bytes(damaged)), (kind, bytes(damaged).hex())
    assert stored > 5  # damage no marker shows is stored, as TensorFlow decodes it


def test_the_walk_knows_a_plain_file_from_one_that_needs_decoding_whole():
    plain = [photo(), photo(restart_marker_blocks=2), photo(optimize=True)]
    whole = [photo(progressive=True), (ODD_IMAGES / "testimgari.jpg").read_bytes()]
    assert all(jpeg_markers.walk(data).plain for data in plain)
    assert not any(jpeg_markers.walk(data).plain for data in whole)
    assert jpeg_markers.walk(encode(Image.new("RGB", (4, 4)), "PNG")) == jpeg_markers.Layout()


def _with_frame_size(data: bytes, width: int, height: int) -> bytes:
    at = data.index(b"\xff\xc0") + 5  # the frame header's height, then width
    return data[:at] + height.to_bytes(2, "big") + width.to_bytes(2, "big") + data[at + 4 :]


def test_a_plain_file_is_stored_at_its_own_size():
    # libjpeg judges a plain file's headers with a frame of one pixel; the size is the frame's.
    data = photo_like_jpeg(np.random.default_rng(1), width=40, height=24)
    assert jpeg_markers.walk(data).plain
    stored = images.normalise(data)
    assert (stored.height, stored.width, stored.encoded) == (24, 40, data)


@pytest.mark.parametrize(
    "width, height, expected",
    [
        (64, 0, "a frame of 64x0 pixels, which libjpeg cannot decode"),
        (0, 64, "a frame of 0x64 pixels, which libjpeg cannot decode"),
        (65501, 1, "libjpeg decodes at most 65500 pixels a side"),
    ],
)
def test_a_frame_size_libjpeg_refuses_is_refused(width, height, expected):
    data = _with_frame_size(photo(), width, height)
    assert not tensorflow_decodes(data)
    assert verdict(data).startswith("unsupported_jpeg: ") and expected in verdict(data)


@pytest.mark.parametrize("pillows_limit", [Image.MAX_IMAGE_PIXELS, None])
def test_a_plain_file_declaring_more_pixels_than_tensorflow_decodes_is_refused(
    monkeypatch, pillows_limit
):
    # Image.open would refuse it, but opens the headers alone at one pixel: the limit still
    # holds when the user lifts the converter's cap (--max_pixels), and Pillow's is lifted
    # (None, which Pillow documents: it crashed every check).
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", pillows_limit)
    data = _with_frame_size(photo(), 20000, 20000)  # 400 megapixels
    with pytest.raises(images.Rejected, match="tf.io.decode_jpeg decodes at most") as err:
        images.normalise(data, images.ImagePolicy(max_pixels=10**9))
    assert err.value.reason == images.TOO_MANY_PIXELS


@pytest.mark.slow
def test_the_most_pixels_stored_are_the_most_tensorflow_decodes():
    # 3277 x 54610 = MOST_DECODABLE_PIXELS: decoded (537 MB); 13378 x 13378 is refused (by
    # TensorFlow before it allocates anything). A TensorFlow that moves its limit fails here.
    lifted = images.ImagePolicy(max_pixels=10**9)
    largest = _with_frame_size(photo(side=16), 3277, 54610)
    assert 3277 * 54610 == images.MOST_DECODABLE_PIXELS
    assert images.normalise(largest, lifted).encoded == largest
    assert tensorflow_decodes(largest)
    over = _with_frame_size(photo(side=16), 13378, 13378)
    assert not tensorflow_decodes(over)
    with pytest.raises(images.Rejected, match="decodes at most"):
        images.normalise(over, lifted)


def test_every_header_byte_damaged_what_is_stored_decodes_in_tensorflow():
    # A sweep of a plain file's headers, each byte set to values that break lengths, counts,
    # table numbers and sizes: what the one-pixel frame lets through, TensorFlow decodes.
    data = photo(side=24)
    headers_end = scan_data(data)
    stored = 0
    for at in range(2, headers_end):
        for value in {0x00, 0x01, 0x10, 0x7F, 0xFF, data[at] ^ 0x01} - {data[at]}:
            damaged = data[:at] + bytes([value]) + data[at + 1 :]
            if verdict(damaged) == "stored":
                stored += 1
                assert tensorflow_decodes(damaged), (at, value)
    assert stored > 100  # changed table values and comments are still sound files


def test_a_jpeg_of_more_scans_than_encoders_write_is_refused_undecoded():
    # A progressive file's last scan repeated 300 times took 4 s to store (10 s to serve) at
    # 4,000 px: each scan makes libjpeg pass over the whole image again (a helper's trial).
    progressive = photo(side=48, progressive=True)
    assert verdict(with_scans(progressive, jpeg_markers.MAX_SCANS)) == "stored"
    assert verdict(with_scans(progressive, jpeg_markers.MAX_SCANS + 1)) == (
        "unsupported_jpeg: a JPEG of more than 100 scans, each of which the decoder passes "
        "over the whole image for (a file made to hold a decoder). Save it again.")  # fmt: skip
