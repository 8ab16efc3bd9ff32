"""What each worker process of the local engine runs: the inputs' checks and the shards'
writing, the very functions Beam's steps run (`load.Checker`, `shard_writer.write_shard`).

Nothing here imports Beam, nor does anything it imports (Beam is imported only for a remote
path): the workers' fork server preloads this module, and Beam's import cost most of a
CPU-second per conversion there (benchmarks/RESULTS.md, "Conversion without Beam's import").
"""

from __future__ import annotations

from concurrent import futures

from beam_jobs import load, shard_writer, spill, summary, worker_pool
from beam_jobs.config import ConvertConfig
from beam_jobs.source_file import SourceFile

# In each worker process: what `start` set up.
_WORKER_ARGS: dict = {}


def start(config: ConvertConfig, temp_dir: str, fixed_labels: tuple[str, ...] | None) -> None:
    """Sets up a worker for the job: its checker, and threads to read remote sources."""
    checker = load.Checker(config.policy)
    if fixed_labels is not None:
        index = {label: i for i, label in enumerate(fixed_labels)}
        checker.set_labels(index, index)
    else:  # every label is the dataset's: its index is given once all are known
        checker.set_labels(_Every(), {})
    _WORKER_ARGS.update(config=config, temp_dir=temp_dir, checker=checker,
                        readers=futures.ThreadPoolExecutor(load.REMOTE_READERS))  # fmt: skip


class _Every:
    """The labels container that holds every label."""

    def __contains__(self, label) -> bool:
        return True


@worker_pool.in_worker
def check(batch: list[SourceFile]) -> list:
    """(split, Checked) or a Rejection per input of `batch`, in order."""
    return [
        rejected if checked is None else (source.split, checked)
        for source, checked, _, rejected in _WORKER_ARGS["checker"].check(batch)
    ]


@worker_pool.in_worker
def write(shard: tuple[str, int, int, str]) -> list[summary.ShardWritten]:
    """Writes shard (split, index, shards, file of its entries); what was written."""
    split, index, shards, entries_path = shard
    return shard_writer.write_shard(
        spill.read_items(entries_path), split, index, shards, _WORKER_ARGS["temp_dir"],
        _WORKER_ARGS["config"], _WORKER_ARGS["readers"],
    )  # fmt: skip
