"""A resumable position in the Grain pipeline: Grain's iterator state, with the settings that
give it meaning, so that a state saved by a pipeline reading other batches is refused rather
than silently resumed."""

from __future__ import annotations

from tfrecord_pipe._core import arguments, manifest
from tfrecord_pipe._grain.source import Split

try:  # A Grain iterator, so that Grain's and Orbax's checkpointing take it as one.
    from grain import DatasetIterator as _GrainIterator
except ImportError:  # (the Grain path says what to install when it is used)
    _GrainIterator = object


def fingerprint(split: Split) -> str:
    """What names the records and their order (`manifest.split_identity`): a dataset converted
    again from other images may have the same counts."""
    return manifest.split_identity(split.files, split.shard_lengths, split.positions, split.name)


STATE_FORMAT = "tfrecord-pipe grain position"


class GrainInput:
    """This host's batches (`make_dataset`): iterate it; `dataset` is the Grain IterDataset,
    for more Grain transformations (their state is then Grain's alone)."""

    def __init__(self, dataset, settings: dict):
        self.dataset = dataset
        self.settings = settings

    def __iter__(self) -> ResumableBatches:
        return ResumableBatches(iter(self.dataset), self.settings)


class ResumableBatches(_GrainIterator):
    """Grain's iterator, with a state that says what it is a position in: `set_state` refuses
    a state saved by a pipeline with other records, seed, batch, hosts or workers, whose
    position would silently mean other batches. A `grain.DatasetIterator`: Grain's
    `checkpoint.CheckpointHandler` (Orbax) saves and restores it."""

    def __init__(self, iterator, settings: dict):
        super().__init__(iterator)  # Grain's own iterator is its parent (prefetch, close)
        self._iterator = iterator
        self._settings = settings

    def __iter__(self) -> ResumableBatches:
        return self

    def __next__(self):
        return next(self._iterator)

    def get_state(self) -> dict:
        """A small JSON-able dict: save it with the model's checkpoint."""
        return {"format": STATE_FORMAT, "settings": self._settings,
                "grain": self._iterator.get_state()}  # fmt: skip

    def set_state(self, state: dict) -> None:
        """Goes back to the position `get_state` gave: the next batch is the one that came
        after it.

        Raises:
          ValueError: the state is not one of ours, or from a pipeline with other settings.
        """
        if not (
            isinstance(state, dict) and state.get("format") == STATE_FORMAT
            and isinstance(state.get("settings"), dict) and "grain" in state
        ):  # fmt: skip
            raise ValueError(
                f"Not a {STATE_FORMAT} state (from make_dataset's iterators' get_state): "
                f"{str(state)[:200]}"
            )
        saved = state["settings"]
        differ = [
            f"{_SAID.get(key, key)}: saved {saved.get(key)!r}, here {value!r}"
            for key, value in self._settings.items()
            if arguments.json_values(saved.get(key)) != arguments.json_values(value)
        ]
        workers = saved.get("worker_count"), self._settings["worker_count"]
        if len(differ) == 1 and workers[0] != workers[1]:
            raise ValueError(
                f"This state was saved with worker_count={workers[0]!r}, here {workers[1]!r}: "
                "Grain's state has another shape for each count. Resume with "
                f"worker_count={workers[0]!r} (the batches are the same whatever the count)."
            )
        if differ:
            raise ValueError(
                "This state was saved by a pipeline that reads other batches ("
                + "; ".join(differ)
                + "). Resume with the settings it was saved with, or start afresh: a new "
                "iterator, without this state, starts at its first batch."
            )
        self._iterator.set_state(state["grain"])


# A setting named in words where its key alone does not say what changed.
_SAID = {"records": "records (the dataset: its shards, their counts and which inputs they hold)"}
