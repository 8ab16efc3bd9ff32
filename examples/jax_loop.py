"""Plain JAX on the reader: numpy batches in, a jitted training step, a padded evaluation.

    python -m examples.jax_loop DATASET_DIR [--steps 300] [--batch_size 32]

What a JAX program needs from the reader, and nothing else:
- `make_input_fn(...)()` reads this host's share of the files: once JAX has started (with
  several hosts, after `jax.distributed.initialize`), JAX's process index and count choose it, and each host gets
  its part of the global batch; TensorFlow, which only feeds data, stays off the accelerators.
- `.as_numpy_iterator()` gives numpy batches; "uint8" images are normalised on the device
  (`examples.mlp.normalize`), so the host moves one byte per pixel.
- Evaluation batches are padded: count an image where its weight is above 0.

The model is examples/mlp.py's small MLP, trained with plain SGD: enough to show the loop, not
a recipe for accuracy.
"""

from __future__ import annotations

import argparse

import jax
import numpy as np

from examples.mlp import IMAGE_SIZE, correct, init, train_step
from tfrecord_pipe import dataset, reader


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dataset_dir")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch_size", type=int, default=32, help="global, over all hosts")
    args = parser.parse_args(argv)
    classes = len(dataset.read_manifest(args.dataset_dir).labels)
    # JAX first (on several hosts, jax.distributed.initialize() before this): once its backend
    # has started, the reader reads this host's share and keeps TensorFlow off the accelerators.
    print(f"JAX on {jax.device_count()} device(s), host {jax.process_index()} of "
          f"{jax.process_count()}", flush=True)  # fmt: skip
    options = {"image_size": IMAGE_SIZE, "dtype": "uint8", "batch_size": args.batch_size}

    train = reader.make_input_fn(args.dataset_dir, is_training=True, **options)()
    params = init(jax.random.PRNGKey(0), classes)
    losses = []
    for step, (images, labels) in zip(range(args.steps), train.as_numpy_iterator()):
        params, value = train_step(params, images, labels)
        losses.append(float(value))
        if step % 50 == 0 or step == args.steps - 1:
            print(f"step {step:4d}: loss {np.mean(losses[-50:]):.3f}", flush=True)

    right = seen = 0
    evaluation = reader.make_input_fn(args.dataset_dir, is_training=False, **options)()
    for images, labels, weights in evaluation.as_numpy_iterator():
        batch_right, batch_seen = correct(params, images, labels, weights)
        right, seen = right + int(batch_right), seen + int(batch_seen)
    print(f"host {jax.process_index()} of {jax.process_count()}: validation accuracy "
          f"{right / seen:.3f} on its {seen} images")  # fmt: skip
    return {"losses": losses, "accuracy": right / seen, "images": seen}


if __name__ == "__main__":
    main()
