"""tfrecord-pipe: image folders to TFRecord shards (`beam_jobs`), and TPU-ready input pipelines.

Layers in folders; a layer imports only the ones below it (tests/test_layers.py), and the
conversion job (`beam_jobs`) sits beside `reading/`, on the core alone:

  core/     no TensorFlow, no Beam: the record format, the dataset's files and manifest,
            image normalisation, paths, progress lines. The conversion job's workers use it.
  reading/  TensorFlow: datasets on disk, the input pipeline, preprocessing, strategies,
            serving, TPU-readiness checks. What training code imports.
  tools/    the `tfrecord-pipe` command: inspect, verify, bench, and convert (`beam_jobs`).

The public modules are importable from here, loaded when first used (so that importing the
core never loads TensorFlow):

    from tfrecord_pipe import reader, serving
"""

from __future__ import annotations

import importlib

__version__ = "0.3.0"

_PUBLIC = {
    "schema": "tfrecord_pipe.core.schema",
    "manifest": "tfrecord_pipe.core.manifest",
    "images": "tfrecord_pipe.core.images",
    "dataset": "tfrecord_pipe.reading.dataset",
    "reader": "tfrecord_pipe.reading.reader",
    "preprocess": "tfrecord_pipe.reading.preprocess",
    "serving": "tfrecord_pipe.reading.serving",
    "distribute": "tfrecord_pipe.reading.distribute",
    "hosts": "tfrecord_pipe.reading.hosts",
    "tpu_ready": "tfrecord_pipe.reading.tpu_ready",
}


def __getattr__(name: str):
    if name in _PUBLIC:
        return importlib.import_module(_PUBLIC[name])
    raise AttributeError(f"module 'tfrecord_pipe' has no attribute {name!r}")


def __dir__():
    return sorted([*globals(), *_PUBLIC])
