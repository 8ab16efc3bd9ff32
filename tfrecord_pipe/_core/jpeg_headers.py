"""A plain JPEG's headers as Pillow's JPEG plugin reads them, read without it.

Of the check of a plain JPEG (`images.normalise`), about a third of the time went to Pillow's
reading of the segments before the scan, in Python: its objects, a read call per marker, the
quantisation tables unpacked. All the check needs of that reading is whether it succeeds, and
whether Pillow then sees an RGB JPEG and which EXIF block. This module answers that for the
files where it is certain: segments one after another (no fill bytes or stray data between
them, which Pillow skips its own way), and none that Pillow's reading could fail on or
decides more from. Anything else (an MPO index, a Photoshop block, an EXIF block that Pillow
parses for a resolution, a segment too short for Pillow's reading of it, a grey or CMYK
frame) is left to Pillow itself, which then decides and words every rejection as before.
What is followed is what every Pillow the project allows (10.3 on) does alike.
"""

from __future__ import annotations

import dataclasses

_SOF_PLAIN = (0xC0, 0xC1)  # the frames a plain file has (`jpeg_markers`)
_DQT, _SOS, _APP0, _APP1, _APP2, _APP13, _APP14 = 0xDB, 0xDA, 0xE0, 0xE1, 0xE2, 0xED, 0xEE
_SKIPPED = frozenset({0xC4, 0xDD, 0xFE})  # DHT, DRI, COM: Pillow reads past or keeps them
_JFIF, _EXIF, _ICC = b"JFIF", b"Exif\x00\x00", b"ICC_PROFILE\x00"


@dataclasses.dataclass(frozen=True)
class PillowView:
    """What Pillow's JPEG plugin makes of such headers.

    Attributes:
      exif: the EXIF block it finds (`image.info["exif"]`), or None.
    """

    exif: bytes | None = None


def as_pillow_reads(headers: bytes) -> PillowView | None:
    """What Pillow makes of `headers` (a plain JPEG's `jpeg_markers.Layout.headers_only`)
    where it is certain that Pillow opens them without an error as a JPEG of mode RGB
    (three components); None where it is not: then ask Pillow."""
    pos, exif, dpi, rgb = 2, None, False, False
    while pos + 4 <= len(headers):
        if headers[pos] != 0xFF:
            return None
        code = headers[pos + 1]
        if code == _SOS:  # Pillow reads no further
            break
        end = pos + 2 + (headers[pos + 2] << 8 | headers[pos + 3])
        if not pos + 4 <= end <= len(headers):
            return None
        if code in _SKIPPED:
            pos = end
            continue
        body = headers[pos + 4 : end]
        if code in _SOF_PLAIN:
            # Pillow reads a component per 3 bytes after the first 6, and fails on a part.
            if rgb or len(body) < 6 or body[0] != 8 or body[5] != 3 or (len(body) - 6) % 3:
                return None
            rgb = True
        elif code == _DQT:
            if not _tables_whole(body):
                return None
        elif 0xE0 <= code <= 0xEF:
            if not _read_safely(code, body):
                return None
            if code == _APP0 and body.startswith(_JFIF):
                dpi |= len(body) >= 12 and body[7] == 1
            elif code == _APP1 and body.startswith(_EXIF):  # Pillow joins them all
                # Pillow parses an EXIF block for a resolution, and may fail there, unless a
                # JFIF density in dots per inch came first: so in every Pillow from 10.3
                # (later ones also take one per cm, and look after the last segment).
                if not dpi:
                    return None
                exif = body if exif is None else exif + body[len(_EXIF) :]
        else:
            return None
        pos = end
    else:
        return None  # no scan header: not a plain file's headers
    return PillowView(exif=exif) if rgb else None


def _tables_whole(body: bytes) -> bool:
    """Whether a DQT segment holds whole tables, as Pillow requires (it reads each)."""
    at = 0
    while at < len(body):
        at += 1 + 64 * (1 if body[at] < 0x10 else 2)
    return at == len(body)


def _read_safely(code: int, body: bytes) -> bool:
    """Whether Pillow reads this application segment without an error, and decides nothing
    more from it than `as_pillow_reads` follows (an MPO index, Photoshop's resources)."""
    if code == _APP0 and body.startswith(_JFIF) or code == _APP14 and body.startswith(b"Adobe"):
        return len(body) >= 7  # the version Pillow reads
    if code == _APP2:  # Pillow reads each ICC part's count of parts
        return not body.startswith(b"MPF\x00") and not (body.startswith(_ICC) and len(body) < 14)
    return not (code == _APP13 and body.startswith(b"Photoshop 3.0\x00"))
