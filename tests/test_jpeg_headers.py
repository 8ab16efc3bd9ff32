"""A plain upright RGB JPEG is stored without Pillow's reading of its headers
(`jpeg_headers`), and every input is decided exactly as Pillow's reading decides it."""

import random

import numpy as np
import pytest
from PIL import Image

from benchmarks.photos import photo_like
from tfrecord_pipe._core import images, jpeg_headers

from helpers import ODD_IMAGES, encode


def outcome(data: bytes) -> tuple:
    try:
        stored = images.normalise(data)
    except images.Rejected as err:
        return "rejected", err.reason, err.detail
    except Exception as err:  # noqa: BLE001 - compared, never expected
        return "raised", type(err).__name__, str(err)
    return "stored", stored.encoded, stored.height, stored.width, stored.changes


def through_pillow(monkeypatch, data: bytes) -> tuple:
    """The outcome with every file's headers read by Pillow, as before `jpeg_headers`."""
    with monkeypatch.context() as patched:
        patched.setattr(jpeg_headers, "as_pillow_reads", lambda headers: None)
        return outcome(data)


def segment(code: int, body: bytes) -> bytes:
    return bytes((0xFF, code)) + (len(body) + 2).to_bytes(2, "big") + body


PICTURE = photo_like(np.random.default_rng(0), 24, 32)


def exif(orientation: int) -> bytes:
    block = Image.Exif()
    block[0x0112] = orientation
    return block.tobytes()


BASES = [
    encode(PICTURE),
    encode(PICTURE, optimize=True),
    encode(PICTURE, restart_marker_blocks=2),
    encode(PICTURE, dpi=(300, 300)),
    encode(PICTURE, exif=exif(1)),  # no resolution: Pillow parses the EXIF block
    encode(PICTURE, exif=exif(1), dpi=(72, 72)),
    encode(PICTURE, exif=exif(6), dpi=(72, 72)),
    encode(Image.fromarray(PICTURE).convert("L")),
    encode(Image.fromarray(PICTURE).convert("CMYK")),
    (ODD_IMAGES / "pil_sample_rgb.jpg").read_bytes(),
    (ODD_IMAGES / "app13-multiple.jpg").read_bytes(),
    (ODD_IMAGES / "exif_typeerror.jpg").read_bytes(),
]
# Segments each of which Pillow's reading treats in a way of its own: short JFIF, Adobe and
# ICC segments it fails on, EXIF blocks it joins, an MPO index, Photoshop's resources,
# tables cut short, fill bytes and stray data between segments.
INSERTS = [
    segment(0xE0, b"JFIF"),
    segment(0xE0, b"JFIF\x00\x01\x02"),
    segment(0xE0, b"JFIF\x00\x01\x02\x01\x00\x48\x00\x48\x00\x00"),
    segment(0xE0, b"JFIF\x00\x01\x02\x02\x00\x00\x00\x00\x00\x00"),
    segment(0xE1, b"Exif\x00\x00" + exif(1)),
    segment(0xE1, b"Exif\x00\x00" + exif(8)),
    segment(0xE1, b"Exif\x00\x00"),
    segment(0xE1, b"Exif\x00\x00MM\x00*\x00\x00\x00\x08\x00\x01\x01\x12"),
    segment(0xE1, b"http://ns.adobe.com/xap/1.0/\x00<x/>"),
    segment(0xE2, b"ICC_PROFILE\x00\x01"),
    segment(0xE2, b"ICC_PROFILE\x00\x01\x01abc"),
    segment(0xE2, b"MPF\x00MM\x00*\x00\x00\x00\x08"),
    segment(0xED, b"Photoshop 3.0\x008BIM\x04"),
    segment(0xEE, b"Adobe"),
    segment(0xEE, b"Adobe\x00\x64\x00\x00\x00\x00\x01"),
    segment(0xFE, b"a note"),
    segment(0xE5, b""),
    segment(0xDB, b"\x00" + b"\x01" * 30),
    segment(0xDB, b"\x10" + b"\x00\x01" * 64),
    segment(0xDD, b"\x00\x00"),
    b"\xff",
    b"\x00",
]


def boundaries(data: bytes) -> list[int]:
    """Where each segment before the scan header begins."""
    at, found = 2, [2]
    while at + 4 <= len(data) and data[at] == 0xFF and data[at + 1] != 0xDA:
        at += 2 + int.from_bytes(data[at + 2 : at + 4], "big")
        found.append(at)
    return found


def mutant(rng: random.Random) -> bytes:
    data = bytearray(rng.choice(BASES))
    headers_end = data.find(b"\xff\xda") + 14
    kind = rng.choice(["byte", "bytes", "insert", "cut"])
    if kind == "byte":
        at = rng.randrange(2, headers_end)
        data[at] = rng.choice([0x00, 0x01, 0x03, 0x04, 0x10, 0x7F, 0xFF, data[at] ^ 1])
    elif kind == "bytes":
        for _ in range(rng.randint(2, 5)):
            data[rng.randrange(2, headers_end)] = rng.randrange(256)
    elif kind == "insert":
        for _ in range(rng.randint(1, 3)):
            at = rng.choice(boundaries(bytes(data)))
            data[at:at] = rng.choice(INSERTS)
    else:
        del data[rng.randrange(2, headers_end) : rng.randrange(2, headers_end)]
    return bytes(data)


def test_an_ordinary_jpeg_is_stored_without_pillows_reading(monkeypatch):
    def refused(*args, **kwargs):
        raise AssertionError("Pillow asked")

    data = encode(PICTURE, quality=90)
    monkeypatch.setattr(Image, "open", refused)
    assert images.normalise(data).encoded == data


@pytest.mark.parametrize("index", [4, 6, 7, 8], ids=["exif", "rotated", "grey", "cmyk"])
def test_what_is_not_certain_is_left_to_pillow(monkeypatch, index):
    # EXIF without a resolution (Pillow parses it), a rotation, grey and CMYK samples.
    opened = []
    pillows_open = Image.open
    monkeypatch.setattr(Image, "open", lambda *a, **k: opened.append(1) or pillows_open(*a, **k))
    images.normalise(BASES[index])
    assert opened


def test_every_input_is_decided_as_pillows_reading_decides_it(monkeypatch):
    # 1,500 files with damaged or unusual headers: the same verdict, worded the same, or the
    # same image stored, with and without Pillow's reading. A reviewer's run of 60,000 such
    # files found no difference either (16,234 of them stored without Pillow's reading).
    rng = random.Random(27)
    kinds, fast = set(), 0
    for _ in range(1500):
        data = mutant(rng)
        expected = through_pillow(monkeypatch, data)
        assert outcome(data) == expected, data[:64].hex()
        kinds.add(expected[0])
        layout = images.jpeg_markers.walk(data)
        fast += layout.plain and jpeg_headers.as_pillow_reads(layout.headers_only(data)) is not None
    assert kinds == {"stored", "rejected"} and fast > 300


JFIF_PER_INCH = segment(0xE0, b"JFIF\x00\x01\x02\x01\x00\x48\x00\x48\x00\x00")
JFIF_PER_CM = segment(0xE0, b"JFIF\x00\x01\x02\x02\x00\x1c\x00\x1c\x00\x00")
EXIF_SEGMENT = segment(0xE1, b"Exif\x00\x00" + exif(1))


@pytest.mark.parametrize(
    "first, read_here",
    [
        (JFIF_PER_INCH + EXIF_SEGMENT, True),
        (EXIF_SEGMENT + JFIF_PER_INCH, False),  # Pillow 10.3 parses the EXIF block at once
        (JFIF_PER_CM + EXIF_SEGMENT, False),  # Pillow before 11.1 takes no density in cm
        (EXIF_SEGMENT, False),
    ],
    ids=["dpi-then-exif", "exif-then-dpi", "per-cm-then-exif", "exif-alone"],
)
def test_exif_is_read_here_only_where_no_pillow_parses_it(monkeypatch, first, read_here):
    # Every Pillow the project allows (10.3 on) skips the EXIF block's parse for a resolution
    # once a JFIF density in dots per inch has come; where one parses it, it may fail there
    # (an odd resolution tag), and then it decides.
    data = encode(PICTURE)
    data = data[:2] + first + data[2:]
    layout = images.jpeg_markers.walk(data)
    assert (jpeg_headers.as_pillow_reads(layout.headers_only(data)) is not None) == read_here
    assert outcome(data) == through_pillow(monkeypatch, data)


def test_a_frame_pillow_cannot_read_as_rgb_is_left_to_pillow():
    headers = bytearray(images.jpeg_markers.walk(BASES[0]).headers_only(BASES[0]))
    sof = headers.index(b"\xff\xc0")
    assert jpeg_headers.as_pillow_reads(bytes(headers)) is not None
    twelve_bit = headers[: sof + 4] + b"\x0c" + headers[sof + 5 :]
    end = sof + 2 + int.from_bytes(headers[sof + 2 : sof + 4], "big")
    two_frames = headers[:end] + headers[sof:end] + headers[end:]
    assert jpeg_headers.as_pillow_reads(bytes(twelve_bit)) is None
    assert jpeg_headers.as_pillow_reads(bytes(two_frames)) is None
