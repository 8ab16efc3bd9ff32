"""What each worker process of the local engine runs: the inputs' checks and the shards'
writing, the very functions Beam's steps run (`load.Checker`, `shard_writer.write_shard`),
or the shards written as their inputs are checked (`pieces.py`).

Nothing here imports Beam, nor does anything it imports (Beam is imported only for a remote
path): the workers' fork server preloads this module, and Beam's import cost most of a
CPU-second per conversion there (benchmarks/RESULTS.md, "Conversion without Beam's import").
"""

from __future__ import annotations

from concurrent import futures

from beam_jobs import load, pieces, shard_writer, spill, summary, worker_pool
from beam_jobs.config import ConvertConfig
from beam_jobs.source_file import SourceFile
from tfrecord_pipe._core import naming, paths

# In each worker process: what `start` set up.
_WORKER_ARGS: dict = {}


def start(config: ConvertConfig, temp_dir: str, fixed_labels: tuple[str, ...] | None,
          reads_once: bool = False) -> None:  # fmt: skip
    """Sets up a worker for the job: its checker, and threads to read remote sources.
    `reads_once`: the job writes its shards as it checks its inputs (`pieces.py`)."""
    checker = load.Checker(config.policy, read_again=not reads_once)
    if fixed_labels is not None:
        index = {label: i for i, label in enumerate(fixed_labels)}
        checker.set_labels(index, index)
    else:  # every label is the dataset's: its index is given once all are known
        checker.set_labels(AnyLabel(), {})
    _WORKER_ARGS.update(config=config, temp_dir=temp_dir, checker=checker,
                        readers=futures.ThreadPoolExecutor(load.REMOTE_READERS))  # fmt: skip


class AnyLabel:
    """The labels container that holds every label: the dataset's labels are the inputs'."""

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


@worker_pool.in_worker
def write_piece(piece: pieces.Piece) -> pieces.Done:
    """Checks a piece's inputs and writes their records (`pieces.write`)."""
    return pieces.write(piece, _WORKER_ARGS["checker"], _WORKER_ARGS["config"].label_offset)


@worker_pool.in_worker
def put_together(shard: tuple) -> list[summary.ShardWritten]:
    """Makes a shard file of pieces: shard ((split, index, shards), path, `pieces.cut`'s
    reads, whole, links); what was written."""
    (split, index, shards), path, reads, whole, links = shard
    cut = pieces.cut(reads)
    files = {piece: file for file, _, (piece, *_) in reads}
    ranges = [(files[piece], offset, length) for piece, offset, length in cut.ranges]
    size = pieces.put_together(path, ranges, whole, links)
    return [summary.ShardWritten(split, index, shards, cut.count, size, paths.basename(path),
                                 naming.TFRECORD, cut.digest())]  # fmt: skip
