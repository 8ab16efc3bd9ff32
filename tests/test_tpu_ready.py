"""tpu_ready.py: static, batched, TPU-typed elements pass; everything else is listed."""

import pytest
import tensorflow as tf

from tfrecord_pipe import reader
from tfrecord_pipe._reading import tpu_ready

from dataset_factory import write_dataset


def spec(*shapes_and_dtypes):
    return tuple(tf.TensorSpec(shape, dtype) for shape, dtype in shapes_and_dtypes)


@pytest.mark.slow  # over a second of CPU: out of the fast subset
def test_the_readers_output_passes_in_both_layouts(tmp_path):
    write_dataset(str(tmp_path), {"train": [[0, 1, 2]]})
    for transpose, layout in ((False, "NHWC"), (True, "HWCN")):
        ds = reader.make_input_fn(
            str(tmp_path), is_training=True, batch_size=2, image_size=16, transpose_input=transpose
        )()
        tpu_ready.check(ds, 2, layout)
    # The input_fn itself, or its numpy batches, were "not a dense tensor ... batch with
    # drop_remainder=True": advice for another mistake.
    train_fn = reader.make_input_fn(str(tmp_path), is_training=True, batch_size=2, image_size=16,
                                    seed=1)  # fmt: skip
    for given in (train_fn, train_fn.numpy_batches()):
        kind = type(given).__name__
        with pytest.raises(ValueError, match=f"takes a tf.data.Dataset .*got {kind}: call the"):
            tpu_ready.check(given, 2)
    tpu_ready.check(iter(train_fn()), 2)  # an iterator has the dataset's element_spec


def test_every_problem_is_listed_at_once():
    bad = {
        "image": tf.TensorSpec((None, 8, 8, 3), tf.float32),
        "label": tf.TensorSpec((4,), tf.int64),
        "name": tf.TensorSpec((4,), tf.string),
        "size": tf.TensorSpec((3, 2), tf.int32),
    }
    with pytest.raises(tpu_ready.NotTpuReadyError) as caught:
        tpu_ready.check(bad, 4)
    message = str(caught.value)
    assert "element['image']: shape (None, 8, 8, 3) has dynamic dimensions" in message
    assert "element['label']: dtype int64 is not TPU-ready (cast to int32)" in message
    assert "element['name']: dtype string is not TPU-ready" in message
    assert "element['size']: first (batch) dimension is 3, expected 4" in message
    assert message.endswith("\nBatch with drop_remainder=True and give every image a fixed "
                            "size.\nBatches of 3: check batch_size against the batch the pipeline "
                            "makes (under a strategy, the reader's batches are each replica's: "
                            "the global batch over the replicas in sync).")  # fmt: skip
    # A batch of another size alone is not told to batch with drop_remainder (a helper's
    # trial: the pipeline's batch was 8, checked for 1024).
    with pytest.raises(tpu_ready.NotTpuReadyError) as caught:
        tpu_ready.check(spec(((8, 4, 4, 3), tf.float32), ((8,), tf.int32)), 1024)
    assert "drop_remainder" not in str(caught.value)
    assert str(caught.value).endswith("\nBatches of 8: check batch_size against the batch the "
                                      "pipeline makes (under a strategy, the reader's batches "
                                      "are each replica's: the global batch over the replicas "
                                      "in sync).")  # fmt: skip


def test_an_unbatched_dataset_is_not_ready():
    ds = tf.data.Dataset.from_tensors((tf.zeros([8, 8, 3]), tf.constant(1, tf.int32)))
    with pytest.raises(tpu_ready.NotTpuReadyError, match="scalar has no batch dimension"):
        tpu_ready.check(ds, 1)
    with pytest.raises(tpu_ready.NotTpuReadyError, match="dynamic dimensions"):
        tpu_ready.check(ds.repeat().batch(4), 4)


def test_hwcn_images_have_the_batch_last():
    transposed = spec(((8, 8, 3, 4), tf.bfloat16), ((4,), tf.int32))
    tpu_ready.check(transposed, 4, "HWCN")
    # Checked as NHWC, the error says where the batch is and what to pass (it named only the
    # drop_remainder advice, which is not the fix).
    with pytest.raises(
        tpu_ready.NotTpuReadyError, match=r"element\[0\]: first \(batch\) dimension is 8, "
        r"expected 4 \(its last is: HWCN batches.*image_layout='HWCN'\)"
    ):
        tpu_ready.check(transposed, 4, "NHWC")
