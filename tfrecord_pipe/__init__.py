"""tfrecord-pipe: image folders to TFRecord shards (`beam_jobs`), and TPU-ready input pipelines.

Layers in folders; a layer imports only the ones below it (tests/test_layers.py), and the
conversion job (`beam_jobs`) sits beside `_reading/`, on the core alone:

  _core/    no TensorFlow, no Beam: the record format, the dataset's files and manifest,
            image normalisation, paths, progress lines. The conversion job's workers use it.
  _reading/ TensorFlow: datasets on disk, the input pipeline, preprocessing, strategies,
            serving, TPU-readiness checks. What training code imports.
  _grain/   Grain, no TensorFlow: the input pipeline over ArrayRecord shards, for JAX.
  _tools/   the `tfrecord-pipe` command: inspect, verify, bench, and convert (`beam_jobs`).

The public modules sit at the top (`tfrecord_pipe.reader`, ...: docs/api.md lists them and
their names); each re-exports its part of the layers below. Any import form works, and the
core ones (`schema`, `manifest`, `images`) and `grain` never load TensorFlow:

    import tfrecord_pipe.reader
    from tfrecord_pipe.reader import make_input_fn
    from tfrecord_pipe import reader, serving
"""

from __future__ import annotations

import importlib

__version__ = "0.5.0"

# The public modules, loaded when first used as attributes (`tfrecord_pipe.reader` after
# `import tfrecord_pipe`), so that importing the package never loads TensorFlow.
PUBLIC_MODULES = (
    "schema", "manifest", "images",  # the core: no TensorFlow
    "dataset", "reader", "preprocess", "serving", "distribute", "hosts", "tpu_ready",
    "tensorflow_start",
    "grain",  # Grain over ArrayRecord shards: no TensorFlow
)  # fmt: skip


def __getattr__(name: str):
    if name in PUBLIC_MODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module 'tfrecord_pipe' has no attribute {name!r}")


def __dir__():
    return sorted([*globals(), *PUBLIC_MODULES])
