"""Runs the examples' fit, evaluation and custom loop under a MirroredStrategy of two logical
CPU devices, in a fresh process (logical devices must be set before TensorFlow starts), and
prints what the test asserts on as one JSON line.

    python tests/strategy_run.py DATASET_DIR
"""

import json
import os
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(
    cpu, [tf.config.LogicalDeviceConfiguration(), tf.config.LogicalDeviceConfiguration()]
)

from examples import custom_loop, train  # noqa: E402
from tfrecord_pipe import distribute, reader  # noqa: E402

from dataset_factory import accuracy_on, loss_on  # noqa: E402


def main(dataset_dir):
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    config = train.TrainConfig(image_size=16, global_batch_size=8, epochs=1, steps_per_execution=2)
    contexts = []
    input_fn = reader.make_input_fn(dataset_dir, is_training=True, image_size=16, batch_size=8)

    def recording(context):
        contexts.append(context)
        return input_fn(context)

    distributed = strategy.distribute_datasets_from_function(recording)
    images, _ = next(iter(distributed))
    per_replica = [t.shape.as_list() for t in strategy.experimental_local_results(images)]
    model = train.train(strategy, dataset_dir, tempfile.mkdtemp(), config)
    evaluated = train.evaluate(strategy, model, dataset_dir, config)
    # Measured before the fit below trains the model further.
    loss_before_fit = loss_on(model, dataset_dir, config.image_size)
    accuracy_before_fit = accuracy_on(model, dataset_dir, config.image_size)
    looped = custom_loop.run(strategy, dataset_dir, config)
    # The padded evaluation's loss at batch sizes that pad by a few and by most of a batch,
    # through `evaluate` and through `fit`'s validation.
    losses = {}
    for batch in (2, 32):
        validation = reader.make_input_fn(
            dataset_dir, is_training=False, image_size=16, batch_size=batch
        )
        losses[batch] = model.evaluate(
            distribute.distribute(strategy, validation), return_dict=True, verbose=0
        )["loss"]
    # A dropped remainder: the loss of the whole global batches kept, as on one replica (each
    # replica dropped its own remainder, and Keras counted a step of empty batches).
    dropped = reader.make_input_fn(dataset_dir, is_training=False, image_size=16, batch_size=6,
                                   eval_remainder="drop")  # fmt: skip
    kept = [(images, labels) for images, labels in dropped()]  # one pipeline, one replica
    drop_loss_of_kept = float(tf.reduce_mean([tf.keras.losses.sparse_categorical_crossentropy(
        labels, model.predict(images, verbose=0), from_logits=True) for images, labels in kept]))
    drop_loss = model.evaluate(distribute.distribute(strategy, dropped), return_dict=True,
                               verbose=0)["loss"]  # fmt: skip
    history = model.fit(
        distribute.distribute(strategy, input_fn), steps_per_epoch=2, epochs=1, verbose=0,
        validation_data=distribute.distribute(strategy, validation),
    )  # fmt: skip
    print(
        "RESULT "
        + json.dumps(
            {
                "replicas": strategy.num_replicas_in_sync,
                "contexts": [
                    [c.num_input_pipelines, c.input_pipeline_id, c.get_per_replica_batch_size(8)]
                    for c in contexts
                ],
                "per_replica_images": per_replica,
                "fit_accuracy": evaluated["accuracy"],
                "accuracy_on_every_record": accuracy_before_fit,
                "custom_loop_images": looped["images"],
                "fit_loss": evaluated["loss"],
                "losses_by_batch": losses,
                "loss_on_every_record_before_fit": loss_before_fit,
                "val_loss": history.history["val_loss"][-1],
                "loss_on_every_record": loss_on(model, dataset_dir, config.image_size),
                "custom_loop_loss": looped["loss"],
                "drop_records_kept": sum(int(labels.shape[0]) for _, labels in kept),
                "drop_loss": drop_loss,
                "drop_loss_of_kept": drop_loss_of_kept,
            }
        )
    )


if __name__ == "__main__":
    main(sys.argv[1])
