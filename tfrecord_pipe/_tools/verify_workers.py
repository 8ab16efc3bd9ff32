"""What each worker process of `verify` runs: a shard read into its rows (with the rows of
the sources its records name, where it can find them: `verify_beside`), a batch of
sources' expected rows (`verify_rules.Expect`), or a part of the paths judged once every
row is in (`verify_join.judge_part`).

Nothing here imports Beam for a local dataset: the workers' fork server preloads this
module, as it does the conversion's `beam_jobs.local_workers`.
"""

from __future__ import annotations

import os
import tempfile

from beam_jobs import load, spill, worker_pool
from tfrecord_pipe._core import manifest
from tfrecord_pipe._reading import tensorflow_start
from tfrecord_pipe._tools import verify_beside, verify_join
from tfrecord_pipe._tools import verify_reading as reading
from tfrecord_pipe._tools import verify_rules as rules

SHARD, SOURCES, JUDGE = "shard", "sources", "judge"  # the kinds of task

# In each worker process: what `start` set up.
_WORKER: dict = {}


def start(dataset: str, found: manifest.Manifest, config, work: str, decode: bool,
          beside: bool) -> None:  # fmt: skip
    """Sets up a worker: the rules' expectations, a checker, TensorFlow with `decode`, and
    with `beside` the checks of sources beside their records."""
    expect = rules.Expect(found, config.policy)
    checker = load.Checker(config.policy)
    checker.set_labels(expect.labels, {})
    if decode:
        tensorflow_start.start(verbose=False)
    _WORKER.update(dataset=dataset, found=found, work=work, expect=expect, checker=checker,
                   decode=decode, beside=verify_beside.Beside(config, expect) if beside else None)


@worker_pool.in_worker
def task(item: tuple[str, object]) -> tuple[str, object]:
    """A shard read (its rows go to a file in the work folder: a shard can hold more than
    should travel back at once), a batch of sources' expected rows, or a part of the paths
    judged (its rows in files of sorted runs, and those of what it gives back)."""
    kind, value = item
    if kind == JUDGE:
        return kind, verify_join.judge_part(_WORKER["work"], *value)
    if kind == SHARD:
        beside = _WORKER["beside"]
        rows = reading.read_shard(_WORKER["dataset"], _WORKER["found"], value, _WORKER["decode"],
                                  _WORKER["work"], beside)  # fmt: skip
        fd, path = tempfile.mkstemp(dir=_WORKER["work"], suffix=".shard-rows")
        with os.fdopen(fd, "wb") as f:
            spill.write_items(f, rows if beside is None else beside.with_found(rows))
        return kind, path
    expect = _WORKER["expect"]
    rows = _WORKER["checker"].decide(value, lambda listed, result: (
        listed.relpath, listed.split, expect.row(listed, result)))  # fmt: skip
    return kind, list(rows)
