"""What a JPEG file's markers say, read without decoding: its frame, its scans, and damage that
makes TensorFlow's decoder fail.

Why a walk of our own: `tf.io.decode_jpeg` fails on a file that makes libjpeg read past its
end (a segment whose length runs past it, a scan or a search for the next marker that finds
no end-of-image marker), where Pillow's decoder succeeds on the same file, ending it with an
end-of-image marker of its own. Such a record passed the conversion's check and stopped
training when it came up. The walk finds that damage, and a marker where the image data
should be, in microseconds. Damage inside the image data that no marker shows (bits changed
in place) fails neither decoder: libjpeg warns and goes on, and so does the walk.

A "plain" file (one sequential frame, one scan of every component, nothing after it but the
end-of-image marker) is then proven by decoding its segments before the scan alone: every
table and header is libjpeg's to judge there, and the walk has judged the rest
(`images.normalise`; benchmarks/RESULTS.md, "Checking inputs"). Those segments are decoded
with the frame's size set to one pixel: libjpeg judges them alike at any size, and would
otherwise fill in every block of the missing image data. Its checks of the size itself are
made here (`Layout.size_problem`).
"""

from __future__ import annotations

import dataclasses
import re

# A marker: fill bytes (0xFF) then its code. 0xFF 0x00 is a data byte 0xFF, not a marker.
_MARKER = re.compile(rb"\xff([^\x00\xff])")
_NOT_CODES = (0x00, 0xFF)  # after 0xFF: a data byte, or a fill byte before the code

_EOI, _SOS, _DRI, _TEM = 0xD9, 0xDA, 0xDD, 0x01
_RESTARTS = range(0xD0, 0xD8)
# Start-of-frame markers: 0xC0-0xCF but DHT (0xC4), JPG (0xC8) and DAC (0xCC).
_FRAMES = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
# The frames TensorFlow's libjpeg decodes: baseline, extended and progressive, Huffman or
# arithmetic coded. Lossless and hierarchical ones it refuses (and Pillow's 1/8-scale decode
# of a lossless one corrupts the process's memory).
DECODABLE_FRAMES = frozenset({0xC0, 0xC1, 0xC2, 0xC9, 0xCA})
# Markers libjpeg stops at after the file's start: reserved codes, JPG and JPGn, those of
# hierarchical files (DHP, EXP), and a second start of image (SOI). TEM (0x01) it skips.
_REFUSED = frozenset({*range(0x02, 0xC0), 0xC8, 0xD8, 0xDE, 0xDF, *range(0xF0, 0xFE)})
_SEQUENTIAL = frozenset({0xC0, 0xC1})  # baseline and extended Huffman
_PROGRESSIVE = frozenset({0xC2, 0xC6, 0xCA, 0xCE})
# What a plain file may hold before its scan: tables (DHT, DQT), the restart interval,
# application segments and comments.
_PLAIN_SEGMENTS = frozenset({0xC4, 0xDB, _DRI, 0xFE, *range(0xE0, 0xF0)})
# The longest side libjpeg decodes (JPEG_MAX_DIMENSION); the format allows 65535.
MAX_SIDE = 65500
# The most scans a file may hold. Each scan of a progressive file makes the decoder pass over
# the whole image again, and a crafted file repeats a scan of a few bytes hundreds of times
# (4,000 px square, 300 scans: 10 s to decode, in a helper's trial). Encoders write 6 to 10
# (libjpeg's progression; up to 24 for CMYK). Serving counts them too (`graph_normalise`).
MAX_SCANS = 100
_ONE_PIXEL = b"\x00\x01\x00\x01"  # a frame header's height and width, 1 and 1


@dataclasses.dataclass(frozen=True)
class Layout:
    """What the walk found.

    Attributes:
      precision: bits per sample in the frame header; None where no frame header was read.
      frame: the frame header's marker code (0xC0 baseline, 0xC2 progressive...); None where
        no frame header was read.
      damage: what is wrong, for a person; None where the markers show nothing wrong.
      truncated: the damage is a file that ends too soon.
      height, width: the frame header's size; None where no frame header was read.
      size_at: where in the file the frame header's height and width lie; None where no
        frame header was read.
      scan_data: where the file's one scan's data begins, when the file is plain (above);
        else None.
      scans: the scans found, counted up to one more than MAX_SCANS (the walk stops there).
    """

    precision: int | None = None
    frame: int | None = None
    damage: str | None = None
    truncated: bool = False
    height: int | None = None
    width: int | None = None
    size_at: int | None = None
    scan_data: int | None = None
    scans: int = 0

    @property
    def plain(self) -> bool:
        return self.scan_data is not None

    def size_problem(self) -> str | None:
        """Why libjpeg cannot decode a frame of this size, for a person; None where it can."""
        if self.height == 0 or self.width == 0:  # the height may come later, in a DNL segment
            return f"a frame of {self.width}x{self.height} pixels, which libjpeg cannot decode"
        if self.height is not None and max(self.height, self.width) > MAX_SIDE:
            return (f"a frame of {self.width}x{self.height} pixels; libjpeg decodes at most "
                    f"{MAX_SIDE} pixels a side")  # fmt: skip
        return None

    def headers_only(self, data: bytes) -> bytes:
        """A plain file's segments before its scan's data, its frame one pixel in size, then
        the end-of-image marker: what libjpeg must judge of it once the walk has judged the
        data, and the caller the size."""
        assert self.scan_data is not None, "only a plain file's headers stand alone"
        size_at, scan_data = self.size_at, self.scan_data
        return b"".join((data[:size_at], _ONE_PIXEL, data[size_at + 4 : scan_data], b"\xff\xd9"))


def walk(data: bytes) -> Layout:
    """The layout of the JPEG file `data`; an empty Layout for data that is not one."""
    if not data.startswith(b"\xff\xd8"):
        return Layout()
    precision = components = frame = height = width = size_at = None
    pos, interval, scans, plain, first_scan, one_pass = 2, 0, 0, True, None, False

    def layout(**found) -> Layout:
        return Layout(precision, frame, height=height, width=width, size_at=size_at,
                      scans=scans, **found)  # fmt: skip

    def damaged(what: str, truncated: bool = False) -> Layout:
        return layout(damage=what, truncated=truncated)

    size = len(data)
    while True:
        if pos + 1 < size and data[pos] == 0xFF and data[pos + 1] not in _NOT_CODES:
            code, at = data[pos + 1], pos  # the next segment right after this one: no search
            pos += 2
        else:
            found = _MARKER.search(data, pos)
            if found is None:
                return damaged("it ends before its end-of-image marker", truncated=True)
            code, at, pos = found[1][0], found.start(), found.end()
        if code == _EOI:
            if scans == 0:  # a datastream of tables alone: libjpeg finds no image in it
                return damaged(f"an end-of-image marker before any image data at byte {at}")
            return layout(scan_data=first_scan if plain and scans == 1 else None)
        if code in _RESTARTS or code == _TEM:  # no length; out of place, but libjpeg goes on
            plain = False
            continue
        if code in _REFUSED:
            return damaged(f"a marker 0xFF{code:02X} that has no place at byte {at}")
        if pos + 2 > size:
            return damaged("it ends inside a segment header", truncated=True)
        end = pos + (data[pos] << 8 | data[pos + 1])
        if end < pos + 2:
            return damaged(f"a segment at byte {at} has a length below 2")
        if end > size:
            return damaged(f"the segment at byte {at} runs past the file's end", truncated=True)
        if code in _FRAMES:
            body = data[pos + 2 : end]
            if frame is not None:
                return damaged(f"a second frame header at byte {at}")
            if len(body) < 6:
                return damaged(f"a frame header too short at byte {at}")
            precision, components, frame = body[0], body[5], code
            height, width = int.from_bytes(body[1:3], "big"), int.from_bytes(body[3:5], "big")
            size_at = pos + 3
            plain &= code in _SEQUENTIAL
        elif code == _SOS:
            body = data[pos + 2 : end]
            # libjpeg decodes in one pass a sequential frame whose first scan holds every
            # component, and then expects nothing but the end.
            if components is None or one_pass:
                return damaged(f"a scan header out of place at byte {at}")
            if scans == 0:
                one_pass = frame not in _PROGRESSIVE and body[:1] == bytes([components])
                first_scan = end
            scans += 1
            if scans > MAX_SCANS:
                return layout()
            plain &= one_pass
            pos, code, damage = _scan_end(data, end, interval)
            if damage is not None:
                return damaged(damage, truncated=pos is None)
            plain &= code == _EOI
            continue
        elif code == _DRI:
            interval = int.from_bytes(data[pos + 2 : min(pos + 4, end)], "big")
        elif code not in _PLAIN_SEGMENTS:
            plain = False
        pos = end


def _scan_end(data: bytes, start: int, interval: int):
    """(where, code, None) of the first marker after the scan whose data begins at `start`
    that is not the scan's next restart marker; (where, code, what is wrong) where a restart
    marker is out of order; (None, None, what is wrong) where no marker follows. Restart
    markers count 0-7 from 0 in each scan, and come only with a restart interval."""
    expected = 0
    for found in _MARKER.finditer(data, start):
        code = found[1][0]
        if code not in _RESTARTS:
            return found.start(), code, None
        if interval == 0 or code != _RESTARTS[expected % 8]:
            return found.start(), code, f"a restart marker out of order at byte {found.start()}"
        expected += 1
    return None, None, "its image data ends before its end-of-image marker"
