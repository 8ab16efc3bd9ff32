"""The record format round-trips: what the writer stores is what both readers get back."""

import hashlib

import pytest
import tensorflow as tf

from tfrecord_pipe import schema

from conftest import jpeg_bytes


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


def test_python_round_trip_keeps_every_field():
    record = make_record()
    assert schema.decode_example(schema.serialize(record)) == record


def test_tf_parse_spec_reads_every_key_the_writer_sets():
    record = make_record(filename="daisy/ünïcode name.jpg")
    serialized = schema.serialize(record, label_offset=1)
    parsed = tf.io.parse_single_example(serialized, schema.parse_spec())
    assert parsed[schema.ENCODED].numpy() == record.encoded
    assert parsed[schema.FORMAT].numpy() == b"JPEG"
    assert parsed[schema.COLORSPACE].numpy() == b"RGB"
    assert parsed[schema.CHANNELS].numpy() == 3
    assert parsed[schema.HEIGHT].numpy() == 8
    assert parsed[schema.WIDTH].numpy() == 12
    assert parsed[schema.LABEL].numpy() == record.label_index + 1
    assert parsed[schema.SYNSET].numpy().decode() == "tulips"
    assert parsed[schema.FILENAME].numpy().decode() == "daisy/ünïcode name.jpg"
    assert parsed[schema.SHA256].numpy().decode() == record.sha256
    image = tf.io.decode_jpeg(parsed[schema.ENCODED], channels=3)
    assert image.shape == (8, 12, 3)


def test_parse_spec_covers_exactly_the_written_keys():
    example = schema.encode_example(make_record())
    assert set(example.features.feature) == set(schema.parse_spec())


@pytest.mark.parametrize("offset", [0, 1, 5])
def test_label_offset_is_added_on_write_and_removed_on_read(offset):
    record = make_record(label_index=0)
    example = schema.encode_example(record, label_offset=offset)
    assert example.features.feature[schema.LABEL].int64_list.value[0] == offset
    assert schema.decode_example(example.SerializeToString(), label_offset=offset) == record


def test_default_label_offset_matches_cloud_tpu_reference_models():
    assert schema.DEFAULT_LABEL_OFFSET == 1


def test_invalid_record_lists_every_problem():
    with pytest.raises(ValueError) as err:
        make_record(height=0, label_index=-1, sha256="nope")
    message = str(err.value)
    assert "height x width" in message
    assert "label_index" in message
    assert "sha256" in message


def test_negative_label_offset_is_refused():
    with pytest.raises(ValueError, match="label_offset"):
        schema.encode_example(make_record(), label_offset=-1)


def test_decode_refuses_a_record_of_another_format():
    foreign = tf.train.Example(
        features=tf.train.Features(
            feature={"image/encoded": tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"x"]))}
        )
    ).SerializeToString()
    with pytest.raises(ValueError, match="lacks required keys"):
        schema.decode_example(foreign)


def test_decode_refuses_bytes_that_are_not_an_example():
    with pytest.raises(ValueError, match="Not a tf.train.Example"):
        schema.decode_example(b"\xff\xff\xff garbage")


@pytest.mark.parametrize("offset", [0, 1])
def test_hand_written_bytes_equal_the_message_tensorflow_builds(offset):
    record = make_record(filename="daisy/ünïcode name.jpg", label_index=300)
    B = lambda v: tf.train.Feature(bytes_list=tf.train.BytesList(value=[v]))  # noqa: E731
    I = lambda v: tf.train.Feature(int64_list=tf.train.Int64List(value=[v]))  # noqa: E731,E741
    expected = tf.train.Example(features=tf.train.Features(feature={
        schema.ENCODED: B(record.encoded), schema.FORMAT: B(b"JPEG"),
        schema.COLORSPACE: B(b"RGB"), schema.CHANNELS: I(3), schema.HEIGHT: I(8),
        schema.WIDTH: I(12), schema.LABEL: I(300 + offset), schema.SYNSET: B(b"tulips"),
        schema.FILENAME: B("daisy/ünïcode name.jpg".encode()),
        schema.SHA256: B(record.sha256.encode()),
    }))  # fmt: skip
    serialized = schema.serialize(record, offset)
    assert tf.train.Example.FromString(serialized) == expected
    assert schema.serialize(record, offset) == serialized  # stable bytes
