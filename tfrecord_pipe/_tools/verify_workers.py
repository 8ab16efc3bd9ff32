"""What each worker process of `verify` runs: a shard read into its rows (with the rows of
the sources its records name, where it can find them: `verify_beside`), a batch of
sources' expected rows (`verify_rules.Expect`), or a part of the paths judged once every
row is in (`verify_join.judge_part`). The rows of paths a worker makes go into its own
sorts of the parts (`verify_join.Parts`), handed to the launcher as files of sorted runs.

Nothing here imports Beam for a local dataset: the workers' fork server preloads this
module, as it does the conversion's `beam_jobs.local_workers`.
"""

from __future__ import annotations

import collections

from beam_jobs import load, worker_pool
from beam_jobs.source_file import SourceFile
from tfrecord_pipe._core import manifest
from tfrecord_pipe._reading import tensorflow_start
from tfrecord_pipe._tools import verify_beside, verify_join
from tfrecord_pipe._tools import verify_reading as reading
from tfrecord_pipe._tools import verify_rules as rules

# The kinds of task: a shard read; a batch of sources checked into the parts, or checked
# after the join on paths (`verify_join.PathJudge.match`'s), their rows given back; a part
# of the paths judged.
SHARD, SOURCES, LATER, JUDGE = "shard", "sources", "later", "judge"

# In each worker process: what `start` set up.
_WORKER: dict = {}


def start(dataset: str, found: manifest.Manifest, config, work: str, decode: bool,
          beside: bool, parts: int, run_items: int) -> None:  # fmt: skip
    """Sets up a worker: the rules' expectations, a checker, TensorFlow with `decode`, with
    `beside` the checks of sources beside their records, and the join's number of `parts`
    and rows a sort holds."""
    expect = rules.Expect(found, config.policy)
    checker = load.Checker(config.policy)
    checker.set_labels(expect.labels, {})
    if decode:
        tensorflow_start.start(verbose=False)
    _WORKER.update(dataset=dataset, found=found, work=work, expect=expect, checker=checker,
                   decode=decode, beside=verify_beside.Beside(config, expect) if beside else None,
                   parts=parts, run_items=run_items)  # fmt: skip


@worker_pool.in_worker
def task(item: tuple[str, object]) -> tuple[str, object]:
    """Per kind of task, given back with its kind:
    SHARD (split, name, records, twin): the runs of its path rows a part (a list for
      `verify_join.Parts.adopt`), its other (kind, value) pairs (`verify_reading.read_shard`:
      problems, counts, its span), and its sources checked beside their records;
    SOURCES (`SourceFile.as_tuple` of each): the runs of their rows a part, and their count
      per split;
    LATER (the same): their rows (relpath, split, row);
    JUDGE: `verify_join.judge_part`'s answer."""
    kind, value = item
    if kind == JUDGE:
        return kind, verify_join.judge_part(_WORKER["work"], *value)
    parts = verify_join.Parts(_WORKER["work"], _WORKER["parts"], _WORKER["run_items"])
    if kind == SHARD:
        beside = _WORKER["beside"]
        rows = reading.read_shard(_WORKER["dataset"], _WORKER["found"], value, _WORKER["decode"],
                                  _WORKER["work"], beside)  # fmt: skip
        others, pairs = [], 0
        for row_kind, row in rows if beside is None else beside.with_found(rows):
            if row_kind in verify_join.PATH_KINDS:
                relpath, path_row = row
                parts.add(relpath, row_kind, path_row)
                pairs += row_kind == verify_beside.PAIR
            else:
                others.append((row_kind, row))
        return kind, (parts.handed_over(), others, pairs)
    rows = _rows([SourceFile(*source) for source in value])
    if kind == LATER:
        return kind, list(rows)
    per_split = collections.Counter()
    for relpath, split, row in rows:
        per_split[split] += 1
        parts.add(relpath, rules.SOURCE, row)
    return kind, (parts.handed_over(), per_split)


def _rows(sources: list[SourceFile]):
    """(relpath, split, expected row) of each source, in order (`verify_rules.Expect.row`)."""
    expect, checker = _WORKER["expect"], _WORKER["checker"]

    def row(listed: SourceFile, result) -> tuple:
        return listed.relpath, listed.split, expect.row(listed, result)

    for start in range(0, len(sources), load.BATCH):
        yield from checker.decide(sources[start : start + load.BATCH], row)
