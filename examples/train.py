"""End to end: image folder → TFRecords (Beam) → Keras `fit` under a strategy → padded
evaluation (every image counted once) → SavedModel with a bytes-in signature → predictions.

Copy from it. Each stage is one function; `main` runs them in order:

    python -m examples.train IMAGES_DIR WORK_DIR [--tpu NAME] [--epochs 5] [--batch_size 64]

IMAGES_DIR holds one sub-folder per label. WORK_DIR receives dataset/, backup/ and export/.
With no TPU named or detected, all local GPUs are used, else the CPU (tfrecord_pipe.distribute).

Preemptible: training backs itself up every few steps, and a run started again after a kill
goes on from the last backup at the exact next batch (seeded input, `distribute.FitResume`).

Keras 3 on JAX runs it too (`KERAS_BACKEND=jax python -m examples.train ...`): there is no
tf.distribute strategy then; JAX places the work, and the reader reads this host's share
(`tfrecord_pipe.hosts`) while TensorFlow stays off the accelerators.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math
import pathlib

from tfrecord_pipe import tensorflow_start

tensorflow_start.start()  # before TensorFlow loads: its start-up lines held back (README)

import tensorflow as tf  # noqa: E402

from beam_jobs import convert  # noqa: E402
from tfrecord_pipe import dataset, distribute, manifest, reader, serving  # noqa: E402


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Attributes:
    image_size: side of the model's square input.
    global_batch_size: batch over all replicas (a multiple of the replica count).
    epochs: passes over the training split.
    steps_per_execution: training steps per call into the accelerator; TPUs need many (the
      host's Python loop is far slower than a TPU step), 1 is fine on CPU.
    learning_rate: Adam's.
    seed: the input's seed: the same batches every run, and a resumed run's are the ones an
      uninterrupted run would have had.
    backup_every: steps between backups of the weights (and with them the input's position).
    """

    image_size: int = 64
    global_batch_size: int = 32
    epochs: int = 12
    steps_per_execution: int = 4
    learning_rate: float = 3e-3
    seed: int = 2026
    backup_every: int = 20


def convert_images(images_dir: str, dataset_dir: str) -> manifest.Manifest:
    """The conversion, as `python -m beam_jobs.convert` runs it on local defaults (its local
    engine: Beam's pipeline with `--runner`)."""
    return convert.run(
        [images_dir, dataset_dir, "--validation_fraction", "0.2", "--num_shards", "4",
         "--overwrite"],
        save_main_session=False,
    )  # fmt: skip


def build_model(num_classes: int, image_size: int) -> tf.keras.Model:
    """A small CNN; it outputs logits. Inputs are the reader's normalised float32 images."""
    layers = tf.keras.layers
    inputs = tf.keras.Input((image_size, image_size, 3))
    x = inputs
    for filters in (16, 32, 64):
        x = layers.Conv2D(filters, 3, padding="same", activation="relu")(x)
        x = layers.MaxPooling2D()(x)
    x = layers.GlobalAveragePooling2D()(x)
    return tf.keras.Model(inputs, layers.Dense(num_classes)(x))


def resolve_strategy(tpu: str | None):
    """The tf.distribute strategy for this machine; None under Keras on JAX."""
    if tf.keras.backend.backend() != "tensorflow":
        return None
    return distribute.resolve_strategy(tpu)


def feed(strategy, input_fn):
    """The input for `fit` / `evaluate`: distributed under a strategy, else this host's share."""
    return distribute.distribute(strategy, input_fn) if strategy else input_fn()


def train(strategy, dataset_dir: str, backup_dir: str, config: TrainConfig) -> tf.keras.Model:
    """Keras fit on the distributed training dataset, backed up to `backup_dir` and resumed
    from it after a kill."""
    found = dataset.read_manifest(dataset_dir)
    input_fn = reader.make_input_fn(
        dataset_dir, is_training=True, image_size=config.image_size,
        batch_size=config.global_batch_size, seed=config.seed,
    )  # fmt: skip
    steps_per_execution = config.steps_per_execution
    if isinstance(strategy, tf.distribute.MirroredStrategy) and strategy.num_replicas_in_sync > 1:
        # Keras 3 fails with steps_per_execution > 1 under a multi-replica MirroredStrategy
        # ("You must feed a value for placeholder tensor", keras-team/keras#19246). GPUs do
        # not need it much; TPUs do, and TPUStrategy is not affected by this.
        steps_per_execution = 1
    with strategy.scope() if strategy else contextlib.nullcontext():  # variables on the replicas
        model = build_model(len(found.labels), config.image_size)
        model.compile(
            optimizer=tf.keras.optimizers.Adam(config.learning_rate),
            loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            # Weighted: in padded evaluation batches the weight-0 filler must not count. Training
            # batches carry no weights, where it is plain accuracy.
            weighted_metrics=["accuracy"],
            steps_per_execution=steps_per_execution,
        )
    # The training dataset repeats: an epoch is counted in steps, whole executions of them.
    steps = found.splits["train"].num_examples // config.global_batch_size
    steps = max(1, steps // steps_per_execution) * steps_per_execution
    # Two backups: a kill while the weights are written leaves the one before.
    backup = tf.keras.callbacks.BackupAndRestore(
        backup_dir, save_freq=config.backup_every, double_checkpoint=True
    )
    resume = distribute.FitResume(backup, steps_per_epoch=steps)
    data = resume.restore(model, input_fn, strategy)  # after a kill: weights and position
    model.fit(
        data,
        epochs=config.epochs,
        steps_per_epoch=steps,
        verbose=2,
        shuffle=False,  # the reader shuffles
        callbacks=[backup, resume],
    )
    return model


def evaluate(strategy, model: tf.keras.Model, dataset_dir: str, config: TrainConfig) -> dict:
    """Padded evaluation: every validation image counted exactly once, shapes static."""
    found = dataset.read_manifest(dataset_dir)
    input_fn = reader.make_input_fn(
        dataset_dir, is_training=False, image_size=config.image_size,
        batch_size=config.global_batch_size,
    )  # fmt: skip
    result = model.evaluate(feed(strategy, input_fn), return_dict=True, verbose=0)
    result["images"] = found.splits["validation"].num_examples
    result["batches"] = math.ceil(result["images"] / config.global_batch_size)
    return result


def export(model: tf.keras.Model, dataset_dir: str, export_dir: str, config: TrainConfig) -> str:
    # The dataset's labels, max_side and jpeg_quality: files are served as they were converted.
    serving_config = serving.ServingConfig.for_dataset(dataset_dir, image_size=config.image_size)
    return serving.export(model, export_dir, serving_config)


def predict_files(export_dir: str, files: list[str]) -> list[tuple[str, str, float]]:
    """Loads the SavedModel as TF Serving would and classifies image files: (file, class, p)."""
    loaded = tf.saved_model.load(export_dir)
    serve = loaded.signatures[serving.SIGNATURE]
    image_bytes = tf.constant([pathlib.Path(path).read_bytes() for path in files])
    out = serve(**{serving.INPUT_NAME: image_bytes})
    return [
        (path, name.decode(), float(probabilities.max()))
        for path, name, probabilities in zip(
            files, out["class"].numpy(), out["probabilities"].numpy()
        )
    ]


def main(argv=None):
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("images_dir")
    parser.add_argument("work_dir")
    parser.add_argument("--tpu", default=None, help="TPU name or grpc://host:port")
    parser.add_argument("--epochs", type=int, default=TrainConfig.epochs)
    parser.add_argument("--batch_size", type=int, default=TrainConfig.global_batch_size)
    parser.add_argument("--image_size", type=int, default=TrainConfig.image_size)
    parser.add_argument("--seed", type=int, default=TrainConfig.seed)
    args = parser.parse_args(argv)
    config = TrainConfig(
        image_size=args.image_size, global_batch_size=args.batch_size, epochs=args.epochs,
        seed=args.seed,
    )  # fmt: skip
    work = pathlib.Path(args.work_dir)
    dataset_dir, export_dir = str(work / "dataset"), str(work / "export")
    backup_dir = str(work / "backup")

    print(f"[1/5] converting {args.images_dir} on this machine's cores")
    convert_images(args.images_dir, dataset_dir)
    strategy = resolve_strategy(args.tpu)
    where = distribute.describe(strategy) if strategy else f"Keras on {tf.keras.backend.backend()}"
    print(f"[2/5] training under {where}")
    model = train(strategy, dataset_dir, backup_dir, config)
    result = evaluate(strategy, model, dataset_dir, config)
    print(f"[3/5] validation: accuracy {result['accuracy']:.3f} on all {result['images']} "
          f"images ({result['batches']} padded batches)")  # fmt: skip
    export(model, dataset_dir, export_dir, config)
    print(f"[4/5] exported a SavedModel to {export_dir} (signature {serving.SIGNATURE!r}, "
          f"input {serving.INPUT_NAME!r})")  # fmt: skip
    files = sorted(str(p) for p in pathlib.Path(args.images_dir).glob("*/*.jpg"))[::97][:6]
    print("[5/5] predictions of the loaded SavedModel:")
    for path, name, probability in predict_files(export_dir, files):
        print(f"      {path}: {name} ({probability:.2f})")
    return result


if __name__ == "__main__":
    from examples import command

    command.run(main)
