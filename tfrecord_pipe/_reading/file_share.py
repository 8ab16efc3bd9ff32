"""Which records each input pipeline reads: one pipeline per host, or per
`tf.distribute.InputContext`.

Pipelines own whole files, dealt round-robin, so that each reads sequentially and no two read
the same record. With fewer files than pipelines (or empty files) some would get nothing: then
the records are dealt instead, as one stream in file order: pipeline i of n keeps records i, i+n, i+2n, ... of
the split (correct, but every pipeline reads every file; the reader warns). Dealing by each
file's own record numbers would starve pipelines when files hold fewer records than there
are pipelines: a split of one-record files left all but pipeline 0 with nothing, and their
training spun for ever.
"""

from __future__ import annotations

import dataclasses
import logging

import tensorflow as tf

from tfrecord_pipe._reading import dataset

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class PipelineShare:
    """The part of a split that one input pipeline reads.

    Attributes:
      files: the files this pipeline opens, in split order.
      record_counts: records per file in the file (not the share), or None when unknown.
      record_shard: (num_pipelines, index) when there are fewer files than pipelines: this
        pipeline keeps records index, index + num_pipelines, ... of `files` read one after
        another. None when the pipeline owns whole files.
      firsts: with record_shard and known counts, the first record each file gives this
        pipeline (then every num_pipelines-th): what lets each file be read on its own.
    """

    files: tuple[str, ...]
    record_counts: tuple[int, ...] | None
    record_shard: tuple[int, int] | None = None
    firsts: tuple[int, ...] | None = None

    def without(self, missing) -> PipelineShare:
        """This share without the files in `missing` (skip_corrupt): dealt as if they were
        there, so every pipeline's share is what it would be on a host that has them."""
        kept = [i for i, file in enumerate(self.files) if file not in missing]
        return PipelineShare(
            tuple(self.files[i] for i in kept),
            None if self.record_counts is None else tuple(self.record_counts[i] for i in kept),
            self.record_shard,
            None if self.firsts is None else tuple(self.firsts[i] for i in kept),
        )

    @property
    def stride(self) -> int:
        """Every how many records of a file this pipeline keeps (1: whole files). Only dealt
        records with known counts are kept per file; without counts they are dealt from the
        files read as one stream."""
        return self.record_shard[0] if self.firsts is not None else 1

    @property
    def num_examples(self) -> int | None:
        """Records this pipeline yields in one pass, when the counts are known."""
        if self.record_counts is None:
            return None
        if self.record_shard is None:
            return sum(self.record_counts)
        return sum(
            len(range(first, count, self.stride))
            for first, count in zip(self.firsts, self.record_counts)
        )


def share(split: dataset.Split, num_pipelines: int = 1, index: int = 0) -> PipelineShare:
    """What input pipeline `index` of `num_pipelines` reads of `split`'s files."""
    files, record_counts = split.files, split.record_counts
    if not 0 <= index < num_pipelines:
        raise ValueError(f"input pipeline {index} does not exist among {num_pipelines}")
    if len(files) >= num_pipelines and not _some_file_share_is_empty(record_counts, num_pipelines):
        picked = range(index, len(files), num_pipelines)
        counts = None if record_counts is None else tuple(record_counts[i] for i in picked)
        return PipelineShare(files=tuple(files[i] for i in picked), record_counts=counts)
    if record_counts is None:
        return PipelineShare(files, None, (num_pipelines, index))
    # Record r of the split (counting across files) goes to pipeline r % num_pipelines.
    kept, counts, firsts, start = [], [], [], 0
    for file, count in zip(files, record_counts):
        first = (index - start) % num_pipelines
        if first < count:  # files that give this pipeline nothing are not opened
            kept.append(file)
            counts.append(count)
            firsts.append(first)
        start += count
    return PipelineShare(tuple(kept), tuple(counts), (num_pipelines, index), tuple(firsts))


def _some_file_share_is_empty(record_counts, num_pipelines: int) -> bool:
    """Whether dealing whole files leaves a pipeline without records (empty files) while the
    split has enough for all: then records are dealt instead."""
    if record_counts is None or sum(record_counts) < num_pipelines:
        return False
    return any(sum(record_counts[i::num_pipelines]) == 0 for i in range(num_pipelines))


def empty_pipelines_problem(split: dataset.Split, num_pipelines: int) -> str | None:
    """Why training on `num_pipelines` pipelines cannot work, when some would get no record;
    None when each gets at least one, or when the counts are unknown.

    Every pipeline works it out from the same facts, so every host stops with the same error
    instead of one spinning on nothing while the others wait for it in a collective.
    """
    total = split.num_examples
    if total is None or total >= num_pipelines:
        return None
    return (
        f"Split {split.name!r} holds {total} record(s) for {num_pipelines} input pipelines "
        "(hosts, or replicas reading their own input): training needs at least one record per "
        f"pipeline. Train on at most {total} pipelines (fewer hosts), or add images."
    )


def pipeline_position(input_context) -> tuple[int, int]:
    """(number of input pipelines, this one's index)."""
    if input_context is None:
        return 1, 0
    return input_context.num_input_pipelines, input_context.input_pipeline_id


def replicas_per_pipeline(input_context) -> int:
    """The replicas one input pipeline feeds (a batch each a global step)."""
    if input_context is None:
        return 1
    return max(1, input_context.num_replicas_in_sync // input_context.num_input_pipelines)


def pipeline_counts(split: dataset.Split, input_context) -> list[int | None]:
    """The records of every pipeline's share of the split (None where unknown): what an
    evaluation's steps, the same on every pipeline, are made from."""
    num_pipelines, _ = pipeline_position(input_context)
    return [share(split, num_pipelines, i).num_examples for i in range(num_pipelines)]


def pipeline_share(
    split: dataset.Split, input_context: tf.distribute.InputContext | None, training: bool
) -> PipelineShare:
    """This pipeline's share of the split; refused when training would leave a pipeline
    with nothing to read (it would spin for ever, and the others wait for it)."""
    num_pipelines, index = pipeline_position(input_context)
    if training:
        problem = empty_pipelines_problem(split, num_pipelines)
        if problem:
            raise ValueError(problem)
    kept = share(split, num_pipelines, index)  # of every file listed, missing ones too
    if training and kept.record_shard is None:
        _warn_of_uneven_shares(split, num_pipelines)
    if split.missing:  # (skip_corrupt): dealt from another host's list, hosts read twice
        gone = [file for file in kept.files if file in split.missing]
        kept = kept.without(split.missing)
        if training and gone and not kept.files:
            raise ValueError(
                f"Every file of this input pipeline's share of split {split.name!r} is missing "
                f"here ({', '.join(gone[:3])}{', ...' if len(gone) > 3 else ''}): pipeline "
                f"{index} of {num_pipelines} reads those of the files the manifest lists, "
                "and training needs records. Restore them on this host."
            )
    if kept.record_shard is not None and len(split.files) < num_pipelines:
        _warn_once(
            ("fewer files", split.files, num_pipelines),
            "%d files for %d input pipelines: each pipeline reads every file and keeps 1/%d "
            "of the records. Write at least %d shards (--num_shards) to read each once.",
            len(split.files), num_pipelines, num_pipelines, num_pipelines,
        )  # fmt: skip
    elif kept.record_shard is not None:
        _warn_once(
            ("empty files", split.files, num_pipelines),
            "%d files for %d input pipelines, but dealt whole, some pipeline's files would "
            "hold no record (empty shards): each pipeline reads every file and keeps 1/%d of "
            "the records. Convert again to write shards of equal counts.",
            len(split.files), num_pipelines, num_pipelines,
        )  # fmt: skip
    return kept


UNEVEN = 1.25  # a share this many times another's: its records trained on that much less

_SAID: set = set()  # (what, files, pipelines) warned of in this process


def _warn_once(key: tuple, message: str, *args) -> None:
    """A warning of how a split's files are shared out, once a process: a pipeline built again
    (an epoch's loop, each host simulated in one process) said it again each time."""
    if key not in _SAID:
        _SAID.add(key)
        log.warning(message, *args)


def warn_of_repeats_in_a_step(split: dataset.Split, share: PipelineShare, batch: int,
                              input_context, global_batch: bool) -> None:  # fmt: skip
    """Training repeats the records: with fewer in a pipeline's share than a step draws from
    it (a batch for each replica it feeds), every step holds some of them twice or more,
    which a user would not guess from a loss. `global_batch`: the batch came from the
    config's global batch_size (else from the caller, a replica's)."""
    records, replicas = share.num_examples, replicas_per_pipeline(input_context)
    if not records or records >= batch * replicas:
        return
    if global_batch:
        advice = f"a batch_size of at most {records * pipeline_position(input_context)[0]}"
    else:
        advice = f"a batch of at most {max(1, records // replicas)} a replica"
    _warn_once(
        ("batch", split.files, records, batch, replicas),
        "Each training step draws %d records (%d replica(s) x %d) from this input pipeline's "
        "%d records of split %r: every step holds some of them more than once. Give %s, or "
        "train on more records.", batch * replicas, replicas, batch, records, split.name, advice,
    )  # fmt: skip


def _warn_of_uneven_shares(split: dataset.Split, num_pipelines: int) -> None:
    """Each pipeline goes round its own share: dealt whole files of unequal totals, the
    records of a small share are trained on more often than those of a large one."""
    if num_pipelines < 2 or split.record_counts is None:
        return
    sizes = [share(split, num_pipelines, i).num_examples for i in range(num_pipelines)]
    if min(sizes) and max(sizes) > UNEVEN * min(sizes):
        advice = (f" Convert with --num_shards a multiple of {num_pipelines} to even them."
                  if len(split.files) % num_pipelines else "")  # fmt: skip
        _warn_once(
            ("uneven", split.files, num_pipelines),
            "Training on %d input pipelines, dealt whole files of split %r: their shares hold "
            "%d to %d records, so the records of the smallest are trained on about %.1fx as "
            "often as those of the largest.%s", num_pipelines, split.name, min(sizes),
            max(sizes), max(sizes) / min(sizes), advice,
        )  # fmt: skip


def nothing_read(share) -> str:
    shown = ", ".join(share.files[:3]) + (", ..." if len(share.files) > 3 else "")
    dealt = (
        f" (or, dealt among {share.record_shard[0]} pipelines, they hold fewer records than "
        "there are pipelines: train on fewer)"
        if share.record_shard
        else ""
    )
    return (
        f"A whole pass over this input pipeline's {len(share.files)} file(s) ({shown}) gave "
        "no record: each is missing, empty, or (with skip_corrupt) corrupt from its start"
        f"{dealt}. Check them with `tfrecord-pipe verify`, or convert again."
    )
