"""Beam pipelines of tfrecord-pipe; `beam_jobs.convert` is the conversion job."""

# Namespace of the job's Beam counters (images read, re-encoded, rejected; shards written).
METRICS_NAMESPACE = "tfrecord_pipe"
