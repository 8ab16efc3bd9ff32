"""Serving gives the model the pixels evaluation gets: each file, served, against
`preprocess.eval_image` of the record the real conversion job made of it.

Tolerance: bit for bit, except where the two libraries cannot agree, each stated here:
CMYK JPEGs (Pillow and TensorFlow round CMYK to RGB differently) and images the conversion
downscaled to `max_side` (Pillow's Lanczos filter is not TensorFlow's).
"""

import functools
import io
import random
import struct

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from beam_jobs import convert
from tfrecord_pipe._core import images, schema
from tfrecord_pipe._reading import dataset, graph_normalise, preprocess, serving

from helpers import IN_PROCESS, ODD_IMAGES, encode

SIZE = 48
CMYK = ("pil_sample_cmyk.jpg", "cmyk_adobe.jpg")  # mean difference at most 1, max 8 (of 255)
REFUSED_BY_SERVING = {  # converted, but refused with the reason, as docs/serving.md says
    "hopper.tif": "TIFF file, which TensorFlow cannot decode",
    "transparent.gif": "GIF with a transparent colour",
    "animated.gif": "animated GIF or WebP",
    "animated.webp": "animated GIF or WebP",
    "palette.bmp": "BMP that TensorFlow cannot decode as the converter did",
    "offset_frame.gif": "GIF whose image does not cover its canvas",
    # Each was served with other pixels than its record's (a reviewer): inverted colours,
    # swapped channels, no turn.
    "cmyk_no_adobe.jpg": "CMYK JPEG without an Adobe APP14 segment",
    "xbgr_fields.bmp": "BMP that TensorFlow cannot decode as the converter did",
    "exif_split.jpg": "EXIF block is split over several APP1 segments",
    "exif_empty_first.jpg": "EXIF block is split over several APP1 segments",
    "cmyk_short_adobe.jpg": "CMYK JPEG without an Adobe APP14 segment",
}


def exif(orientation) -> bytes:
    block = Image.Exif()
    block[0x0112] = orientation
    return block.tobytes()


def with_transparent_corner() -> Image.Image:
    image = Image.new("P", (40, 30), 1)
    image.putpalette([255, 0, 0, 0, 255, 0, 0, 0, 255])
    image.paste(0, (0, 0, 10, 10))  # colour 0, made transparent when saved
    image.paste(2, (20, 0, 40, 30))
    return image


def made_files() -> dict[str, bytes]:
    """The kinds of file the odd-image set lacks: transparency, 16 bits, every orientation in
    JPEG, orientation in PNG and WebP, a BMP written from RGBA."""
    hopper = Image.open(ODD_IMAGES / "hopper.png").convert("RGB")
    rgba = np.asarray(hopper.convert("RGBA")).copy()
    rgba[:, :40, 3] = 0
    rgba[:40, :, 3] = 100
    rgba = Image.fromarray(rgba)
    palette = hopper.convert("P")
    grey16 = Image.fromarray(np.asarray(hopper.convert("L")).astype(np.uint16) * 257)
    files = {
        "rgba.png": encode(rgba, "PNG"),
        "grey_alpha.png": encode(rgba.convert("LA"), "PNG"),
        "palette_transparent.png": encode(palette, "PNG", transparency=3),
        "rgba.webp": encode(rgba, "WEBP"),
        "lossless.webp": encode(rgba, "WEBP", lossless=True),
        "grey16.png": encode(grey16, "PNG"),
        "rgba.bmp": encode(rgba, "BMP"),
        "turned6.png": encode(hopper, "PNG", exif=exif(6)),
        "turned5.webp": encode(hopper, "WEBP", exif=exif(5)),
        "transparent.gif": encode(with_transparent_corner(), "GIF", transparency=0),
        "opaque.gif": encode(palette, "GIF"),
        # Kept in the record, applied by no decoder: served as converted.
        "icc_profile.png": encode(hopper, "PNG", icc_profile=Image.open(
            ODD_IMAGES / "pil_sample_rgb.jpg").info["icc_profile"]),
    }
    for orientation in range(1, 9):
        files[f"turned{orientation}.jpg"] = encode(hopper, "JPEG", exif=exif(orientation))
    frames = [hopper, hopper.transpose(Image.Transpose.FLIP_LEFT_RIGHT)]
    files["animated.gif"] = encode(frames[0], "GIF", save_all=True, append_images=frames[1:])
    files["animated.webp"] = encode(frames[0], "WEBP", save_all=True, append_images=frames[1:])
    files["palette.bmp"] = encode(palette, "BMP")
    # Palettes and greys of fewer than 8 bits: TensorFlow's decode_png(channels=4) made their
    # alpha 1, 3 or 15, and serving laid them on white, near white.
    files["palette2bit.png"] = encode(hopper.quantize(4), "PNG")
    files["palette4bit.png"] = encode(hopper.quantize(16), "PNG")
    files["onebit.png"] = encode(hopper.convert("1"), "PNG")
    files["grey2bit.png"] = encode(hopper.convert("L"), "PNG", bits=2)
    # A GIF image smaller than its canvas, at an offset: TensorFlow decodes the image alone.
    small = bytearray(encode(palette.crop((0, 0, 20, 16)), "GIF"))
    small[6:10] = struct.pack("<HH", 56, 40)  # the canvas
    descriptor = small.index(b"\x2c", 13 + 3 * (2 << (small[10] & 7)))  # after the colour table
    small[descriptor + 1 : descriptor + 5] = struct.pack("<HH", 10, 8)  # left, top
    files["offset_frame.gif"] = bytes(small)
    # One larger than its canvas: both decode the image whole (Pillow widens the canvas).
    large = bytearray(encode(palette.crop((0, 0, 20, 16)), "GIF"))
    large[6:10] = struct.pack("<HH", 10, 8)
    files["larger_than_canvas.gif"] = bytes(large)
    # Bytes that start no marker before the EXIF segment: Pillow skips them, and rotates.
    turned = files["turned6.jpg"]
    after_app0 = 4 + struct.unpack(">H", turned[4:6])[0]  # the JFIF segment comes first
    assert turned[after_app0 : after_app0 + 2] == b"\xff\xe1"  # then the EXIF one
    files["junk_before_exif.jpg"] = turned[:after_app0] + b"\x00\x17junk" + turned[after_app0:]
    # CMYK: TensorFlow inverts it only where Adobe's segment says so; Pillow always does.
    cmyk = encode(hopper.convert("CMYK"), "JPEG")
    adobe = cmyk.index(b"\xff\xee")
    files["cmyk_adobe.jpg"] = cmyk
    after_adobe = adobe + 2 + struct.unpack(">H", cmyk[adobe + 2 : adobe + 4])[0]
    files["cmyk_no_adobe.jpg"] = cmyk[:adobe] + cmyk[after_adobe:]
    # One of 7 bytes: Pillow takes it (and inverts CMYK always), libjpeg needs 12.
    files["cmyk_short_adobe.jpg"] = (cmyk[:adobe] + b"\xff\xee\x00\x09Adobe\x00d"
                                     + cmyk[after_adobe:])  # fmt: skip
    # 32-bit bit fields: TensorFlow reads blue, green, red whatever the masks say.
    files["bgrx_fields.bmp"] = bit_fields_bmp(hopper, (0xFF0000, 0xFF00, 0xFF))
    files["xbgr_fields.bmp"] = bit_fields_bmp(hopper, (0xFF000000, 0xFF0000, 0xFF00))
    # An EXIF block over two APP1 segments (Pillow joins them): its directory in the second.
    plain = encode(hopper, "JPEG")
    first = b"Exif\0\0II*\0" + struct.pack("<IH", 8, 1)
    second = b"Exif\0\0" + struct.pack("<HHIHH", 0x0112, 3, 1, 6, 0) + bytes(4)
    files["exif_split.jpg"] = plain[:2] + app1(first) + app1(second) + plain[2:]
    files["exif_empty_first.jpg"] = plain[:2] + app1(b"Exif\0\0") + app1(exif(6)) + plain[2:]
    # Two whole EXIF blocks: the first is read, whole, by both.
    files["exif_twice.jpg"] = plain[:2] + app1(exif(6)) + app1(
        exif(3)) + plain[2:]  # fmt: skip
    # An EXIF chunk in a simple (VP8) WebP: libwebp, and so Pillow, ignore it: upright.
    simple = encode(hopper, "WEBP", lossless=False)
    chunk = b"EXIF" + struct.pack("<I", len(exif(6))) + exif(6)
    body = simple[12:] + chunk
    files["ignored_exif.webp"] = b"RIFF" + struct.pack("<I", len(body) + 4) + b"WEBP" + body
    return files


def app1(content: bytes) -> bytes:
    return b"\xff\xe1" + struct.pack(">H", len(content) + 2) + content


def bit_fields_bmp(image: Image.Image, masks) -> bytes:
    """A 32-bit BI_BITFIELDS BMP of `image` (a 40-byte header, the masks after it)."""
    width, height = image.size
    rgb = np.asarray(image.convert("RGB")).astype(np.uint32)
    shifts = [(mask & -mask).bit_length() - 1 for mask in masks]
    pixels = sum(rgb[..., c] << shifts[c] for c in range(3))[::-1].astype("<u4").tobytes()
    header = struct.pack("<IiiHHIIiiII", 40, width, height, 1, 32, 3, len(pixels), 2835, 2835,
                         0, 0) + struct.pack("<III", *masks)  # fmt: skip
    return b"BM" + struct.pack("<IHHI", 14 + len(header) + len(pixels), 0, 0, 66) + header + pixels


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """{file name: (its bytes, its record's encoded image or None if rejected)}."""
    root = tmp_path_factory.mktemp("parity")
    files = {path.name: path.read_bytes() for path in ODD_IMAGES.iterdir()
             if path.suffix not in (".txt", ".md")}  # fmt: skip
    files.update(made_files())
    (root / "src" / "odd").mkdir(parents=True)
    for name, data in files.items():
        (root / "src" / "odd" / name).write_bytes(data)
    convert.run([str(root / "src"), str(root / "out"), "--num_shards", "1", *IN_PROCESS])
    stored = {}
    for path in dataset.resolve(str(root / "out")).files:
        for raw in tf.data.TFRecordDataset(path):
            record = schema.decode_example(raw.numpy(), label_offset=1)
            stored[record.filename.split("/")[-1]] = record.encoded
    return {name: (data, stored.get(name)) for name, data in files.items()}


UINT8 = serving.ServingConfig(labels=("odd",), image_size=SIZE, dtype="uint8")


@functools.cache
def signature(config: serving.ServingConfig):
    """The serving preprocessing, traced once per config (a trace takes seconds)."""
    spec = tf.TensorSpec([None], tf.string)
    return tf.function(lambda files: serving.model_inputs(files, config), input_signature=[spec])


def served(files, config=UINT8):
    return signature(config)(tf.constant(files)).numpy().astype(int)


def evaluated(encoded):
    return preprocess.eval_image(tf.constant(encoded), SIZE, "uint8").numpy().astype(int)


@pytest.mark.slow  # a real conversion of the files first
def test_every_file_the_converter_stored_is_served_as_its_record(converted):
    kept = {name: pair for name, pair in converted.items()
            if pair[1] is not None and name not in REFUSED_BY_SERVING}  # fmt: skip
    assert len(kept) >= 27  # the odd-image set and the made files, less those rejected
    assert {"larger_than_canvas.gif", "palette2bit.png", "onebit.png", "cmyk_adobe.jpg",
            "bgrx_fields.bmp", "exif_twice.jpg"} <= set(kept)
    pixels = served([data for data, _ in kept.values()])
    for (name, (_, record)), got in zip(kept.items(), pixels):
        want = evaluated(record)
        difference = np.abs(got - want)
        if name in CMYK:
            assert difference.mean() <= 1 and difference.max() <= 8, name
        else:
            assert difference.max() == 0, (
                f"{name}: {difference.mean():.2f} mean, {difference.max()} max"
            )


@pytest.mark.slow  # a real conversion of the files first
def test_files_the_converter_rejected_are_refused_by_serving_too(converted):
    rejected = [name for name, (_, record) in converted.items() if record is None]
    assert sorted(rejected) == ["monkey12.jpg", "truncated_jpeg.jpg"]
    for name in rejected:
        with pytest.raises(tf.errors.InvalidArgumentError, match=r"image_bytes\[0\]: the JPEG"):
            served([converted[name][0]])


@pytest.mark.slow  # a real conversion of the files first
@pytest.mark.parametrize("name", sorted(REFUSED_BY_SERVING))
def test_what_serving_cannot_match_is_refused_with_the_reason(converted, name):
    data, record = converted[name]
    assert record is not None  # the converter took it
    with pytest.raises(tf.errors.InvalidArgumentError, match=REFUSED_BY_SERVING[name]):
        served([data])


@pytest.mark.slow  # a real conversion of the files first
def test_images_the_conversion_downscaled_are_downscaled_alike(tmp_path):
    src = tmp_path / "src" / "big"
    src.mkdir(parents=True)
    photo = Image.open(ODD_IMAGES / "exif_typeerror.jpg")  # 800 x 531
    files = {
        "wide.jpg": encode(photo, "JPEG", quality=90),
        "tall.png": encode(photo.transpose(Image.Transpose.ROTATE_90), "PNG"),
        "turned.jpg": encode(photo, "JPEG", exif=exif(6)),
        "small.jpg": encode(photo.resize((200, 133)), "JPEG"),  # within max_side: kept as it is
    }
    for name, data in files.items():
        (src / name).write_bytes(data)
    out = tmp_path / "out"
    convert.run([str(tmp_path / "src"), str(out), "--max_side", "333", *IN_PROCESS])
    config = serving.ServingConfig.for_dataset(str(out), image_size=SIZE, dtype="uint8")
    assert (config.labels, config.max_side, config.jpeg_quality) == (("big",), 333, 95)
    records = {}
    for path in dataset.resolve(str(out)).files:
        for raw in tf.data.TFRecordDataset(path):
            record = schema.decode_example(raw.numpy(), label_offset=1)
            records[record.filename.split("/")[-1]] = record
    assert {name: (r.height, r.width) for name, r in records.items()} == {
        "wide.jpg": (221, 333), "tall.png": (333, 221), "turned.jpg": (333, 221),
        "small.jpg": (133, 200),
    }  # fmt: skip
    pixels = served(list(files.values()), config)
    for name, got in zip(files, pixels):
        difference = np.abs(got - evaluated(records[name].encoded))
        assert difference.mean() <= 1.5 and difference.max() <= 16, name
    # Without the dataset's max_side, serving would crop the full-size image: visibly not the same.
    unscaled = served(list(files.values()))
    assert np.abs(unscaled[0] - evaluated(records["wide.jpg"].encoded)).max() > 16


def tiff_block(order: str, entries, count=None, ifd=8, cut=None) -> bytes:
    """An EXIF (TIFF) block: header, then IFD0 with `entries` (tag, type, count, value)."""
    mark = b"II" if order == "<" else b"MM"
    body = struct.pack(order + "H", len(entries) if count is None else count)
    for tag, kind, values, value in entries:
        field = struct.pack(order + ("H" if kind == 3 else "I"), value)
        body += struct.pack(order + "HHI", tag, kind, values) + field.ljust(4, b"\0")
    block = mark + struct.pack(order + "HI", 42, ifd) + b"\0" * (ifd - 8) + body + b"\0\0\0\0"
    return block[:cut]


def random_blocks(seed=7, count=150):
    """EXIF blocks as real files carry them, and broken: wrong types, counts, values, orders,
    cut short, IFD offsets past the end."""
    rng = random.Random(seed)
    blocks = []
    for _ in range(count):
        order = rng.choice("<>")
        entries = [(rng.choice([0x010F, 0x0110, 0x011A, 0x8769]), rng.choice([2, 3, 4, 5]), 1, rng.randrange(99))
                   for _ in range(rng.randrange(4))]  # fmt: skip
        orientation = (0x0112, rng.choice([3, 3, 3, 4, 1, 9]), rng.choice([1, 1, 1, 2]),
                       rng.choice([1, 2, 3, 4, 5, 6, 7, 8, 0, 9, 65535]))  # fmt: skip
        if rng.random() < 0.9:
            entries.insert(rng.randrange(len(entries) + 1), orientation)
        block = tiff_block(
            order, entries,
            count=rng.choice([None, None, None, len(entries) + 3, 5000]),
            ifd=rng.choice([8, 8, 8, 12, 9000]),
            cut=rng.choice([None, None, None, rng.randrange(30)]),
        )  # fmt: skip
        blocks.append(block)
    return blocks


def jpeg_with_exif(block: bytes) -> bytes:
    plain = encode(Image.new("RGB", (16, 8), (10, 200, 30)), "JPEG")
    segment = images.EXIF_PREFIX + block
    return plain[:2] + b"\xff\xe1" + struct.pack(">H", len(segment) + 2) + segment + plain[2:]


@pytest.mark.slow  # over a second of CPU: out of the fast subset
def test_the_graph_reads_the_exif_orientation_by_the_converters_rule():
    blocks = random_blocks()
    files = [jpeg_with_exif(block) for block in blocks]
    graph = tf.function(
        lambda files: tf.map_fn(
            lambda f: graph_normalise.orientation(f, tf.constant(graph_normalise.JPEG)), files,
            fn_output_signature=tf.int64,
        )
    )(tf.constant(files)).numpy()  # fmt: skip
    python = [images.exif_orientation(Image.open(io.BytesIO(f)).info.get("exif")) for f in files]
    assert graph.tolist() == python
    assert len(set(python)) >= 6  # the random blocks reach most orientations, and upright


def test_every_colour_and_alpha_is_put_on_white_as_the_converter_does():
    # Each of the 65,536 pairs of a colour value and an alpha, upright and turned (the turn
    # moves whole pixels), flattened in the graph and by the converter, byte for byte.
    colour, alpha = np.meshgrid(np.arange(256, dtype=np.uint8), np.arange(256, dtype=np.uint8),
                                indexing="ij")  # fmt: skip
    rgba = Image.fromarray(np.stack([colour, 255 - colour, colour // 2, alpha], -1), "RGBA")
    on_white, _ = images._to_rgb(rgba)
    expected = {1: np.asarray(on_white),
                6: np.asarray(on_white.transpose(Image.Transpose.ROTATE_270))}  # fmt: skip
    data = encode(rgba, "PNG")
    for turn, pixels in expected.items():
        got = graph_normalise.upright_rgb(tf.constant(data), tf.constant(graph_normalise.PNG),
                                          tf.constant(turn, tf.int64))  # fmt: skip
        np.testing.assert_array_equal(got.numpy(), pixels)
