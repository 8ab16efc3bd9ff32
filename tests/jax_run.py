"""Trains on the reader's batches under JAX, in a fresh process (the Keras backend is chosen
before Keras loads), and prints what the test asserts on as one JSON line:

- examples/train.py's steps under Keras 3 on JAX: `fit`, padded `evaluate`, export, predict;
- a uint8-fed model with `preprocess.Normalize`, exported: Normalize next to the TensorFlow
  op, the SavedModel's answers next to the JAX model's;
- examples/jax_loop.py: plain JAX steps on `as_numpy_iterator()` batches.

    python tests/jax_run.py DATASET_DIR WORK_DIR
"""

import json
import os
import sys

os.environ["KERAS_BACKEND"] = "jax"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import jax  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from examples import jax_loop, train  # noqa: E402
from tfrecord_pipe import dataset, preprocess, serving  # noqa: E402

SIZE, BATCH = 16, 8


def keras_on_jax(dataset_dir, export_dir):
    """A uint8-fed model with Normalize, exported: (fit and evaluate: `example_steps`)."""
    labels = dataset.read_manifest(dataset_dir).labels
    keras.utils.set_random_seed(1)
    inputs = keras.Input((SIZE, SIZE, 3), dtype="uint8")
    x = preprocess.Normalize()(inputs)
    x = keras.layers.GlobalAveragePooling2D()(x)
    model = keras.Model(inputs, keras.layers.Dense(len(labels))(x))

    batch = np.arange(2 * SIZE * SIZE * 3, dtype=np.uint8).reshape(2, SIZE, SIZE, 3)
    normalised = np.asarray(preprocess.Normalize()(batch))
    expected = preprocess.normalize(tf.constant(batch)).numpy()

    config = serving.ServingConfig.for_dataset(dataset_dir, image_size=SIZE, dtype="uint8")
    serving.export(model, export_dir, config)
    files = [f.numpy() for f in _files(dataset_dir)]
    served = tf.saved_model.load(export_dir).signatures[serving.SIGNATURE]
    answers = served(image_bytes=tf.constant(files))["probabilities"].numpy()
    pixels = serving.model_inputs(tf.constant(files), config).numpy()
    in_jax = np.asarray(jax.nn.softmax(model(pixels), axis=-1))
    return {
        "backend": keras.backend.backend(),
        "normalize_difference": float(np.abs(normalised - expected).max()),
        "served_difference": float(np.abs(answers - in_jax).max()),
        "served": len(answers),
    }


def _files(dataset_dir):
    """The encoded images of a few validation records: files as a client would send them."""
    found = dataset.read_manifest(dataset_dir)
    path = os.path.join(dataset_dir, found.splits["validation"].files[0])
    spec = {"image/encoded": tf.io.FixedLenFeature([], tf.string)}
    return [tf.io.parse_single_example(raw, spec)["image/encoded"]
            for raw in tf.data.TFRecordDataset(path).take(3)]  # fmt: skip


def example_steps(dataset_dir, work_dir):
    """examples/train.py after its conversion, as `main` runs it, with Keras on JAX."""
    config = train.TrainConfig(image_size=SIZE, global_batch_size=BATCH, epochs=3)
    strategy = train.resolve_strategy(None)
    model = train.train(strategy, dataset_dir, os.path.join(work_dir, "backup"), config)
    result = train.evaluate(strategy, model, dataset_dir, config)
    export_dir = train.export(model, dataset_dir, os.path.join(work_dir, "example"), config)
    files = []
    for number, encoded in enumerate(_files(dataset_dir)):
        files.append(os.path.join(work_dir, f"{number}.jpg"))
        tf.io.write_file(files[-1], encoded)
    return {
        "strategy": repr(strategy),
        "accuracy": result["accuracy"],
        "images": result["images"],
        "predicted": [name for _, name, _ in train.predict_files(export_dir, files)],
    }


def main(dataset_dir, work_dir):
    result = {
        "example": example_steps(dataset_dir, work_dir),
        "keras": keras_on_jax(dataset_dir, os.path.join(work_dir, "uint8")),
        "jax": jax_loop.main([dataset_dir, "--steps", "80", "--batch_size", str(BATCH)]),
    }
    result["tensorflow_devices"] = [d.device_type for d in tf.config.get_visible_devices()]
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
    # Without Python's teardown of what TensorFlow made (a CPU-second in each run of the
    # suite's): everything is written and closed by now.
    sys.stdout.flush(), sys.stderr.flush()
    os._exit(0)
