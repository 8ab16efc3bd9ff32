"""Plain JAX on the Grain path: ArrayRecord shards through Grain, a jitted step, a checkpoint
that holds the model and the input's position, so a preempted run goes on where it stopped.

    python -m examples.grain_loop DATASET_DIR WORK_DIR [--steps 200] [--batch_size 32]

The dataset must have ArrayRecord shards (`tfrecord-pipe convert ... --formats
tfrecord,array_record`). Every `--save_every` steps the parameters and the iterator's
`get_state()` go to WORK_DIR together, in one file put in place at once; a run started again
(after a kill, a preemption) loads them and takes the next batch, so its final parameters are
those of a run that was never stopped. The model is examples/mlp.py's small MLP.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os

import jax
import numpy as np

from examples import mlp
from tfrecord_pipe import grain

CHECKPOINT = "checkpoint.npz"


def save(work_dir: str, step: int, params: dict, state: dict) -> None:
    """The step, parameters and input position in one file, replaced whole."""
    part = os.path.join(work_dir, CHECKPOINT + ".part")
    with open(part, "wb") as file:
        np.savez(file, step=step, input=json.dumps(state),
                 **{name: np.asarray(value) for name, value in params.items()})  # fmt: skip
        file.flush()
        os.fsync(file.fileno())
    os.replace(part, os.path.join(work_dir, CHECKPOINT))


def restore(work_dir: str):
    """(step, params, input state) of the last checkpoint, or None."""
    path = os.path.join(work_dir, CHECKPOINT)
    if not os.path.exists(path):
        return None
    with np.load(path) as saved:
        params = {name: jax.numpy.asarray(saved[name]) for name in saved.files
                  if name not in ("step", "input")}  # fmt: skip
        return int(saved["step"]), params, json.loads(str(saved["input"]))


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("dataset_dir")
    parser.add_argument("work_dir")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch_size", type=int, default=32, help="this host's batch")
    parser.add_argument("--save_every", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=0, help="Grain worker processes")
    args = parser.parse_args(argv)
    os.makedirs(args.work_dir, exist_ok=True)
    options = dict(image_size=mlp.IMAGE_SIZE, dtype="uint8", batch_size=args.batch_size)
    train = grain.make_dataset(args.dataset_dir, is_training=True, seed=args.seed,
                               worker_count=args.workers, **options)  # fmt: skip
    classes = grain.find_split(args.dataset_dir, "train").num_classes
    batches = iter(train)
    step, params = 0, mlp.init(jax.random.PRNGKey(args.seed), classes)
    saved = restore(args.work_dir)
    if saved is not None:
        step, params, state = saved
        batches.set_state(state)
        print(f"resumed at step {step}", flush=True)
    while step < args.steps:
        images, labels = next(batches)
        params, value = mlp.train_step(params, images, labels)
        step += 1
        if step % args.save_every == 0 or step == args.steps:
            save(args.work_dir, step, params, batches.get_state())
            print(f"step {step:4d}: loss {float(value):.3f} (saved)", flush=True)

    right = seen = 0
    for images, labels, weights in grain.make_dataset(args.dataset_dir, is_training=False,
                                                      **options):  # fmt: skip
        batch_right, batch_seen = mlp.correct(params, images, labels, weights)
        right, seen = right + int(batch_right), seen + int(batch_seen)
    print(f"validation accuracy {right / seen:.3f} on {seen} images", flush=True)
    weights = b"".join(np.asarray(params[name]).tobytes() for name in sorted(params))
    digest = hashlib.sha256(weights).hexdigest()[:16]
    print(f"parameters {digest}", flush=True)
    return {"accuracy": right / seen, "images": seen, "parameters": digest}


if __name__ == "__main__":
    main()
