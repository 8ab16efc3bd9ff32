"""The record format round-trips: what the writer stores is what both readers get back."""

import hashlib
import itertools

import pytest
import tensorflow as tf

from tfrecord_pipe._core import schema
from tfrecord_pipe._reading import records

from helpers import jpeg_bytes, length_delimited, run_python


def make_record(**overrides) -> schema.ImageRecord:
    encoded = jpeg_bytes(12, 8)
    fields = dict(
        encoded=encoded,
        height=8,
        width=12,
        label_index=2,
        label_text="tulips",
        filename="tulips/0001.jpg",
        sha256=hashlib.sha256(encoded).hexdigest(),
    )
    fields.update(overrides)
    return schema.ImageRecord(**fields)


def feature(value) -> tf.train.Feature:
    if isinstance(value, bytes):
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))
    return tf.train.Feature(int64_list=tf.train.Int64List(value=[value]))


def example_of(record: schema.ImageRecord, offset: int, **replaced) -> tf.train.Example:
    """The Example TensorFlow's own classes build for `record`, with features replaced."""
    values = {
        schema.ENCODED: record.encoded, schema.FORMAT: b"JPEG", schema.COLORSPACE: b"RGB",
        schema.CHANNELS: 3, schema.HEIGHT: record.height, schema.WIDTH: record.width,
        schema.LABEL: record.label_index + offset, schema.SYNSET: record.label_text.encode(),
        schema.FILENAME: record.filename.encode(), schema.SHA256: record.sha256.encode(),
    }  # fmt: skip
    values.update(replaced)
    features = {key: value for key, value in values.items() if value is not None}
    return tf.train.Example(features=tf.train.Features(
        feature={key: value if isinstance(value, tf.train.Feature) else feature(value)
                 for key, value in features.items()}
    ))  # fmt: skip


@pytest.mark.parametrize("offset", [0, 1, 5])
def test_python_round_trip_keeps_every_field(offset):
    record = make_record(filename="daisy/ünïcode name.jpg", label_index=300)
    serialized = schema.serialize(record, label_offset=offset)
    assert schema.decode_example(serialized, label_offset=offset) == record


@pytest.mark.parametrize("offset", [0, 1])
def test_hand_written_bytes_equal_the_message_tensorflow_builds(offset):
    record = make_record(filename="daisy/ünïcode name.jpg", label_index=300)
    serialized = schema.serialize(record, label_offset=offset)
    assert tf.train.Example.FromString(serialized) == example_of(record, offset)


@pytest.mark.parametrize("length", [1, 127, 128, 16383, 16384, 2097151, 2097152])
def test_every_length_and_value_is_written_as_tensorflow_writes_it(length):
    # Lengths and values on each side of a varint's one, two, three and four bytes.
    record = make_record(encoded=b"\xff" * length, height=length, width=length + 1,
                         label_index=length - 1, filename="x" * (length % 300 + 1))  # fmt: skip
    for offset in (0, 1):
        serialized = schema.serialize(record, label_offset=offset)
        assert tf.train.Example.FromString(serialized) == example_of(record, offset)
        assert schema.decode_example(serialized, label_offset=offset) == record


def test_tf_parse_spec_reads_every_key_the_writer_sets():
    record = make_record(filename="daisy/ünïcode name.jpg")
    serialized = schema.serialize(record, label_offset=1)
    parsed = tf.io.parse_single_example(serialized, records.parse_spec())
    assert set(parsed) == set(schema.FEATURES)
    assert parsed[schema.ENCODED].numpy() == record.encoded
    assert parsed[schema.LABEL].numpy() == record.label_index + 1
    assert parsed[schema.FILENAME].numpy().decode() == "daisy/ünïcode name.jpg"
    assert tf.io.decode_jpeg(parsed[schema.ENCODED], channels=3).shape == (8, 12, 3)
    subset = records.parse_spec(schema.LABEL, schema.WIDTH)
    assert set(tf.io.parse_single_example(serialized, subset)) == {schema.LABEL, schema.WIDTH}


def test_the_python_reader_reads_what_tensorflow_serializes():
    # An Example TensorFlow wrote, with its own field order, packed ints and a negative one,
    # an extra key and a float list: every value as TensorFlow's parser sees it.
    record = make_record()
    message = example_of(record, 1, **{
        "extra/floats": tf.train.Feature(float_list=tf.train.FloatList(value=[0.5, -2.0])),
        "extra/ints": tf.train.Feature(int64_list=tf.train.Int64List(value=[-3, 1 << 40, 7])),
        "extra/empty": tf.train.Feature(),
    })  # fmt: skip
    parsed = schema.parse_features(message.SerializeToString())
    assert parsed["extra/floats"] == (schema.FLOATS, [0.5, -2.0])
    assert parsed["extra/ints"] == (schema.INT64, [-3, 1 << 40, 7])
    assert parsed["extra/empty"] == ("empty", [])
    assert parsed[schema.ENCODED] == (schema.BYTES, [record.encoded])
    assert schema.decode_example(message.SerializeToString(), label_offset=1) == record


@pytest.mark.parametrize(
    "replaced, message",
    [
        ({schema.HEIGHT: None}, r"lacks required keys \['image/height'\]"),
        ({schema.LABEL: b"7"}, "image/class/label holds 1 bytes_list values, expected one int64"),
        ({schema.SHA256: tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"a", b"b"]))},
         "image/key/sha256 holds 2 bytes_list values"),
        ({schema.FORMAT: b"PNG"}, "image/format is b'PNG', expected b'JPEG'"),
        ({schema.CHANNELS: 1}, "image/channels is 1, expected 3"),
        ({schema.LABEL: 0}, "label_index must be >= 0, got -1"),
    ],
)
def test_decode_refuses_what_the_reader_would_refuse_naming_the_key(replaced, message):
    serialized = example_of(make_record(), 1, **replaced).SerializeToString()
    with pytest.raises(ValueError, match=message):
        schema.decode_example(serialized, label_offset=1)


# A float list whose value is a varint of 2**62: read as a length, it would ask for exabytes.
HUGE_FLOAT = b"\x0a\x13\x0a\x11\x0a\x01k\x12\x0c\x12\x0a\x08" + bytes([0x80] * 8) + b"\x40"


@pytest.mark.parametrize(
    "data",
    [b"\xff\xff\xff garbage", b"not an example", b"\x0a\x05ab", b"\x0a\xff", HUGE_FLOAT],
)
def test_decode_refuses_bytes_that_are_not_an_example(data):
    with pytest.raises(ValueError, match="Not a tf.train.Example"):
        schema.decode_example(data, label_offset=1)


def test_invalid_record_lists_every_problem():
    with pytest.raises(ValueError) as err:
        make_record(height=0, label_index=-1, sha256="nope")
    message = str(err.value)
    assert "height x width" in message
    assert "label_index" in message
    assert "sha256" in message


def test_negative_label_offset_is_refused():
    with pytest.raises(ValueError, match="label_offset"):
        schema.serialize(make_record(), label_offset=-1)


@pytest.mark.parametrize("dtype", [tf.int64, tf.string])
def test_malformed_features_are_read_as_tensorflows_parser_reads_them(dtype):
    # Every Feature of one to three lists (empty, one or two values, packed or not, of each
    # kind): ours and TensorFlow's parser agree on which a scalar feature accepts and its
    # value. Protobuf's own rule (the last list's kind, lists joined) let verify pass records
    # the reader stopped on.
    ld = length_delimited
    lists = {
        "b0": ld(1, b""), "b1": ld(1, ld(1, b"x")), "b2": ld(1, ld(1, b"x") + ld(1, b"y")),
        "f1": ld(2, tf.train.FloatList(value=[1.0]).SerializeToString()),
        "i0": ld(3, b""), "i1": ld(3, tf.train.Int64List(value=[5]).SerializeToString()),
        "i2": ld(3, tf.train.Int64List(value=[5, 6]).SerializeToString()), "i1u": ld(3, b"\x08\x07"),
        # 2**65 + 100 in ten varint bytes: protobuf keeps the low 64 bits (100).
        "i1long": ld(3, b"\x08" + bytes([0x80 | 100] + [0x80] * 8 + [0x04])),
    }  # fmt: skip
    spec = {"k": tf.io.FixedLenFeature([], dtype)}
    wanted = schema.INT64 if dtype == tf.int64 else schema.BYTES
    for count in (1, 2, 3):
        for combo in itertools.product(lists, repeat=count):
            example = ld(1, ld(1, ld(1, b"k") + ld(2, b"".join(lists[c] for c in combo))))
            try:
                theirs = tf.io.parse_single_example(example, spec)["k"].numpy()
            except tf.errors.InvalidArgumentError:
                theirs = None
            kind, values = schema.parse_features(example)["k"]
            ours = values[0] if kind == wanted and len(values) == 1 else None
            assert ours == theirs, combo


def _decoded(serialized: bytes, offset: int = 1):
    try:
        return schema.decode_parsed(serialized, label_offset=offset)
    except ValueError as err:
        return f"refused: {err}"


@pytest.mark.parametrize("offset", [0, 1])
def test_the_fast_reading_of_written_records_reads_as_the_full_parser_or_not_at_all(offset):
    # Records laid out as `serialize` writes them are read by `decode_written`, which must
    # never read bytes otherwise than `decode_parsed` (TensorFlow's rules), nor read any
    # bytes but those `serialize` writes: on every
    # damaged copy of written records (each byte of the layout changed to three others, cut
    # short, a byte added or dropped), it reads what decode_example reads, or gives None.
    records = [make_record(), make_record(label_index=300, height=200, width=70000,
                                           filename="a/" + "ü" * 90 + ".jpg", label_text="x" * 130)]
    read_fast = 0
    for record in records:
        written = schema.serialize(record, label_offset=offset)
        assert schema.decode_written(written, label_offset=offset) == record
        start = written.index(record.encoded)
        layout = [*range(start), *range(start + len(record.encoded), len(written))]
        damaged = [written[:cut] for cut in range(len(written))]
        damaged += [written[:at] + written[at + 1:] for at in layout]
        damaged += [written[:at] + b"\x01" + written[at:] for at in layout]
        damaged += [written[:at] + bytes([(written[at] + delta) % 256]) + written[at + 1:]
                    for at in layout for delta in (1, 0x80, 0x7F)]  # fmt: skip
        # Whole entries added inside the message (its length fixed): a key again, or another.
        _, body_start = schema._read_varint(memoryview(written), 1)
        for key, value in ((schema.LABEL, b"\x07"), (schema.FILENAME, b"x.jpg"), ("other", b"")):
            kind = schema._INT64_LIST if key == schema.LABEL else schema._BYTES_LIST
            body = written[body_start:] + schema._entry(key, kind, value)
            damaged.append(b"\x0a" + schema._varint(len(body)) + body)
        for data in damaged:
            fast = schema.decode_written(data, label_offset=offset)
            if fast is not None:
                read_fast += 1
                assert _decoded(data, offset) == fast, data
                # And its bytes are those `serialize` writes for it (verify relies on this).
                assert schema.serialize(fast, label_offset=offset) == data, data
    assert read_fast, "no damaged record read fast: the comparison proves nothing"


def test_a_record_crafted_against_the_fast_reading_is_refused_at_once():
    # The fast reading searched a pattern of the layout, which backtracked on an image made
    # of the next entries' heads: a 20 kB record took 85 s, and one in a shard stalled
    # verify and `inspect`. It now follows the lengths, in one pass. (In a process of its
    # own: the search it replaced would not have ended for centuries on this record.)
    code = """if True:
        from tfrecord_pipe._core import schema as s
        record = s.ImageRecord(encoded=b"x", height=8, width=8, label_index=0, label_text="a",
                               filename="a/1.jpg", sha256="0" * 64)
        head, _ = s.serialized_around_image(record, label_offset=1)
        unit = (s._entry_head(s.FILENAME, 1, 5) + s._CONSTANT_ENTRIES[s.FORMAT]
                + s._entry_head(s.HEIGHT, 3, 1) + s._entry_head(s.SHA256, 1, 64))
        crafted = head + unit * 2000 + b"zz"
        assert s.decode_written(crafted, label_offset=1) is None
        try:  # as `inspect` and the reader's tools read a record
            s.decode_example(crafted, label_offset=1)
        except ValueError as err:
            print(len(crafted), "refused:", err)
    """
    done = run_python(code, timeout=60)
    assert done.returncode == 0 and "refused:" in done.stdout, done.stderr[-2000:]
    assert int(done.stdout.split()[0]) > 100_000
