"""The record format, defined once: keys, types, writing and reading, in plain Python.

The converter (`beam_jobs`) writes records with `serialize`; `verify` and `inspect` read them
back with `decode_example`, the reader parses them in the tf.data graph with a spec built from
`FEATURES` (`reading.records.parse_spec`). All take the format from here, so writer and readers
cannot drift. No TensorFlow: the conversion job's workers write the protobuf wire format
themselves (`serialize`), and `parse_features` reads it back.

The keys are those the Cloud TPU reference image models and TensorFlow Model Garden read, so
shards written here drop into those readers unchanged.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import struct
from collections.abc import Iterator

FORMAT_VERSION = 1

# The Cloud TPU reference ResNet reads labels 1..1000 and subtracts 1; 0 was "background".
DEFAULT_LABEL_OFFSET = 1
# The largest offset the converter writes: far above any real use (0 for 0-based labels, 1 as
# the Cloud TPU models expect, a few thousand to merge label spaces), and small enough that the
# placeholder class names TFDS gets below it stay a small file and a stored label cannot wrap.
MAX_LABEL_OFFSET = 10_000

ENCODED = "image/encoded"
FORMAT = "image/format"
COLORSPACE = "image/colorspace"
CHANNELS = "image/channels"
HEIGHT = "image/height"
WIDTH = "image/width"
LABEL = "image/class/label"
SYNSET = "image/class/synset"
FILENAME = "image/filename"
SHA256 = "image/key/sha256"

# The kinds of a tf.train.Feature, as example/feature.proto names them.
BYTES, FLOATS, INT64 = "bytes_list", "float_list", "int64_list"

# Every key of the format and its kind; each record holds exactly one value per key.
FEATURES = {
    ENCODED: BYTES,
    FORMAT: BYTES,
    COLORSPACE: BYTES,
    CHANNELS: INT64,
    HEIGHT: INT64,
    WIDTH: INT64,
    LABEL: INT64,
    SYNSET: BYTES,
    FILENAME: BYTES,
    SHA256: BYTES,
}

STORED_FORMAT = b"JPEG"
STORED_COLORSPACE = b"RGB"
STORED_CHANNELS = 3

_SHA256_HEX = re.compile(r"[0-9a-f]{64}")


@dataclasses.dataclass(frozen=True)
class ImageRecord:
    """One stored image and what we know about it.

    Attributes:
      encoded: JPEG bytes that `tf.io.decode_jpeg(x, channels=3)` decodes upright to H x W x 3.
      height: rows of the stored JPEG, in pixels.
      width: columns of the stored JPEG, in pixels.
      label_index: 0-based index into the dataset's label list (the offset is added on write).
      label_text: the label's name (the "synset").
      filename: the source path relative to the input root.
      sha256: hex digest of the *source* file's bytes, so a record traces back to its input.
    """

    encoded: bytes
    height: int
    width: int
    label_index: int
    label_text: str
    filename: str
    sha256: str

    def __post_init__(self):
        problems = []
        if not self.encoded:
            problems.append("encoded is empty")
        if self.height <= 0 or self.width <= 0:
            problems.append(f"height x width must be positive, got {self.height} x {self.width}")
        if self.label_index < 0:
            problems.append(f"label_index must be >= 0, got {self.label_index}")
        if not _SHA256_HEX.fullmatch(self.sha256):
            problems.append(f"sha256 must be 64 lowercase hex digits, got {self.sha256!r}")
        if problems:
            raise ValueError(f"Invalid ImageRecord for {self.filename!r}: " + "; ".join(problems))


def serialize(record: ImageRecord, *, label_offset: int) -> bytes:
    """The serialized `tf.train.Example` for `record`: what goes into a TFRecord shard.

    Args:
      record: the image and its metadata.
      label_offset: added to `record.label_index` (recorded in the manifest, so readers can
        undo it): 1 matches the Cloud TPU reference models, 0 gives plain 0-based labels.

    Written in the protobuf wire format directly, keys in sorted order, so the same record
    always gives the same bytes, without TensorFlow and faster than its message classes
    (benchmarks/RESULTS.md, "Serializing records").

    Raises:
      ValueError: `label_offset` is negative.
    """
    head, tail = serialized_around_image(record, label_offset=label_offset)
    return b"".join((head, record.encoded, tail))


def serialized_around_image(record: ImageRecord, *, label_offset: int) -> tuple[bytes, bytes]:
    """What `serialize` writes before and after the image bytes: a record's bytes are
    head + record.encoded + tail, for what compares records' bytes without copying the image
    (`decode_written`)."""
    if label_offset < 0:
        raise ValueError(f"label_offset must be >= 0, got {label_offset}")
    image_head = _head(ENCODED, _BYTES_LIST, len(record.encoded))
    before = _label_entries(record.label_index + label_offset, record.label_text) + image_head
    filename = record.filename.encode("utf-8")
    after = b"".join((
        _entry_head(FILENAME, _BYTES_LIST, len(filename)),
        filename,
        _CONSTANT_ENTRIES[FORMAT],
        _int_entry(HEIGHT, record.height),
        _SHA256_HEAD,
        record.sha256.encode("ascii"),
        _int_entry(WIDTH, record.width),
    ))  # fmt: skip
    length = len(before) + len(record.encoded) + len(after)
    # Example.features (field 1) holding the entries.
    return b"\x0a" + _varint(length) + before, after


# Field numbers of the messages in tensorflow/core/example/{example,feature}.proto:
# Features.feature is a map<string, Feature> (entries: key = 1, value = 2), and a Feature
# holds one of these lists, whose repeated `value` is field 1 (int64 values packed).
_BYTES_LIST = 1
_INT64_LIST = 3


def _varint(value: int) -> bytes:
    """A protobuf varint of a non-negative int (every value a record holds is one)."""
    if value < 0x80:
        return bytes((value,))
    if value < 0x200000:  # two or three bytes: any image's length up to 2 MiB, no loop
        if value < 0x4000:
            return bytes((value & 0x7F | 0x80, value >> 7))
        return bytes((value & 0x7F | 0x80, value >> 7 & 0x7F | 0x80, value >> 14))
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _head(key: str, kind: int, payload_length: int) -> bytes:
    """A map entry {key, Feature{kind {value: <payload>}}} up to where the payload starts."""
    key_bytes = key.encode("utf-8")
    value_list = b"\x0a" + _varint(payload_length)
    feature = bytes((kind << 3 | 2,)) + _varint(len(value_list) + payload_length)
    value = b"\x12" + _varint(len(feature) + len(value_list) + payload_length)
    key_field = b"\x0a" + _varint(len(key_bytes)) + key_bytes
    inner = len(key_field) + len(value) + len(feature) + len(value_list) + payload_length
    return b"".join((b"\x0a", _varint(inner), key_field, value, feature, value_list))


# The same few keys and lengths, record after record; not the image's, nearly always new.
_entry_head = functools.lru_cache(maxsize=4096)(_head)


def _entry(key: str, kind: int, payload: bytes) -> bytes:
    return _entry_head(key, kind, len(payload)) + payload


# The entries every record has with the same value.
_CONSTANT_ENTRIES = {
    FORMAT: _entry(FORMAT, _BYTES_LIST, STORED_FORMAT),
    COLORSPACE: _entry(COLORSPACE, _BYTES_LIST, STORED_COLORSPACE),
    CHANNELS: _entry(CHANNELS, _INT64_LIST, _varint(STORED_CHANNELS)),
}
_SHA256_HEAD = _entry_head(SHA256, _BYTES_LIST, 64)  # a valid record's hash: 64 hex digits


# Made once per label and per size: a record's entries besides its image, name and hash
# repeat from record to record, and building them was most of a record's serialization.
@functools.lru_cache(maxsize=4096)
def _label_entries(label: int, label_text: str) -> bytes:
    """The entries before the image's, in key order, for a record of this label."""
    return b"".join((
        _CONSTANT_ENTRIES[CHANNELS],
        _entry(LABEL, _INT64_LIST, _varint(label)),
        _entry(SYNSET, _BYTES_LIST, label_text.encode("utf-8")),
        _CONSTANT_ENTRIES[COLORSPACE],
    ))  # fmt: skip


@functools.lru_cache(maxsize=4096)
def _int_entry(key: str, value: int) -> bytes:
    return _entry(key, _INT64_LIST, _varint(value))


# Reading: the wire format back into values, for tools that look at records one at a time
# (verify, inspect, tests); training parses in the tf.data graph instead.

_FIELD_OF_KIND = {_BYTES_LIST: BYTES, 2: FLOATS, _INT64_LIST: INT64}
_VARINT, _FIXED64, _LENGTH, _FIXED32 = 0, 1, 2, 5  # protobuf wire types


def parse_features(serialized: bytes) -> dict[str, tuple[str, list]]:
    """Every feature of a serialized `tf.train.Example`: key -> (kind, values).

    `kind` is BYTES, FLOATS or INT64 ("empty" for a feature holding no list); any Example
    parses, ours or not, as TensorFlow's parser reads it (a repeated key: the last one counts;
    a feature's first list, `_feature`).

    Raises:
      ValueError: the bytes are not a protobuf message of the Example's shape.
    """
    features = {}
    for number, wire, value in _fields(memoryview(serialized)):
        if number != 1:  # Example.features; anything else is an unknown field
            continue
        _expect_length(wire, "Example.features")
        for entry_number, entry_wire, entry in _fields(value):
            if entry_number != 1:
                continue
            _expect_length(entry_wire, "Features.feature")
            key, feature = "", memoryview(b"")
            for part, part_wire, part_value in _fields(entry):
                if part in (1, 2):
                    _expect_length(part_wire, "a feature map entry")
                    if part == 1:
                        key = bytes(part_value).decode("utf-8")
                    else:
                        feature = part_value
            features[key] = _feature(feature)
    return features


def _feature(data: memoryview) -> tuple[str, list]:
    """A Feature's (kind, values), as TensorFlow's parser (what the reader runs) reads it: the
    first list decides, and any list after it is passed over. (Protobuf's own rule, the last
    kind and its lists joined, let verify pass records the reader then stopped on.)"""
    for number, wire, value in _fields(data):
        if number in _FIELD_OF_KIND:
            _expect_length(wire, "a Feature's list")
            return _FIELD_OF_KIND[number], _list_values(_FIELD_OF_KIND[number], value)
    return "empty", []


def _list_values(kind: str, data: memoryview) -> list:
    values = []
    for number, wire, value in _fields(data):
        if number != 1:
            continue
        if kind == BYTES:
            _expect_length(wire, "a bytes_list value")
            values.append(bytes(value))
        elif kind == FLOATS:
            if wire == _LENGTH and len(value) % 4 == 0:  # packed
                values.extend(struct.unpack(f"<{len(value) // 4}f", value))
            elif wire == _FIXED32:
                values.append(struct.unpack("<f", value)[0])
            else:  # (a varint here is an int: never make bytes of it)
                raise ValueError("a float_list value is neither packed nor a fixed32")
        elif wire == _LENGTH:  # packed int64 values
            position = 0
            while position < len(value):
                number, position = _read_varint(value, position)
                values.append(_signed(number))
        elif wire == _VARINT:
            values.append(_signed(value))
        else:
            raise ValueError("an int64_list value is neither packed nor a varint")
    return values


def _fields(data: memoryview) -> Iterator[tuple[int, int, object]]:
    """(field number, wire type, value) of each field of a message: an int for varints, the
    bytes (a memoryview) for the others."""
    position = 0
    while position < len(data):
        tag, position = _read_varint(data, position)
        number, wire = tag >> 3, tag & 7
        if number == 0:
            raise ValueError("field number 0")
        if wire == _VARINT:
            value, position = _read_varint(data, position)
        elif wire in (_FIXED64, _FIXED32):
            end = position + (8 if wire == _FIXED64 else 4)
            value, position = data[position:end], end
        elif wire == _LENGTH:
            length, position = _read_varint(data, position)
            value, position = data[position : position + length], position + length
        else:
            raise ValueError(f"wire type {wire} (groups or invalid) in field {number}")
        if position > len(data):
            raise ValueError(f"field {number} runs past the end of the message")
        yield number, wire, value


def _read_varint(data: memoryview, position: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if position >= len(data):
            raise ValueError("a varint runs past the end of the message")
        byte = data[position]
        position += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result & _UINT64, position  # bits past 64 dropped, as protobuf drops them
        shift += 7
        if shift >= 70:
            raise ValueError("a varint longer than 10 bytes")


_UINT64 = (1 << 64) - 1


def _signed(value: int) -> int:
    """An int64 from its varint (negative values are sent as 2**64 + value)."""
    return value - (1 << 64) if value >= 1 << 63 else value


def _expect_length(wire: int, what: str) -> None:
    if wire != _LENGTH:
        raise ValueError(f"{what} is wire type {wire}, not a length-delimited field")


def decode_written(serialized: bytes, *, label_offset: int) -> ImageRecord | None:
    """The record, if `serialized` is laid out as `serialize` lays records out; else None.

    Reads what the converter wrote at a fifth of `decode_parsed`'s cost (verify reads every
    record), and exactly as it would: the values are found where the layout's lengths put
    them, and the bytes must be what `serialize` writes for them. Any other bytes (a record
    edited, extended, or written by another tool) give None, and `decode_parsed` reads them
    as TensorFlow does and says what is wrong. (tests/test_schema.py holds the two to the
    same answer on damaged records.)
    """
    try:
        values, image_at = _written_values(serialized)
        label, synset, image, filename, height, sha256, width = values
        record = ImageRecord(
            encoded=image,
            height=_one_int(height),
            width=_one_int(width),
            label_index=_one_int(label) - label_offset,
            label_text=synset.decode("utf-8"),
            filename=filename.decode("utf-8"),
            sha256=sha256.decode("ascii"),
        )
        head, tail = serialized_around_image(record, label_offset=label_offset)
    except (ValueError, IndexError):  # UnicodeDecodeError is a ValueError
        return None
    if serialized[:image_at] != head or serialized[image_at + len(image) :] != tail:
        return None  # not as `serialize` writes them (a length, a varint, a constant)
    return record


def _written_values(data: bytes) -> tuple[list[bytes], int]:
    """The values of the entries not constant, in the order `serialize` writes them, and
    where the image starts: each where the lengths before it put it, nothing else checked
    (`decode_written` compares every byte after). One pass, in time linear in the record:
    a pattern of the layout, searched instead, backtracked for minutes on a crafted record.

    Raises:
      ValueError, IndexError: the bytes are not of the layout.
    """
    if data[0] != 0x0A:
        raise ValueError("not the written layout")
    at = 1
    while data[at] >= 0x80:  # the features' length
        at += 1
    at += 1
    values, image_at = [], 0
    for entry in _WRITTEN_LAYOUT:
        if isinstance(entry, bytes):  # a constant entry
            if not data.startswith(entry, at):
                raise ValueError("not the written layout")
            at += len(entry)
            continue
        key_field, list_tag = entry  # as `_entry_head` writes them
        if data[at] != 0x0A:
            raise ValueError("not the written layout")
        at += 1
        while data[at] >= 0x80:  # the entry's length (varints skipped inline: 20 a record)
            at += 1
        if not data.startswith(key_field, at + 1):
            raise ValueError("not the written layout")
        at += 1 + len(key_field)
        while data[at] >= 0x80:  # the value's length
            at += 1
        if data[at + 1] != list_tag:
            raise ValueError("not the written layout")
        at += 2
        while data[at] >= 0x80:  # the list's length
            at += 1
        if data[at + 1] != 0x0A:
            raise ValueError("not the written layout")
        length, at = data[at + 2], at + 3
        if length >= 0x80:
            length, at = _read_varint(memoryview(data), at - 1)
        if at + length > len(data):
            raise ValueError("not the written layout")
        if key_field is _IMAGE_KEY_FIELD:
            image_at = at
        values.append(data[at : at + length])
        at += length
    if at != len(data):
        raise ValueError("not the written layout")
    return values, image_at


def _one_int(packed: bytes) -> int:
    """The one value of a packed int64 list (negative ones as decode_parsed reads them)."""
    if len(packed) == 1 and packed[0] < 0x80:  # most values: one byte, read at a fifth
        return packed[0]
    value, end = _read_varint(memoryview(packed), 0)
    if end != len(packed):
        raise ValueError("not one value")
    return _signed(value)


# (key as bytes, key, field of its list) in the order `serialize` writes them (sorted keys,
# each under 128 bytes long: a one-byte length).
_WRITTEN_ORDER = tuple(
    (key.encode(), key, _BYTES_LIST if FEATURES[key] == BYTES else _INT64_LIST)
    for key in sorted(FEATURES)
)
# That layout, an entry at a time: a constant entry's bytes, or (another's key field up to
# its value's length, the tag of its value's list), as `_entry_head` writes them.
_IMAGE_KEY_FIELD = b"\x0a" + bytes([len(ENCODED)]) + ENCODED.encode() + b"\x12"
_WRITTEN_LAYOUT = tuple(
    _CONSTANT_ENTRIES[name] if name in _CONSTANT_ENTRIES else (
        _IMAGE_KEY_FIELD if name == ENCODED else b"\x0a" + bytes([len(key)]) + key + b"\x12",
        kind << 3 | 2,
    )
    for key, name, kind in _WRITTEN_ORDER
)  # fmt: skip


def decode_example(serialized: bytes, *, label_offset: int) -> ImageRecord:
    """Reads one serialized record back into an `ImageRecord`: records laid out as
    `serialize` writes them at a third of the cost (`decode_written`), any other bytes as
    TensorFlow's parser reads them (`decode_parsed`), with the same answer either way.

    Raises:
      ValueError: as `decode_parsed`.
    """
    written = decode_written(serialized, label_offset=label_offset)
    return written if written is not None else decode_parsed(serialized, label_offset=label_offset)


def decode_parsed(serialized: bytes, *, label_offset: int) -> ImageRecord:
    """Reads one serialized record back into an `ImageRecord`, parsing it field by field as
    TensorFlow's parser does, whatever its layout.

    Args:
      serialized: a record of a shard.
      label_offset: what the dataset's labels were written with (its manifest says); it is
        subtracted from the stored label.

    Raises:
      ValueError: the bytes are not a record of this format, naming what is missing or wrong
        (a label below `label_offset` included).
    """
    try:
        features = parse_features(serialized)
    except ValueError as err:
        raise ValueError(f"Not a tf.train.Example: {err}") from err
    missing = [key for key in FEATURES if key not in features]
    if missing:
        raise ValueError(f"Record lacks required keys {missing}; is it a tfrecord-pipe record?")
    problems = []
    for key, kind in FEATURES.items():
        found_kind, values = features[key]
        if found_kind != kind or len(values) != 1:
            problems.append(f"{key} holds {len(values)} {found_kind} values, expected one {kind}")
    if problems:
        raise ValueError("; ".join(problems))
    value = {key: features[key][1][0] for key in FEATURES}
    for key, expected in ((FORMAT, STORED_FORMAT), (COLORSPACE, STORED_COLORSPACE),
                          (CHANNELS, STORED_CHANNELS)):  # fmt: skip
        if value[key] != expected:
            raise ValueError(f"{key} is {value[key]!r}, expected {expected!r}")
    try:
        return ImageRecord(
            encoded=value[ENCODED],
            height=value[HEIGHT],
            width=value[WIDTH],
            label_index=value[LABEL] - label_offset,
            label_text=value[SYNSET].decode("utf-8"),
            filename=value[FILENAME].decode("utf-8"),
            sha256=value[SHA256].decode("ascii"),
        )
    except UnicodeDecodeError as err:
        raise ValueError(f"A text feature is not UTF-8: {err}") from err
