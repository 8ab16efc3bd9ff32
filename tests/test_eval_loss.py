"""Padded evaluation reports the loss over the records, not over the padded batch slots:
Keras `evaluate`, `fit`'s validation, and a custom loop with `tf.nn.compute_average_loss`
give the same loss at every batch size, equal to the loss computed on the records alone.

It used to be divided by the padded size: one model on one split gave 1.83 at batch 32,
1.37 at 128 and 0.17 at 1024, and `val_loss`-driven callbacks acted on that.
"""

import numpy as np
import pytest
import tensorflow as tf

from tfrecord_pipe import reader

from dataset_factory import write_dataset

SIZE = 16
RECORDS = 16
# Batches that pad by nothing (8: 2 full), a few (6: 18 slots), most of a batch (15: 30
# slots; 32: one batch, half of it padding).
BATCHES = [8, 6, 15, 32]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("eval_loss") / "ds")
    validation = [[0, 1, 2, 0, 1, 2, 0, 1], [2, 0, 1, 2, 0, 1, 1, 1]]
    write_dataset(folder, {"train": [[0, 1, 2]], "validation": validation})
    return folder


@pytest.fixture(scope="module")
def model():
    tf.keras.utils.set_random_seed(7)
    inputs = tf.keras.Input((SIZE, SIZE, 3))
    hidden = tf.keras.layers.Conv2D(4, 3, activation="relu")(inputs)
    logits = tf.keras.layers.Dense(3)(tf.keras.layers.GlobalAveragePooling2D()(hidden))
    model = tf.keras.Model(inputs, logits)
    model.compile(  # as docs/reading.md shows it; SGD at rate 0 so fit leaves the model as it is
        optimizer=tf.keras.optimizers.SGD(0.0),
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        weighted_metrics=["accuracy"],
    )
    return model


def eval_input(folder, batch_size, **options):
    return reader.make_input_fn(
        folder, is_training=False, image_size=SIZE, batch_size=batch_size, **options
    )()


@pytest.fixture(scope="module")
def truth(folder, model):
    """Loss and accuracy over the records alone: one batch of exactly all of them, no padding."""
    (images, labels), = list(eval_input(folder, RECORDS, eval_remainder="drop"))
    logits = model(images, training=False)
    loss = tf.keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)
    accuracy = np.mean(np.argmax(logits, axis=-1) == labels.numpy())
    return float(np.mean(loss)), float(accuracy)


@pytest.mark.parametrize(  # the fast subset keeps no padding and some; all run in make test
    "batch_size", [b if b in (8, 6) else pytest.param(b, marks=pytest.mark.slow) for b in BATCHES]
)
def test_evaluate_gives_the_loss_over_the_records_at_any_batch_size(folder, model, truth,
                                                                     batch_size):  # fmt: skip
    result = model.evaluate(eval_input(folder, batch_size), return_dict=True, verbose=0)
    assert result["loss"] == pytest.approx(truth[0], rel=1e-5)
    assert result["accuracy"] == pytest.approx(truth[1])


@pytest.mark.slow
@pytest.mark.parametrize("batch_size", [6, 32])
def test_fit_validation_loss_is_the_loss_over_the_records(folder, model, truth, batch_size):
    train = reader.make_input_fn(folder, is_training=True, image_size=SIZE, batch_size=3)()
    history = model.fit(train, steps_per_epoch=1, epochs=1, verbose=0,
                        validation_data=eval_input(folder, batch_size))  # fmt: skip
    assert history.history["val_loss"][0] == pytest.approx(truth[0], rel=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("batch_size", BATCHES)
def test_a_custom_loop_with_compute_average_loss_gets_it_too(folder, model, truth, batch_size):
    per_example = tf.keras.losses.SparseCategoricalCrossentropy(
        from_logits=True, reduction="none"
    )
    losses, counted = [], 0
    for images, labels, weights in eval_input(folder, batch_size):
        values = per_example(labels, model(images, training=False))
        losses.append(float(tf.nn.compute_average_loss(
            values, sample_weight=weights, global_batch_size=batch_size
        )))  # fmt: skip
        counted += int(tf.reduce_sum(tf.cast(weights > 0, tf.int32)))
    assert np.mean(losses) == pytest.approx(truth[0], rel=1e-5)
    assert counted == RECORDS
