"""`core.images.normalise` in TensorFlow ops: what serving does to a file before the eval crop.

The converter stores every input as an upright RGB JPEG: the EXIF orientation applied,
transparency flattened onto white, the first frame of an animation, images over `max_side`
downscaled, re-encoded at `jpeg_quality` unless the file already was a plain JPEG. Serving must
give the model the pixels `preprocess.eval_image` gets from that record, and TF Serving runs no
Python, so the same steps are done here with TensorFlow ops, then the same `eval_image`.

Formats: those TensorFlow decodes, JPEG, PNG, GIF, WebP and BMP. Refused, for a reason the
caller reports: TIFF and anything else (TensorFlow has no decoder), and GIFs with a transparent
colour (TensorFlow decodes it as black; the converter puts white there). Headers are read here
(sizes, the EXIF orientation, GIF transparency) so that a caller can refuse a file before it is
decoded.
"""

from __future__ import annotations

import tensorflow as tf

from tfrecord_pipe._core import images, jpeg_markers
from tfrecord_pipe._reading import preprocess

JPEG, PNG, GIF, WEBP, BMP, TIFF, UNKNOWN = range(7)
FORMAT_NAMES = ("JPEG", "PNG", "GIF", "WebP", "BMP", "TIFF", "unknown")

_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
# A turned pixel's fourth byte, the top of its float32: exponent 126 or 127, a normal number.
_TURNED_TOP_BYTE = 0x3F
_PAD = 16  # zero bytes after a file's last, so reads near its end need no bounds in the graph
# Steps of a walk through a file's segments, chunks or blocks. Real files need tens; a file
# crafted with millions (fill bytes, empty chunks) must not hold a server for minutes. A file
# whose walk is cut short is refused: what lay beyond (an EXIF block, a frame's colour
# components) decides its pixels.
_MAX_STEPS = 1000
_APP1, _APP14, _SOS = 0xE1, 0xEE, 0xDA
_ADOBE = int.from_bytes(b"Adobe", "big")
_NOT_FRAMES = (0xC4, 0xC8, 0xCC)  # markers in C0..CF that start no frame (DHT, JPG, DAC)
_PNG_EXIF, _PNG_IDAT = 0x65584966, 0x49444154  # chunk types "eXIf" and "IDAT" as big-endian ints
_WEBP_EXIF = 0x46495845  # "EXIF" as a little-endian int
_EXIF_PREFIX_INT = int.from_bytes(images.EXIF_PREFIX, "big")
_WEBP_VP8, _WEBP_VP8L, _WEBP_VP8X = 0x20385056, 0x4C385056, 0x58385056  # "VP8 ", "VP8L", "VP8X"


@tf.autograph.experimental.do_not_convert
def format_of(encoded: tf.Tensor) -> tf.Tensor:
    """The format code (JPEG .. UNKNOWN) of each string in `encoded`, from its first bytes."""
    head = tf.strings.substr(tf.strings.join([tf.strings.substr(encoded, 0, 12), "\0" * 12]), 0, 12)

    def at(pos, length):
        return tf.strings.substr(head, pos, length)

    checks = [
        tf.equal(at(0, 3), b"\xff\xd8\xff"),
        tf.equal(at(0, 8), _PNG_MAGIC),
        tf.equal(at(0, 6), b"GIF87a") | tf.equal(at(0, 6), b"GIF89a"),
        tf.equal(at(0, 4), b"RIFF") & tf.equal(at(8, 4), b"WEBP"),
        tf.equal(at(0, 2), b"BM"),
        tf.equal(at(0, 4), b"II*\0") | tf.equal(at(0, 4), b"MM\0*"),
    ]
    code = tf.fill(tf.shape(encoded), UNKNOWN)
    for value in reversed(range(len(checks))):
        code = tf.where(checks[value], value, code)
    return code


class _Bytes:
    """A file's bytes as a uint8 vector, read as unsigned integers at any offsets."""

    def __init__(self, encoded: tf.Tensor):
        raw = tf.io.decode_raw(encoded, tf.uint8)
        self._raw = raw
        self.size = tf.size(raw, out_type=tf.int64)
        self._bytes = tf.concat([raw, tf.zeros([_PAD], tf.uint8)], 0)  # uint8: 1 byte per byte
        self._last = self.size + (_PAD - 1)

    def uint(self, at, size: int, big_endian: bool) -> tf.Tensor:
        """The `size`-byte unsigned integer at each offset of `at` (past the end: garbage, so
        callers compare offsets with `self.size`)."""
        # Offsets and shifts are constants, not ops: a request's graph reads some hundred
        # integers, and each op more in each read was time to trace it (an export's).
        index = tf.expand_dims(tf.cast(at, tf.int64), -1) + tf.constant(list(range(size)), tf.int64)
        index = tf.clip_by_value(index, 0, self._last)
        shifts = [8 * (size - 1 - n if big_endian else n) for n in range(size)]
        values = tf.cast(tf.gather(self._bytes, index), tf.int64)
        return tf.reduce_sum(tf.bitwise.left_shift(values, tf.constant(shifts, tf.int64)), -1)

    def scans(self, first_scan: tf.Tensor) -> tf.Tensor:
        """A JPEG's scan headers (0xFF 0xDA), counted from its first, at `first_scan`, to the
        end-of-image marker (0xFF 0xD9) after it: compressed data holds neither pair, and
        what comes before (an EXIF thumbnail's own scan) or after (a phone's motion photo,
        megabytes of video in which any pair stands) is not the image's."""
        def at(code):
            pairs = tf.equal(self._raw[:-1], 0xFF) & tf.equal(self._raw[1:], code)
            return tf.where(pairs)[:, 0]

        ends = at(0xD9)
        end = tf.reduce_min(tf.concat([tf.boolean_mask(ends, ends >= first_scan), [self.size]], 0))
        starts = at(_SOS)
        return tf.reduce_sum(tf.cast((starts >= first_scan) & (starts < end), tf.int64))

    def either(self, at, size: int, big_endian: tf.Tensor) -> tf.Tensor:
        """`uint` in a byte order known only in the graph."""
        return tf.where(big_endian, self.uint(at, size, True), self.uint(at, size, False))


@tf.autograph.experimental.do_not_convert
def header(encoded: tf.Tensor, fmt: tf.Tensor) -> tuple[tf.Tensor, ...]:
    """What a decodable file's header says: (height, width, refusal, turn, components), the
    refusal an int32 index into REFUSALS (0: none), the others int64: its EXIF orientation
    (`orientation`) and a JPEG's colour components (0 for other formats), which `eval_input`
    takes, so that the file's structure is walked once. Fails (an InvalidArgumentError) when
    the header is cut short or not readable."""
    data = _Bytes(encoded)

    def needs(length):
        return tf.debugging.assert_greater_equal(data.size, tf.constant(length, tf.int64))

    def jpeg():
        shape = tf.cast(tf.image.extract_jpeg_shape(encoded), tf.int64)
        return shape[0], shape[1]

    def png():
        with tf.control_dependencies([needs(24)]):
            return data.uint(20, 4, True), data.uint(16, 4, True)

    def gif():
        # Its first image may be larger than its canvas (Pillow widens the canvas to it): the
        # larger of the two is what is decoded, and what the pixel cap must see.
        with tf.control_dependencies([needs(10)]):
            refusal, image_height, image_width = _gif_walk(data)
            height = tf.maximum(data.uint(8, 2, False), image_height)
            return height, tf.maximum(data.uint(6, 2, False), image_width), refusal, *_upright()

    def webp():
        chunk = data.uint(12, 4, False)
        bits = data.uint(21, 4, False)
        known = tf.debugging.Assert(
            tf.reduce_any(tf.equal(chunk, [_WEBP_VP8, _WEBP_VP8L, _WEBP_VP8X])),
            ["not a WebP image TensorFlow can read"],
        )
        with tf.control_dependencies([needs(30), known]):
            return tf.switch_case(
                tf.argmax(
                    tf.cast(tf.equal(chunk, [_WEBP_VP8, _WEBP_VP8L, _WEBP_VP8X]), tf.int32),
                    output_type=tf.int32,
                ),
                [
                    lambda: (data.uint(28, 2, False) % 16384, data.uint(26, 2, False) % 16384),
                    lambda: ((bits // 16384) % 16384 + 1, bits % 16384 + 1),
                    lambda: (data.uint(27, 3, False) + 1, data.uint(24, 3, False) + 1),
                ],
            )

    def bmp():
        with tf.control_dependencies([needs(26)]):
            height = data.uint(22, 4, False)
            height = tf.where(height >= 2**31, 2**32 - height, height)  # negative: top-down rows
            return height, data.uint(18, 4, False)

    def refused():  # not called for a caller that checks the format first
        with tf.control_dependencies([tf.debugging.Assert(False, ["not a decodable format"])]):
            return tf.constant(0, tf.int64), tf.constant(0, tf.int64)

    def webp_structure():  # an animation first: its reason is the one that holds
        animated = _webp_refusal(data)
        refusal, turn, components = _walked(data, _webp_exif)
        return tf.where(tf.not_equal(animated, 0), animated, refusal), turn, components

    return tf.switch_case(
        fmt,
        [lambda: (*jpeg(), *_jpeg_structure(data)),
         lambda: (*png(), *_walked(data, _png_exif)), gif,
         lambda: (*webp(), *webp_structure()),
         lambda: (*bmp(), _bmp_refusal(data), *_upright())],
        default=lambda: (*refused(), _accepted(), *_upright()),
    )  # fmt: skip


# Files TensorFlow decodes to other pixels than the converter stores, refused with the reason.
REFUSALS = (
    "",
    "is a GIF with a transparent colour (or too many blocks to check for one), which "
    "TensorFlow decodes as black where the converter put white; send it as PNG",
    "is an animated GIF or WebP: TensorFlow would decode every frame, the converter keeps "
    "the first; send that frame as PNG or JPEG",
    "is a BMP that TensorFlow cannot decode as the converter did (not 24 or 32 bits per "
    "pixel, or with colour masks other than blue, green, red, or an alpha channel); send it "
    "as PNG",
    "is a GIF whose image does not cover its canvas, which TensorFlow decodes at the image's "
    "size where the converter keeps the canvas; send it as PNG",
    "has more segments or chunks than serving walks (a file crafted so, or padded); send it "
    "saved again as PNG or JPEG",
    "is a CMYK JPEG without an Adobe APP14 segment: TensorFlow reads its colours inverted, "
    "unlike the converter; send it as an RGB JPEG or PNG",
    "is a JPEG whose EXIF block is split over several APP1 segments, which the converter "
    "joins to read its orientation; send it saved again as PNG or JPEG",
    f"is a JPEG of more than {jpeg_markers.MAX_SCANS} scans, each of which the decoder passes "
    "over the whole image for (a file made to hold a server); send it saved again as PNG or "
    "JPEG",
)
_TRANSPARENT_GIF, _ANIMATED, _OTHER_BMP, _PARTIAL_GIF = 1, 2, 3, 4
_LONG_HEADER, _CMYK_NOT_ADOBE, _SPLIT_EXIF, _MANY_SCANS = 5, 6, 7, 8
_MAX_GIF_STEPS = 10_000  # a step per data sub-block of the first frame: up to ~2.5 MB of it


def _accepted():
    return tf.constant(0, tf.int32)


def _gif_walk(data: _Bytes) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """(refusal, first image's height, its width) of a GIF. Refused: a transparent colour in
    the graphic control extension before its first image, a first image that does not cover
    the canvas (placed at an offset, or smaller), or a second image; the first of these when
    its blocks are too many to walk."""
    canvas_width, canvas_height = data.uint(6, 2, False), data.uint(8, 2, False)
    packed = data.uint(10, 1, False)
    table = tf.where(
        packed >= 128, 3 * tf.bitwise.left_shift(tf.constant(2, tf.int64), packed % 8), 0
    )

    # A step per block introducer or data sub-block.
    def step(pos, in_blocks, images, transparent, partial, size, done):
        byte, label = data.uint(pos, 1, False), data.uint(pos + 1, 1, False)
        extension = ~in_blocks & tf.equal(byte, 0x21)
        image = ~in_blocks & tf.equal(byte, 0x2C)
        control = extension & tf.equal(label, 0xF9) & tf.equal(images, 0)
        transparent |= control & tf.equal(data.uint(pos + 3, 1, False) % 2, 1)
        # The image descriptor: left, top, width, height. (One larger than the canvas is
        # decoded alike: Pillow widens the canvas to it.)
        left, top, width, height = (data.uint(pos + 1 + 2 * i, 2, False) for i in range(4))
        misses = (left > 0) | (top > 0) | (width < canvas_width) | (height < canvas_height)
        first = image & tf.equal(images, 0)
        partial |= first & misses
        size = tf.where(first, tf.stack([height, width]), size)
        local = data.uint(pos + 9, 1, False)
        local_table = tf.where(
            local >= 128, 3 * tf.bitwise.left_shift(tf.constant(2, tf.int64), local % 8), 0
        )
        # In sub-blocks the byte at pos is the next sub-block's size (0 ends them).
        next_pos = tf.where(
            in_blocks, pos + byte + 1, tf.where(image, pos + 11 + local_table, pos + 2)
        )
        images += tf.cast(image, tf.int64)
        next_in_blocks = extension | image | (in_blocks & tf.not_equal(byte, 0))
        finished = (~in_blocks & ~extension & ~image) | (images > 1) | (pos >= data.size)
        return next_pos, next_in_blocks, images, transparent, partial, size, done | finished

    _, _, images, transparent, partial, size, done = tf.while_loop(
        lambda pos, in_blocks, images, transparent, partial, size, done: ~done,
        step,
        (13 + table, tf.constant(False), tf.constant(0, tf.int64), tf.constant(False),
         tf.constant(False), tf.zeros([2], tf.int64), tf.constant(False)),
        maximum_iterations=_MAX_GIF_STEPS,
    )  # fmt: skip
    later = tf.where(partial, _PARTIAL_GIF, tf.where(images > 1, _ANIMATED, 0))
    return tf.where(transparent | ~done, _TRANSPARENT_GIF, later), size[0], size[1]


def _webp_refusal(data: _Bytes) -> tf.Tensor:
    """An animated WebP: the animation flag of its extended header."""
    extended = tf.equal(data.uint(12, 4, False), _WEBP_VP8X)
    animated = extended & tf.equal(data.uint(20, 1, False) // 2 % 2, 1)
    return tf.where(animated, _ANIMATED, 0)


def _bmp_refusal(data: _Bytes) -> tf.Tensor:
    """A BMP TensorFlow decodes differently or not at all: other than 24 or 32 bits per pixel,
    or 32 with bit fields other than blue, green, red and no alpha, the layout TensorFlow
    assumes: Pillow follows the masks (an alpha one too); TensorFlow ignores them."""
    bits, compression = data.uint(28, 2, False), data.uint(30, 4, False)
    # The masks follow the 40-byte header (or are its later fields): red, green, blue, alpha.
    masks = [data.uint(54 + 4 * i, 4, False) for i in range(4)]
    alpha_mask = tf.where(
        (data.uint(14, 4, False) >= 56) | tf.equal(compression, 6), masks[3], 0
    )  # (in a header that has it; after the colour masks with BI_ALPHABITFIELDS, which
    # Pillow refuses, so no record holds one)
    standard = (tf.equal(masks[0], 0xFF0000) & tf.equal(masks[1], 0xFF00)
                & tf.equal(masks[2], 0xFF) & tf.equal(alpha_mask, 0))  # fmt: skip
    fields = tf.equal(bits, 32) & (tf.equal(compression, 3) | tf.equal(compression, 6))
    other = tf.logical_not(tf.equal(bits, 24) | tf.equal(bits, 32)) | (fields & ~standard)
    return tf.where(other, _OTHER_BMP, 0)


@tf.autograph.experimental.do_not_convert
def orientation(encoded: tf.Tensor, fmt: tf.Tensor) -> tf.Tensor:
    """The EXIF orientation (1..8, int64) of a decodable file by `core.images.exif_orientation`'s
    rule, from the block the converter reads: a JPEG's first APP1 "Exif" segment, a PNG's eXIf
    chunk before its image data, a WebP's first EXIF chunk. 1 for other formats and malformed
    blocks."""
    return header(encoded, fmt)[3]


def _upright():
    """The structure of a file without EXIF that is not a JPEG: (turn, components)."""
    return tf.constant(1, tf.int64), tf.constant(0, tf.int64)


def _jpeg_structure(data: _Bytes):
    """What a JPEG's walk finds, in `header`'s order: (refusal, turn, components). The refusal
    (REFUSALS) is of the walk cut short, a CMYK JPEG without Adobe's segment, an EXIF block
    split in a way read here otherwise than the converter reads it, or a file of too many
    scans; the turn is the EXIF
    orientation of the block the converter reads (1 if none); the components are the frame's
    colour components."""
    start, end, components, adobe, more_exif, cut, first_scan = _jpeg_segments(data)
    turn, whole = _tiff_orientation(data, start, tf.minimum(end, data.size))
    # A later "Exif" segment is joined to the first (Pillow, core.jpeg_headers): the same
    # orientation only where the first holds its whole directory (an empty first one too
    # was joined to the next).
    split = more_exif & ~whole
    refusal = tf.where(
        cut, _LONG_HEADER,
        tf.where(tf.equal(components, 4) & ~adobe, _CMYK_NOT_ADOBE,
                 tf.where(split, _SPLIT_EXIF, 0)),
    )  # fmt: skip
    # The converter's walk refuses the same files (it counts the scans it walks).
    refusal = tf.where(data.scans(first_scan) > jpeg_markers.MAX_SCANS, _MANY_SCANS, refusal)
    return refusal, turn, components


def _walked(data: _Bytes, walk):
    """What a PNG's or WebP's walk (`walk`, of its chunks to the EXIF one) finds, as
    `_jpeg_structure` says: the only refusal a walk cut short, no components."""
    start, end, cut = walk(data)
    turn = _tiff_orientation(data, start, tf.minimum(end, data.size))[0]
    return tf.where(cut, _LONG_HEADER, 0), turn, tf.constant(0, tf.int64)


def _jpeg_segments(data: _Bytes):
    """Of a JPEG's segments before the scan: (start, end) of its first APP1 "Exif" block (-1,
    -1 if none), the component count of its frame (1 grey, 3 colour, 4 CMYK; 0 if none),
    whether an Adobe APP14 segment is there, whether another "Exif" APP1 segment follows the
    first, whether the walk was cut short (_MAX_STEPS), and where it stopped (the first scan
    header, where it was not cut short)."""

    def step(pos, start, end, components, adobe, more_exif):
        marker, length = data.uint(pos + 1, 1, False), data.uint(pos + 2, 2, True)
        # As Pillow reads them: a byte that starts no marker is skipped, and so is a fill byte.
        at_marker = tf.equal(data.uint(pos, 1, False), 0xFF)
        exif = (at_marker & tf.equal(marker, _APP1)
                & tf.equal(data.uint(pos + 4, 6, True), _EXIF_PREFIX_INT))  # fmt: skip
        is_frame = (
            (marker >= 0xC0) & (marker <= 0xCF) & tf.reduce_all(tf.not_equal(marker, _NOT_FRAMES))
        )
        is_frame &= tf.equal(components, 0) & at_marker
        # libjpeg, and so TensorFlow, takes one of 12 bytes or more (Pillow: 7 or more).
        adobe |= (at_marker & tf.equal(marker, _APP14) & (length >= 14)
                  & tf.equal(data.uint(pos + 4, 5, True), _ADOBE))  # fmt: skip
        more_exif |= exif & (start >= 0)
        first_exif = exif & (start < 0)
        skip = ~at_marker | tf.equal(marker, 0xFF)
        return (
            tf.where(skip, pos + 1, pos + 2 + length),
            tf.where(first_exif, pos + 10, start),
            tf.where(first_exif, pos + 2 + length, end),
            tf.where(is_frame, data.uint(pos + 9, 1, False), components),
            adobe,
            more_exif,
        )

    def more(pos, *_):
        at_scan = tf.equal(data.uint(pos, 1, False), 0xFF) & tf.equal(
            data.uint(pos + 1, 1, False), _SOS
        )
        return (pos + 4 <= data.size) & ~at_scan

    minus_one, no = tf.constant(-1, tf.int64), tf.constant(False)
    pos, start, end, components, adobe, more_exif = tf.while_loop(
        more, step,
        (tf.constant(2, tf.int64), minus_one, minus_one, tf.constant(0, tf.int64), no, no),
        maximum_iterations=_MAX_STEPS,
    )  # fmt: skip
    return start, end, components, adobe, more_exif, more(pos), pos


def _png_exif(data: _Bytes):
    def step(pos, start, end):
        length, kind = data.uint(pos, 4, True), data.uint(pos + 4, 4, True)
        is_exif = tf.equal(kind, _PNG_EXIF)  # the last one before IDAT, as Pillow keeps it
        return (
            pos + 12 + length,
            tf.where(is_exif, pos + 8, start),
            tf.where(is_exif, pos + 8 + length, end),
        )

    def more(pos, start, end):
        return (pos + 8 <= data.size) & tf.not_equal(data.uint(pos + 4, 4, True), _PNG_IDAT)

    pos, start, end = tf.while_loop(
        more, step, (tf.constant(8, tf.int64), tf.constant(-1, tf.int64), tf.constant(-1, tf.int64)),
        maximum_iterations=_MAX_STEPS,
    )  # fmt: skip
    return start, end, more(pos, start, end)


def _webp_exif(data: _Bytes):
    # libwebp (and so Pillow) reads EXIF only where the extended header's flag says it is there.
    has_exif = tf.equal(data.uint(12, 4, False), _WEBP_VP8X) & tf.equal(
        data.uint(20, 1, False) // 8 % 2, 1
    )

    def step(pos, start, end):
        kind, length = data.uint(pos, 4, False), data.uint(pos + 4, 4, False)
        is_exif = tf.equal(kind, _WEBP_EXIF)
        # The chunk may start with "Exif\0\0", which the block's reader skips.
        prefixed = tf.equal(data.uint(pos + 8, 6, True), _EXIF_PREFIX_INT)
        start = tf.where(is_exif, pos + 8 + tf.where(prefixed, tf.constant(6, tf.int64), 0), start)
        end = tf.where(is_exif, pos + 8 + length, end)
        return pos + 8 + length + length % 2, start, end

    def more(pos, start, end):
        return (start < 0) & (pos + 8 <= data.size) & has_exif

    pos, start, end = tf.while_loop(
        more, step, (tf.constant(12, tf.int64), tf.constant(-1, tf.int64), tf.constant(-1, tf.int64)),
        maximum_iterations=_MAX_STEPS,
    )  # fmt: skip
    return start, end, more(pos, start, end)


_ORIENTATION_TAG, _SHORT, _LONG = 0x0112, 3, 4


def _tiff_orientation(data: _Bytes, start: tf.Tensor, end: tf.Tensor):
    """`core.images.exif_orientation` of the TIFF structure at data[start:end], and whether
    its header and first directory lie whole within the block."""
    little = tf.equal(data.uint(start, 2, True), 0x4949)  # "II"
    big = tf.equal(data.uint(start, 2, True), 0x4D4D)  # "MM"
    ifd = start + data.either(start + 4, 4, big)
    count = data.either(ifd, 2, big)
    ok = (start >= 0) & (little | big) & (start + 8 <= end) & (ifd + 2 <= end)
    ok &= ifd + 2 + 12 * count <= end  # a count is 16 bits: at most 65535 entries
    entries = ifd + 2 + 12 * tf.range(tf.where(ok, count, 0))
    tags = data.either(entries, 2, big)
    is_tag = tf.equal(tags, _ORIENTATION_TAG)
    first = tf.argmax(tf.cast(tf.concat([is_tag, [False]], 0), tf.int32), output_type=tf.int64)
    entry = ifd + 2 + 12 * first
    kind, values = data.either(entry + 2, 2, big), data.either(entry + 4, 4, big)
    value = tf.where(
        tf.equal(kind, _SHORT), data.either(entry + 8, 2, big), data.either(entry + 8, 4, big)
    )
    valid = ok & tf.reduce_any(is_tag) & tf.equal(values, 1)
    valid &= (tf.equal(kind, _SHORT) | tf.equal(kind, _LONG)) & (value >= 1) & (value <= 8)
    return tf.where(valid, value, 1), ok


@tf.autograph.experimental.do_not_convert
def upright_rgb(encoded: tf.Tensor, fmt: tf.Tensor, turn: tf.Tensor) -> tf.Tensor:
    """The decoded image as the converter stores it, before any downscaling: the first frame,
    transparency on white, turned upright by EXIF orientation `turn`; H x W x 3 uint8.

    Turned as whole pixels: each pixel's three bytes and a fourth, 0x3F, read as one float32,
    so that a turn moves 4 bytes a pixel, not a float per channel (12 or 16). A float, not an
    integer: TensorFlow's oneDNN build logs an error line in each process that transposes
    integers (uint8, int32, ...) on the CPUs it has no such kernels for, AVX-512 ones too. The
    fourth byte makes every such float a normal number in [0.5, 2), which any copy keeps bit
    for bit (no NaN, no denormal to flush). An image without an alpha channel (JPEG, BMP, a
    GIF, an RGB or grey PNG, an opaque WebP) is only turned, not blended onto white; one with
    alpha is blended in 16-bit integers first (benchmarks/RESULTS.md, "Memory per request
    image")."""

    def turned(rgb):
        """An H x W x 3 uint8 image, turned by `turn`."""
        rgb = tf.ensure_shape(rgb, [None, None, 3])
        top = tf.fill(tf.shape(rgb[..., :1]), tf.constant(_TURNED_TOP_BYTE, tf.uint8))
        pixels = tf.bitcast(tf.concat([rgb, top], -1), tf.float32)[..., None]  # H x W x 1
        pixels = tf.switch_case(
            tf.cast(turn - 1, tf.int32),
            [
                lambda: pixels,
                lambda: tf.image.flip_left_right(pixels),
                lambda: tf.image.rot90(pixels, 2),
                lambda: tf.image.flip_up_down(pixels),
                lambda: tf.image.transpose(pixels),
                lambda: tf.image.rot90(pixels, 3),
                lambda: tf.image.rot90(tf.image.transpose(pixels), 2),
                lambda: tf.image.rot90(pixels, 1),
            ],
        )
        return tf.bitcast(pixels[..., 0], tf.uint8)[..., :3]

    def decoded():
        # A PNG in its own channels: `decode_png(channels=4)` gives a palette PNG of 1, 2 or 4
        # bits an alpha of 1, 3 or 15 where it should be opaque (it came out near white).
        return tf.switch_case(
            fmt,
            [
                lambda: tf.io.decode_jpeg(encoded, channels=3, dct_method="INTEGER_ACCURATE"),
                lambda: tf.io.decode_png(encoded, channels=0),
                lambda: tf.io.decode_image(encoded, channels=3, expand_animations=False),
                lambda: tf.io.decode_webp(encoded, channels=0)[0],
                # BMP alpha: ignored, as Pillow does
                lambda: tf.io.decode_bmp(encoded, channels=0)[..., :3],
            ],
        )

    image = decoded()
    image.set_shape([None, None, None])
    channels = tf.shape(image)[-1]
    has_alpha = tf.equal(channels % 2, 0)  # grey and alpha (2), RGBA (4)
    grey = image[..., :1]

    def opaque():
        return tf.cond(channels >= 3, lambda: image[..., :3],
                       lambda: tf.concat([grey, grey, grey], -1))  # fmt: skip

    def on_white():
        colour = tf.cond(tf.equal(channels, 4), lambda: image[..., :4],
                         lambda: tf.concat([grey, grey, grey, image[..., 1:2]], -1))  # fmt: skip
        pixels = tf.cast(colour, tf.uint16)
        alpha = pixels[..., 3:]
        # Onto white, rounded to the nearest, in integers of 2 bytes: for every colour and
        # alpha what floats gave (round(c * a / 255 + 255 * (1 - a / 255)): never a half, 255
        # being odd), at a quarter of their memory. At most 255 * 255 + 127: no overflow.
        return tf.cast((pixels[..., :3] * alpha + 255 * (255 - alpha) + 127) // 255, tf.uint8)

    rgb = tf.cond(has_alpha, on_white, opaque)
    upright = tf.cond(tf.equal(turn, 1), lambda: rgb, lambda: turned(rgb))
    upright.set_shape([None, None, 3])
    return upright


@tf.autograph.experimental.do_not_convert
def downscaled(image: tf.Tensor, max_side: int) -> tf.Tensor:
    """`image` fitted within max_side x max_side (aspect kept, Pillow's thumbnail sizes), or
    unchanged when it fits."""
    height, width = tf.shape(image, out_type=tf.int64)[0], tf.shape(image, out_type=tf.int64)[1]

    def shrink():
        target = tf.cast(max_side, tf.float64)
        aspect = tf.cast(width, tf.float64) / tf.cast(height, tf.float64)
        # Pillow picks floor or ceil, whichever keeps the aspect closer (floor on a tie), >= 1.
        tall = aspect <= 1.0
        other = tf.where(tall, target * aspect, target / aspect)
        low, high = tf.floor(other), tf.math.ceil(other)

        def miss(side):
            safe = tf.maximum(side, 1.0)
            return tf.where(tall, tf.abs(aspect - side / target), tf.abs(aspect - target / safe))

        side = tf.maximum(tf.where(miss(high) < miss(low), high, low), 1.0)
        size = tf.cast(tf.where(tall, tf.stack([target, side]), tf.stack([side, target])), tf.int32)
        resized = tf.image.resize(
            tf.cast(image, tf.float32), size, method="lanczos3", antialias=True
        )
        return tf.cast(tf.clip_by_value(tf.round(resized), 0, 255), tf.uint8)

    return tf.cond(tf.maximum(height, width) > max_side, shrink, lambda: image)


@tf.autograph.experimental.do_not_convert
def eval_input(
    encoded: tf.Tensor,
    fmt: tf.Tensor,
    turn: tf.Tensor,
    components: tf.Tensor,
    image_size: int,
    dtype: str,
    max_side: int | None = None,
    jpeg_quality: int = images.ImagePolicy.jpeg_quality,
) -> tf.Tensor:
    """`preprocess.eval_image` of the record the converter would make of this file, whose
    orientation and JPEG components `header` read.

    A JPEG the converter stores as it is goes straight to `eval_image`. Any other file is made
    upright RGB here and JPEG-encoded at `jpeg_quality`, as the converter does. Decoded with
    libjpeg's accurate DCT, as Pillow decodes, the pixels are the record's bit for bit, except
    for CMYK JPEGs (the two round the conversion to RGB differently) and downscaled images
    (TensorFlow's Lanczos filter is not Pillow's); tests/test_serving_parity.py measures both.
    """
    def plain_jpeg():  # what the converter stores byte for byte: upright, colour, small enough
        plain = tf.equal(turn, 1) & tf.equal(components, 3)
        if max_side is None:
            return plain
        return plain & (tf.reduce_max(tf.image.extract_jpeg_shape(encoded)) <= max_side)

    as_stored = tf.cond(tf.equal(fmt, JPEG), plain_jpeg, lambda: tf.constant(False))

    def normalised():
        image = upright_rgb(encoded, fmt, turn)
        if max_side is not None:
            image = downscaled(image, max_side)
        return tf.io.encode_jpeg(image, quality=jpeg_quality)

    stored = tf.cond(as_stored, lambda: encoded, normalised)
    return preprocess.eval_image(stored, image_size, dtype)
