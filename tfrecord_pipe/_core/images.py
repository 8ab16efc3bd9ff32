"""Write-time image handling: turn any input file into an upright RGB JPEG, or say why not.

Used by the conversion job (one call per input file). Pure: bytes in, bytes out, no I/O, so it
is tested directly on the odd real-world files in tests/data/odd-images.

A source that already is an upright 8-bit RGB JPEG within the size cap is stored byte for byte
(no generational loss). Everything else that Pillow can decode (CMYK, grayscale, EXIF-rotated,
PNG/GIF/WebP/BMP/TIFF behind any file name, over the size cap) is normalised and re-encoded.
What cannot be used raises `Rejected` with a reason code and a sentence a user understands.
"""

from __future__ import annotations

import dataclasses
import io
import struct

from PIL import Image, UnidentifiedImageError

from tfrecord_pipe._core import arguments, jpeg_headers, jpeg_markers

# Reason codes for rejected inputs: stable strings, used in rejected/*.jsonl and the manifest.
EMPTY_FILE = "empty_file"
NOT_AN_IMAGE = "not_an_image"
TRUNCATED = "truncated"
UNSUPPORTED_JPEG = "unsupported_jpeg"
TOO_MANY_PIXELS = "too_many_pixels"
NOT_ALLOWED_FORMAT = "format_not_allowed"
UNREADABLE = "unreadable"
NOT_A_FILE = "not_a_regular_file"
FILE_TOO_LARGE = "file_too_large"
UNEXPECTED = "unexpected_error"  # a bug of ours or a library's: recorded, never fatal
UNKNOWN_LABEL = "unknown_label"
NO_LABEL = "no_label"
DUPLICATE = "duplicate"  # the same file listed twice (a link, a CSV line)
DUPLICATE_CONTENT = "duplicate_content"  # another file with the same bytes (--dedupe)

# tf.io.decode_jpeg refuses an image of 2^29 bytes or more decoded (3 per pixel, as the
# reader asks): over 178,956,970 pixels, twice what Pillow warns of by default.
MOST_DECODABLE_PIXELS = ((1 << 29) - 1) // 3
# The converter's cap. 100 megapixels: far above any training image, far below what would
# exhaust a worker (an RGB image of this size is 300 MB decoded). Serving has its own, lower
# cap per request (`reading.serving.DEFAULT_MAX_REQUEST_PIXELS`).
DEFAULT_MAX_PIXELS = 100_000_000
# Larger input files are rejected without being read. Far above any JPEG or PNG within the
# pixel cap that a training set holds; small enough that the dozens of files a worker holds at
# once fit in its memory, and that /dev/zero listed in a CSV cannot fill it.
DEFAULT_MAX_FILE_BYTES = 128 << 20  # 128 MiB


class Rejected(Exception):
    """An input that cannot become a record.

    Attributes:
      reason: one of the reason codes above.
      detail: what went wrong, for a person.
    """

    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


@dataclasses.dataclass(frozen=True)
class ImagePolicy:
    """How inputs are normalised.

    Attributes:
      max_side: longest side, in pixels, of a stored image; larger ones are downscaled (aspect
        kept). None stores every image at its own size.
      jpeg_quality: quality of re-encoded JPEGs (1-100). 95 keeps re-encoding loss below what
        training augmentation does to an image anyway.
      max_pixels: inputs with more pixels are rejected before they are decoded, so a
        decompression bomb cannot exhaust a worker's memory.
      allow_other_formats: re-encode PNG/GIF/WebP/BMP/TIFF inputs as JPEG (True) or reject
        them (False).
      max_file_bytes: input files larger than this are rejected without being read.
      keep_icc_profile: a re-encoded image keeps its RGB colour profile, as one stored byte
        for byte does. Datasets of tfrecord-pipe before 0.4.0 were made without (their
        recorded policies say so, for `verify`).
    """

    max_side: int | None = None
    jpeg_quality: int = 95
    max_pixels: int = DEFAULT_MAX_PIXELS
    allow_other_formats: bool = True
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES
    keep_icc_profile: bool = True

    def __post_init__(self):
        problems = []
        if self.max_side is not None and self.max_side < 1:
            problems.append(f"max_side must be >= 1 or None, got {self.max_side}")
        if not 1 <= self.jpeg_quality <= 100:
            problems.append(f"jpeg_quality must be in 1..100, got {self.jpeg_quality}")
        if self.max_pixels < 1:
            problems.append(f"max_pixels must be >= 1, got {self.max_pixels}")
        if self.max_file_bytes < 1:
            problems.append(f"max_file_bytes must be >= 1, got {self.max_file_bytes}")
        arguments.refuse("ImagePolicy", problems)


@dataclasses.dataclass(frozen=True)
class StoredImage:
    """The JPEG to store and how it was made.

    Attributes:
      encoded: JPEG bytes, upright, 8-bit RGB.
      height: rows, in pixels.
      width: columns, in pixels.
      changes: what normalisation did, e.g. ("from CMYK", "EXIF rotated"); empty when the source
        bytes are stored unchanged.
    """

    encoded: bytes
    height: int
    width: int
    changes: tuple[str, ...] = ()

    @property
    def reencoded(self) -> bool:
        return bool(self.changes)


_JPEG = ("JPEG",)


def _open(
    data: bytes, layout: jpeg_markers.Layout, policy: ImagePolicy
) -> tuple[Image.Image, int, int]:
    """The image Pillow opens, and its width and height. Of a plain JPEG, `data` is its
    headers with a frame one pixel in size (`jpeg_markers.Layout.headers_only`): its size is
    the walk's."""
    if not data:
        raise Rejected(EMPTY_FILE, "the file is empty (0 bytes)")
    # Pillow and tf.io.decode_jpeg both fail on 12-bit JPEGs with unhelpful messages: the frame
    # header gives the real reason.
    if layout.precision is not None and layout.precision != 8:
        raise Rejected(
            UNSUPPORTED_JPEG,
            f"{layout.precision}-bit JPEG; only 8-bit JPEGs can be decoded by Pillow and "
            "tf.io.decode_jpeg. Convert it to 8 bits per channel first.",
        )
    if layout.frame is not None and layout.frame not in jpeg_markers.DECODABLE_FRAMES:
        raise Rejected(
            UNSUPPORTED_JPEG,
            f"a lossless or hierarchical JPEG (frame type 0x{layout.frame:02X}), which "
            "tf.io.decode_jpeg cannot decode. Convert it to a baseline JPEG first.",
        )
    size_problem = layout.size_problem()
    if size_problem is not None:
        raise Rejected(UNSUPPORTED_JPEG, size_problem)
    if layout.scans > jpeg_markers.MAX_SCANS:
        raise Rejected(
            UNSUPPORTED_JPEG,
            f"a JPEG of more than {jpeg_markers.MAX_SCANS} scans, each of which the decoder "
            "passes over the whole image for (a file made to hold a decoder). Save it again.",
        )
    try:
        # Pillow warns from 89 megapixels (DecompressionBombWarning) and refuses twice that,
        # but for a plain JPEG, opened one pixel in size; our own caps, below, decide. The
        # warning is not silenced here: catch_warnings changes process-wide state and the job
        # calls this on several threads at once.
        # A plain JPEG is one by its markers: no other format is tried first (2-3 us).
        image = Image.open(io.BytesIO(data), formats=_JPEG if layout.plain else None)
    except Image.DecompressionBombError as err:
        raise Rejected(TOO_MANY_PIXELS, str(err)) from err
    except UnidentifiedImageError as err:
        raise Rejected(NOT_AN_IMAGE, "not an image format Pillow can read") from err
    except (OSError, SyntaxError, ValueError, struct.error) as err:
        raise _undecodable("image", err) from err
    width, height = (layout.width, layout.height) if layout.plain else image.size
    pixels = width * height
    if pixels > policy.max_pixels:
        raise Rejected(
            TOO_MANY_PIXELS,
            f"{width}x{height} = {pixels} pixels exceeds the cap of {policy.max_pixels} "
            "(ImagePolicy.max_pixels / --max_pixels)",
        )
    if pixels > MOST_DECODABLE_PIXELS:
        raise Rejected(
            TOO_MANY_PIXELS,
            f"{width}x{height} = {pixels} pixels; tf.io.decode_jpeg decodes at most "
            f"{MOST_DECODABLE_PIXELS}",
        )
    side = jpeg_markers.MAX_SIDE  # of a JPEG; one of another format is stored as a JPEG
    if max(width, height) > side and (policy.max_side is None or policy.max_side > side):
        # libjpeg's encoder failed with a bare OSError, after the whole decode.
        raise Rejected(
            TOO_MANY_PIXELS,
            f"{width}x{height} pixels; a JPEG holds at most {side} a side: set --max_side "
            f"(ImagePolicy.max_side) to {side} or less to store it downscaled",
        )
    if image.format != "JPEG" and not policy.allow_other_formats:
        raise Rejected(
            NOT_ALLOWED_FORMAT,
            f"{image.format} image, and re-encoding other formats is turned off",
        )
    return image, width, height


def _decode(
    image: Image.Image, data: bytes, layout: jpeg_markers.Layout, validate_only: bool
) -> Image.Image:
    """`image` decoded, proving that it decodes as tf.io.decode_jpeg (the reader's decoder)
    will decode it.

    A JPEG whose markers show damage is refused (`jpeg_markers`). With `validate_only` (a
    JPEG stored byte for byte, so its pixels are not needed) libjpeg decodes at 1/8 scale,
    which still reads every byte of the image data; and of a plain file, whose image data
    the marker walk has proven, `image` holds only the segments before that data, with a
    frame of one pixel (benchmarks/RESULTS.md, "Checking inputs").
    """
    if layout.damage is not None:
        raise Rejected(TRUNCATED if layout.truncated else NOT_AN_IMAGE,
                       f"JPEG data is damaged: {layout.damage}")  # fmt: skip
    if layout.plain and not validate_only:  # its pixels are needed: all of it
        image = Image.open(io.BytesIO(data))
    elif validate_only and not layout.plain:
        width, height = image.size
        image.draft("RGB", (max(1, width // 8), max(1, height // 8)))
    # All of it at once. Fed 64 KiB at a time, libjpeg stops once every row is out, and never
    # reads what lies after (damage there fails in TensorFlow, which reads to the end), and an
    # arithmetic-coded file, which libjpeg cannot pause in, fails when it is larger.
    image.decodermaxblock = max(len(data), image.decodermaxblock)
    try:
        image.load()
    except (OSError, SyntaxError, ValueError, struct.error) as err:
        raise _undecodable(image.format, err) from err
    return image


def _undecodable(kind: str, err: Exception) -> Rejected:
    reason = TRUNCATED if "truncated" in str(err).lower() else NOT_AN_IMAGE
    return Rejected(reason, f"{kind} data cannot be decoded: {err}")


# The EXIF orientation rule, shared with serving (`reading.graph_normalise` does the same in
# TensorFlow ops, and a test holds the two to each other): the Orientation tag (274) of IFD0
# of the image's EXIF block, a SHORT or LONG with count 1, valued 1..8. Anything else (no
# block, a malformed one, a value of 0, 9 or 65535, which no viewer rotates) is upright. XMP's
# tiff:Orientation is ignored, as browsers do; Pillow's getexif() would read it.
EXIF_PREFIX = b"Exif\x00\x00"
_ORIENTATION_TAG = 0x0112
_SHORT, _LONG = 3, 4
# Image.transpose method for each orientation: what makes the stored pixels upright.
_UPRIGHT = {
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_270,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}


def exif_orientation(block: bytes | None) -> int:
    """The orientation (1..8) an EXIF block (a TIFF structure, with or without the
    "Exif\\0\\0" prefix) gives its image, by the rule above; 1 when it gives none."""
    if not block:
        return 1
    tiff = block.removeprefix(EXIF_PREFIX)
    order = {b"II": "<", b"MM": ">"}.get(tiff[:2])
    if order is None or len(tiff) < 8:
        return 1
    ifd = struct.unpack(order + "I", tiff[4:8])[0]
    if ifd + 2 > len(tiff):
        return 1
    count = struct.unpack(order + "H", tiff[ifd : ifd + 2])[0]
    entries = tiff[ifd + 2 : ifd + 2 + 12 * count]
    if len(entries) < 12 * count:
        return 1  # IFD0 cut short: the block is malformed
    for at in range(0, len(entries), 12):
        tag, kind, values = struct.unpack(order + "HHI", entries[at : at + 8])
        if tag != _ORIENTATION_TAG:
            continue
        if values != 1 or kind not in (_SHORT, _LONG):
            return 1
        field = entries[at + 8 : at + 12]  # a SHORT is in its first two bytes
        short = kind == _SHORT
        value = struct.unpack(order + ("H" if short else "I"), field[: 2 if short else 4])[0]
        return value if 1 <= value <= 8 else 1
    return 1


def _orientation(image: Image.Image, data: bytes) -> int:
    """The image's EXIF orientation: the block Pillow found in a JPEG, PNG or WebP; a TIFF
    file is its own block."""
    block = data if image.format == "TIFF" else image.info.get("exif")
    return exif_orientation(block if isinstance(block, bytes) else None)


def _to_rgb(image: Image.Image) -> tuple[Image.Image, str | None]:
    if image.mode == "RGB":
        return image, None
    source_mode = image.mode
    if image.mode in ("RGBA", "LA", "PA") or (image.mode == "P" and "transparency" in image.info):
        rgba = image.convert("RGBA")
        background = Image.new("RGB", rgba.size, (255, 255, 255))
        background.paste(rgba, mask=rgba.getchannel("A"))
        return background, f"from {source_mode} (transparency on white)"
    if image.mode in ("I;16", "I;16B", "I;16L", "I"):
        image = image.point(lambda v: v / 256).convert("L")  # 16-bit samples to 8
    return image.convert("RGB"), f"from {source_mode}"


def _rgb_profile(image: Image.Image) -> bytes | None:
    """The image's ICC colour profile when it describes RGB samples, to keep in a re-encoded
    image as a stored JPEG keeps its own; one of grey or CMYK samples would no longer
    describe the RGB ones, and is dropped."""
    profile = image.info.get("icc_profile")
    # The profile's header names the colour space of the samples it describes (bytes 16-20).
    return profile if profile and profile[16:20] == b"RGB " else None


def _plain_and_upright(
    data: bytes, headers: bytes, layout: jpeg_markers.Layout, policy: ImagePolicy
) -> StoredImage | None:
    """A plain JPEG stored byte for byte, decided as `normalise` decides it through Pillow,
    where that is certain without Pillow's reading of the headers (`jpeg_headers`): an
    upright RGB JPEG within every cap whose headers libjpeg decodes, at a third less of the
    check's time (benchmarks/RESULTS.md). None for anything else, which goes through Pillow,
    where every rejection is decided and worded."""
    width, height = layout.width, layout.height  # 8-bit and sequential: `as_pillow_reads`
    if (
        layout.size_problem() is not None
        or width * height > min(policy.max_pixels, MOST_DECODABLE_PIXELS)
        or (policy.max_side is not None and max(width, height) > policy.max_side)
    ):
        return None
    seen = jpeg_headers.as_pillow_reads(headers)
    if seen is None or exif_orientation(seen.exif) != 1 or not _libjpeg_decodes(headers):
        return None
    return StoredImage(encoded=data, height=height, width=width)


def _libjpeg_decodes(headers: bytes) -> bool:
    """Whether Pillow's libjpeg decoder decodes these one-pixel headers whole, as
    `Image.load` runs it on an RGB JPEG: all of the bytes in one call, finished (n < 0)
    without an error code."""
    try:
        decoder = Image._getdecoder("RGB", "jpeg", ("RGB", ""))
    except OSError:  # a Pillow without libjpeg: its own path says so
        return False
    try:
        decoder.setimage(Image.core.new("RGB", (1, 1)), (0, 0, 1, 1))
        done, error = decoder.decode(headers)
    finally:
        decoder.cleanup()
    return done < 0 and error >= 0


def normalise(data: bytes, policy: ImagePolicy = ImagePolicy()) -> StoredImage:
    """The image to store for one input file.

    Colour profiles (ICC) are kept, never applied: the stored samples are the input's, which
    is what TensorFlow's decoders, and so training, evaluation and serving, see whatever the
    profile. A re-encoded image keeps an RGB profile, as an image stored unchanged does.

    Args:
      data: the input file's bytes, any format.
      policy: size caps, quality and format rules.

    Returns:
      The source bytes unchanged when they already are an upright 8-bit RGB JPEG within
      `policy.max_side`, else a re-encoded JPEG.

    Raises:
      Rejected: the input cannot be stored; `reason` says why.
    """
    layout = jpeg_markers.walk(data)
    # A plain JPEG's segments before its image data say all that is needed of it here.
    opened = layout.headers_only(data) if layout.plain else data
    if layout.plain:
        stored = _plain_and_upright(data, opened, layout, policy)
        if stored is not None:
            return stored
    image, width, height = _open(opened, layout, policy)
    orientation = _orientation(image, data)
    profile = _rgb_profile(image) if policy.keep_icc_profile else None
    stored_as_is = (
        image.format == "JPEG"
        and image.mode == "RGB"
        and orientation == 1
        and (policy.max_side is None or max(width, height) <= policy.max_side)
    )
    image = _decode(image, data, layout, validate_only=stored_as_is)
    if stored_as_is:
        return StoredImage(encoded=data, height=height, width=width)
    changes = []
    if image.format != "JPEG":
        changes.append(f"from {image.format}")
    if getattr(image, "n_frames", 1) > 1:
        image.seek(0)
        changes.append("first frame only")
    if orientation != 1:
        image = image.transpose(_UPRIGHT[orientation])
        changes.append(f"EXIF orientation {orientation} applied")
    image, colour_change = _to_rgb(image)
    if colour_change:
        changes.append(colour_change)
    if policy.max_side is not None and max(image.size) > policy.max_side:
        original = image.size
        image = image.copy()
        image.thumbnail((policy.max_side, policy.max_side), Image.Resampling.LANCZOS)
        changes.append(f"downscaled from {original[0]}x{original[1]}")

    width, height = image.size
    if not changes:
        return StoredImage(encoded=data, height=height, width=width)
    buffer = io.BytesIO()
    # No exif= argument: the orientation is already applied to the pixels and must not be
    # applied again by a reader.
    image.save(buffer, format="JPEG", quality=policy.jpeg_quality, icc_profile=profile)
    return StoredImage(
        encoded=buffer.getvalue(), height=height, width=width, changes=tuple(changes)
    )
