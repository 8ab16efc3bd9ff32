"""validate.py: the TPU-readiness check and record inspection."""

import pytest
import tensorflow as tf

from tfrecord_pipe import reader, schema, validate

from dataset_factory import jpeg, write_dataset


def spec(*shapes_and_dtypes):
    return tuple(tf.TensorSpec(shape, dtype) for shape, dtype in shapes_and_dtypes)


def test_the_readers_output_passes_in_both_layouts(tmp_path):
    write_dataset(str(tmp_path), {"train": [[0, 1, 2]]})
    for transpose, layout in ((False, "NHWC"), (True, "HWCN")):
        ds = reader.make_input_fn(
            str(tmp_path), is_training=True, batch_size=2, image_size=16, transpose_input=transpose
        )()
        validate.check_tpu_ready(ds, 2, layout)


def test_every_problem_is_listed_at_once():
    bad = {
        "image": tf.TensorSpec((None, 8, 8, 3), tf.float32),
        "label": tf.TensorSpec((4,), tf.int64),
        "name": tf.TensorSpec((4,), tf.string),
        "size": tf.TensorSpec((3, 2), tf.int32),
    }
    with pytest.raises(validate.NotTpuReadyError) as caught:
        validate.check_tpu_ready(bad, 4)
    message = str(caught.value)
    assert "element['image']: shape (None, 8, 8, 3) has dynamic dimensions" in message
    assert "element['label']: dtype int64 is not TPU-ready (cast to int32)" in message
    assert "element['name']: dtype string is not TPU-ready" in message
    assert "element['size']: first (batch) dimension is 3, expected 4" in message


def test_an_unbatched_dataset_is_not_ready():
    ds = tf.data.Dataset.from_tensors((tf.zeros([8, 8, 3]), tf.constant(1, tf.int32)))
    with pytest.raises(validate.NotTpuReadyError, match="scalar has no batch dimension"):
        validate.check_tpu_ready(ds, 1)
    with pytest.raises(validate.NotTpuReadyError, match="dynamic dimensions"):
        validate.check_tpu_ready(ds.repeat().batch(4), 4)


def test_hwcn_images_have_the_batch_last():
    transposed = spec(((8, 8, 3, 4), tf.bfloat16), ((4,), tf.int32))
    validate.check_tpu_ready(transposed, 4, "HWCN")
    with pytest.raises(
        validate.NotTpuReadyError, match=r"element\[0\]: first \(batch\) dimension is 8"
    ):
        validate.check_tpu_ready(transposed, 4, "NHWC")


def test_inspect_reports_keys_labels_and_sizes(tmp_path):
    write_dataset(str(tmp_path), {"train": [[0, 1], [2]], "validation": [[1]]}, size=(40, 30))
    report = validate.inspect_records(str(tmp_path))
    assert report.records_read == 4 and len(report.files) == 3
    assert set(report.keys) == set(schema.parse_spec())
    assert report.stored_labels == (1, 3)  # written with label_offset 1
    assert report.label_texts == {1: "red", 2: "green", 3: "blue"}
    assert report.heights == (30, 30) and report.widths == (40, 40)
    assert report.problems == ()
    assert "stored labels 1..3: 1=red, 2=green, 3=blue" in str(report)


def test_inspect_flags_a_record_whose_image_is_not_its_stated_size(tmp_path):
    path = str(tmp_path / "odd.tfrecord")
    record = schema.ImageRecord(
        encoded=jpeg(20, 10, (1, 2, 3)),
        height=11,
        width=20,
        label_index=0,
        label_text="x",
        filename="x/1.jpg",
        sha256="0" * 64,
    )
    with tf.io.TFRecordWriter(path) as writer:
        writer.write(schema.serialize(record))
        writer.write(b"not an example")
    report = validate.inspect_records(path)
    assert report.records_read == 2
    assert any("decodes to (10, 20, 3), the record says 11x20x3" in p for p in report.problems)
    assert any("record 2" in problem for problem in report.problems)


def test_inspect_reports_a_truncated_shard_instead_of_raising(tmp_path):
    write_dataset(str(tmp_path), {"train": [[0, 1, 2]]})
    shard = tmp_path / "train-00000-of-00001.tfrecord"
    shard.write_bytes(shard.read_bytes()[:-50])
    report = validate.inspect_records(str(tmp_path))
    assert report.records_read == 2
    assert any("reading stopped after 2 records" in problem for problem in report.problems)


def test_inspect_of_nothing_says_what_it_expected(tmp_path):
    with pytest.raises(ValueError, match="No TFRecord files"):
        validate.inspect_records(str(tmp_path))
