"""tfrecord-pipe: image folders to TFRecord shards (beam_jobs), and TPU-ready input pipelines."""

__version__ = "0.1.0"
