"""LoadImages: the Beam job's step that checks the inputs (`load.Checker`), with Beam's
counters and a progress report."""

from __future__ import annotations

import logging
import os
import time
import uuid

import apache_beam as beam
from apache_beam.metrics import Metrics

import beam_jobs
from beam_jobs import load, malloc, worker_progress
from beam_jobs.source_file import SourceFile
from tfrecord_pipe._core import images

LOG = logging.getLogger(__name__)
NAMESPACE = beam_jobs.METRICS_NAMESPACE
PROGRESS_EVERY_S = 30.0  # remote runs: a log line per worker this often (counters hold totals)


class LoadImages(beam.DoFn):
    """Reads, checks and normalises a batch of inputs (`load.Checker`); emits (split, Checked) per
    input.

    Inputs that cannot be used go to the REJECTED output with their reason; nothing is dropped.
    With `threads` > 1 the inputs of a batch are checked on that many threads (local runs).
    Beam's counters only count on the bundle's own thread, so the checks return what to count.
    """

    REJECTED = "rejected"

    def __init__(
        self,
        policy: images.ImagePolicy,
        label_offset: int,
        progress_dir: str | None = None,
        threads: int = 1,
    ):
        self._policy = policy
        self._label_offset = label_offset
        self._progress_dir = progress_dir  # local runs: where the launcher sums our counts
        self._threads = threads

    def setup(self):
        malloc.keep_large_buffers_in_mmap()
        self._checker = load.Checker(self._policy, self._threads)
        self._labels_seen: tuple[str, ...] | None = None
        self._stored = Metrics.counter(NAMESPACE, "images_stored_unchanged")
        self._reencoded = Metrics.counter(NAMESPACE, "images_reencoded")
        self._rejected = Metrics.counter(NAMESPACE, "images_rejected")
        self._bytes_read = Metrics.counter(NAMESPACE, "bytes_read")
        self._seen = self._seen_rejected = 0
        self._last_report = time.monotonic()
        self._worker = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"  # this instance's report file

    def teardown(self):
        if hasattr(self, "_checker"):  # setup may not have got this far
            self._checker.close()

    def process(self, batch: list[SourceFile], labels: tuple[str, ...]):
        if labels is not self._labels_seen:
            self._labels_seen = labels
            index = {label: i for i, label in enumerate(labels)}
            self._checker.set_labels(index, index)
        for source, checked, bytes_read, rejected in self._checker.check(batch):
            self._seen += 1
            self._bytes_read.inc(bytes_read)
            if checked is not None:
                (self._reencoded if checked.reencoded else self._stored).inc()
                yield source.split, checked
            else:
                self._seen_rejected += 1
                self._rejected.inc()
                yield beam.pvalue.TaggedOutput(self.REJECTED, rejected)
            self._report_progress()

    def _report_progress(self, force: bool = False):
        now = time.monotonic()
        every = PROGRESS_EVERY_S if self._progress_dir is None else worker_progress.POLL_S
        if not force and now - self._last_report < every:
            return
        self._last_report = now
        if self._progress_dir is not None:
            worker_progress.report(self._progress_dir, self._worker, self._seen, self._seen_rejected)
        elif not force:
            LOG.info("worker %d: %d inputs loaded, %d rejected", os.getpid(), self._seen,
                     self._seen_rejected)  # fmt: skip

    def finish_bundle(self):
        self._report_progress(force=True)  # the launcher's final line counts every input
