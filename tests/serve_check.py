"""Loads an exported SavedModel in a fresh process, as a server would, and calls its serving
signature with the image files given, then with an empty request; prints the outputs as one
JSON line.

    python tests/serve_check.py EXPORT_DIR FILE...
"""

import json
import os
import pathlib
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402


def main(export_dir, *files):
    serve = tf.saved_model.load(export_dir).signatures["serving_default"]
    out = serve(image_bytes=tf.constant([pathlib.Path(f).read_bytes() for f in files], tf.string))
    empty = serve(image_bytes=tf.constant([], tf.string))
    print("RESULT " + json.dumps({
        "inputs": {name: spec.dtype.name for name, spec in serve.structured_input_signature[1].items()},
        "probabilities": out["probabilities"].numpy().tolist(),
        "classid": out["classid"].numpy().tolist(),
        "class": [name.decode() for name in out["class"].numpy()],
        "empty": {"probabilities": empty["probabilities"].numpy().tolist(),
                  "class": empty["class"].numpy().tolist()},
    }))  # fmt: skip


if __name__ == "__main__":
    main(*sys.argv[1:])
    # Without Python's teardown of what TensorFlow made (a CPU-second in each run of the
    # suite's): everything is written and closed by now.
    sys.stdout.flush(), sys.stderr.flush()
    os._exit(0)
