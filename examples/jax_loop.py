"""Plain JAX on the reader: numpy batches in, a jitted training step, a padded evaluation.

    python -m examples.jax_loop DATASET_DIR [--steps 300] [--batch_size 32] [--distributed]

What a JAX program needs from the reader, and nothing else:
- `make_input_fn(...)()` reads this host's share of the files: once JAX has started (with
  several hosts, after `jax.distributed.initialize`: `--distributed`), JAX's process index
  and count choose it, and each host gets its part of the global batch; TensorFlow, which
  only feeds data, stays off the accelerators.
- `.as_numpy_iterator()` gives numpy batches; each host's goes in as its part of one global
  batch over every device (`examples/jax_parallel.py`), so the step averages the gradients
  over all of them and every host keeps the same parameters. "uint8" images are normalised
  on the device (`examples.mlp.normalize`), so the host moves one byte per pixel.
- Evaluation batches are padded, the same number on every host: count an image where its
  weight is above 0.

The model is examples/mlp.py's small MLP, trained with plain SGD: enough to show the loop, not
a recipe for accuracy.
"""

from __future__ import annotations

import argparse

import jax
import numpy as np

from examples import command, jax_parallel
from examples.mlp import IMAGE_SIZE, correct, init, train_step


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dataset_dir")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch_size", type=int, default=32, help="global, over all hosts")
    parser.add_argument("--eval_split", default="validation", help="the split to evaluate on")
    jax_parallel.add_flags(parser)
    args = parser.parse_args(argv)
    # JAX first: once its backend has started, the reader reads this host's share and keeps
    # TensorFlow off the accelerators.
    jax_parallel.start(args)
    from tfrecord_pipe import tensorflow_start

    tensorflow_start.start()  # before TensorFlow loads: its start-up lines held back (README)
    from tfrecord_pipe import dataset, reader
    classes = len(dataset.read_manifest(args.dataset_dir).labels)
    options = {"image_size": IMAGE_SIZE, "dtype": "uint8", "batch_size": args.batch_size}
    parallel = jax_parallel.DataParallel()
    parallel.check_host_batch(args.batch_size // jax.process_count(), "--batch_size")

    train = reader.make_input_fn(args.dataset_dir, is_training=True, **options)()
    # Both built before training: a dataset without a validation split says so now.
    with command.argument_as_flag("split=", "--eval_split"):
        evaluation = reader.make_input_fn(args.dataset_dir, split=args.eval_split,
                                          is_training=False, **options)()  # fmt: skip
    params = parallel.replicate(init(jax.random.PRNGKey(0), classes))
    losses = []
    for step, batch in zip(range(args.steps), train.as_numpy_iterator()):
        params, value = train_step(params, *parallel.global_batch(*batch))
        losses.append(float(value))
        if step % 50 == 0 or step == args.steps - 1:
            jax_parallel.say(f"step {step:4d}: loss {np.mean(losses[-50:]):.3f}")

    right = seen = 0
    for batch in evaluation.as_numpy_iterator():  # the same number of batches on every host
        batch_right, batch_seen = correct(params, *parallel.global_batch(*batch))
        right, seen = right + int(batch_right), seen + int(batch_seen)
    parameters = jax_parallel.digest(params)
    jax_parallel.say(f"validation accuracy {right / seen:.3f} on all {seen} images; parameters "
                     f"{parameters}")  # fmt: skip
    return {"losses": losses, "accuracy": right / seen, "images": seen, "parameters": parameters}


if __name__ == "__main__":
    command.run(main)
