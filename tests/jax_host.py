"""One JAX host of a multi-host run on this machine's CPU: joins the others through
jax.distributed, reads its share with `make_input_fn` (no position given: JAX's), and prints
what it read as one JSON line.

    python tests/jax_host.py DATASET_DIR COORDINATOR_ADDRESS PROCESS_ID PROCESS_COUNT
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import jax  # noqa: E402

from examples.jax_parallel import say  # noqa: E402  (whole lines: Gloo writes here too)
from tfrecord_pipe import reader  # noqa: E402


def main(dataset_dir, address, process_id, process_count):
    jax.distributed.initialize(
        coordinator_address=address, num_processes=process_count, process_id=process_id,
        initialization_timeout=120,
    )  # fmt: skip
    say(f"host {jax.process_index()} of {jax.process_count()} on {jax.devices()}")
    options = {"image_size": 16, "dtype": "uint8", "batch_size": 4}
    evaluation = reader.make_input_fn(dataset_dir, is_training=False, **options)()
    labels, steps = [], 0
    for images, batch_labels, weights in evaluation.as_numpy_iterator():
        steps += 1
        labels += batch_labels[weights > 0].tolist()
    training = reader.make_input_fn(dataset_dir, is_training=True, seed=1, **options)()
    shapes = [list(images.shape) for images, _ in training.take(2).as_numpy_iterator()]
    result = {"host": jax.process_index(), "hosts": jax.process_count(), "labels": labels,
              "steps": steps, "train_shapes": shapes, "image_type": str(images.dtype)}  # fmt: skip
    say("RESULT " + json.dumps(result))
    jax.distributed.shutdown()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    # Without Python's teardown of what TensorFlow made (a CPU-second in each run of the
    # suite's): everything is written and closed by now.
    sys.stdout.flush(), sys.stderr.flush()
    os._exit(0)
