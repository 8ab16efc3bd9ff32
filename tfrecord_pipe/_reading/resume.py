"""Where a seeded training pipeline is, as a small JSON-able state, for programs that save it
themselves (JAX with orbax or a file, as Grain's iterators are saved).

A seeded pipeline's batches are a function of their position (`epochs.py`), so the state is
the number of batches given out and what that number means: the layout's fingerprint (the
files, counts, host position, seed, window) and the batch size. Restoring builds the pipeline
again from that position; nothing is decoded to get there. TensorFlow programs can instead
checkpoint the tf.data iterator itself (`tf.train.Checkpoint(iterator=...)`), which holds the
same kind of position.

    batches = input_fn.numpy_batches()
    for step, (images, labels) in zip(range(steps), batches):
        ...
        save(step, model, batches.get_state())      # a dict of a few numbers and strings
    # after a preemption:
    batches = input_fn.numpy_batches()
    batches.set_state(saved_state)                  # the next batch is the one after the save
"""

from __future__ import annotations

import hashlib
from typing import Any

import tensorflow as tf

from tfrecord_pipe._core import arguments
from tfrecord_pipe._reading import epochs, seeded

FORMAT = "tfrecord-pipe/position"
VERSION = 1


class BatchIterator:
    """Numpy batches of one host's seeded training pipeline, with `get_state` / `set_state`."""

    def __init__(self, input_fn):
        config = input_fn.config
        if not config.seeded:
            raise ValueError(
                "numpy_batches() keeps a position, which only a seeded pipeline has: give "
                "seed= to make_input_fn (with is_training=True). Without one, iterate "
                "input_fn().as_numpy_iterator()."
            )
        self._input_fn = input_fn
        self._given = 0
        self._iterator = None
        self._facts = None

    def __iter__(self) -> BatchIterator:
        return self

    def __next__(self):
        if self._iterator is None:
            dataset = self._input_fn(start_batches=self._given)
            self._iterator = dataset.as_numpy_iterator()
        batch = next(self._iterator)
        self._given += 1
        return batch

    def _pipeline(self) -> dict[str, Any]:
        """What a state is valid for: this host's layout and batch."""
        if self._facts is None:
            context = self._input_fn.host_context()
            hosts = (context.input_pipeline_id, context.num_input_pipelines) if context else (0, 1)
            config = self._input_fn.config
            batch = context.get_per_replica_batch_size(config.batch_size) if context else None
            self._facts = {
                **seeded.position_facts(config, context),
                "host": list(hosts),
                "batch_size": batch or config.batch_size,
            }
        return self._facts

    def get_state(self) -> dict[str, Any]:
        """The position after the last batch given: JSON-able, a few hundred bytes."""
        return {"format": FORMAT, "version": VERSION, "batches": self._given, **self._pipeline()}

    def set_state(self, state: dict[str, Any]) -> None:
        """Goes on after the batch `state` was taken at.

        Raises:
          ValueError: not such a state, or one of a pipeline that reads other records
            (another dataset, seed, host position or count, batch or shuffle settings).
        """
        if not isinstance(state, dict) or state.get("format") != FORMAT:
            raise ValueError(f"Not a tfrecord-pipe position state: {str(state)[:200]}")
        if state.get("version") != VERSION:
            raise ValueError(
                f"A position state of version {state.get('version')}; this tfrecord-pipe reads "
                f"version {VERSION}."
            )
        here = self._pipeline()
        differ = [name for name in here if epochs.differs(state, here, name)]
        if differ:
            said = "; ".join(f"{name}: saved {state.get(name)}, here {here[name]}" for name in differ)
            raise ValueError(epochs.other_records("This position state", said))
        batches = state.get("batches")
        if not isinstance(batches, int) or isinstance(batches, bool) or batches < 0:
            raise ValueError(f"A position state with batches={batches!r}")
        self._given = batches
        self._iterator = None


def pipeline_batches(context: tf.distribute.InputContext, steps: int) -> int:
    """The batches one input pipeline gives in `steps` global steps: one per replica it
    feeds."""
    return steps * max(1, context.num_replicas_in_sync // context.num_input_pipelines)


class DistributedIterator(tf.Module):
    """A seeded training input under a tf.distribute strategy, as an iterator that
    `tf.train.Checkpoint` saves and restores: TensorFlow's own distributed iterator cannot be
    checkpointed (it is not trackable). What is saved is the number of steps given out and
    the fingerprint of this worker's layout and batch; after a restore the next step is the
    one after the save, and nothing skipped is decoded.

    `next(iterator)` gives a step's per-replica batches; call it outside your `tf.function`
    and pass the batches in (`distribute.resumable_iterator` makes one). A `tf.function` that
    runs several steps per call (as TPUs need) takes `iterator.for_steps(n)` instead.
    """

    def __init__(self, strategy: tf.distribute.Strategy, input_fn):
        super().__init__(name="tfrecord_pipe_input")
        if not input_fn.config.seeded:
            raise ValueError(
                "A resumable iterator keeps a position, which only a seeded pipeline has: give "
                "seed= to make_input_fn (with is_training=True)."
            )
        # Not tracked (a plain holder): only the two variables below make the checkpoint. The
        # tf.data iterator's own state would tie it to the start it was built from.
        self._held = _Held(strategy, input_fn)
        self._held.build(0)
        context = self._held.contexts[0]
        layout = seeded.pipeline_layout(input_fn.config, context)
        batch = context.get_per_replica_batch_size(input_fn.config.batch_size)
        facts = f"{epochs.fingerprint(layout)}/{batch}/{context.num_replicas_in_sync}"
        self._fingerprint = int(hashlib.sha256(facts.encode()).hexdigest()[:15], 16)
        with tf.init_scope():  # plain variables, whichever strategy scope this is made in
            self.steps = tf.Variable(0, dtype=tf.int64, trainable=False, name="steps")
            self.fingerprint = tf.Variable(
                self._fingerprint, dtype=tf.int64, trainable=False, name="fingerprint"
            )

    # A tensor of its own beside the two variables, as TensorFlow's own iterator saves one
    # (its state): a checkpoint of one kind restored into the other then fails, naming the
    # tensor it lacks, where it matched nothing and the input started again from its first
    # batch, silently. (A checkpoint saved before 0.5 has none, and restores as before.)
    _KIND = "a_tfrecord_pipe_resumable_iterator"  # (the name a restore says it lacks)

    def _serialize_to_tensors(self):
        return {self._KIND: tf.constant(self._KIND)}

    def _restore_from_tensors(self, restored_tensors):
        return tf.no_op()  # (the variables carry the position; a SavedModel needs an op here)

    def _copy_trackable_to_cpu(self, object_map):
        object_map.setdefault(self, self)  # (asynchronous checkpoints: the marker is constant)

    def __iter__(self) -> DistributedIterator:
        return self

    def __next__(self):
        iterator = self.for_steps(1)
        try:
            return next(iterator)
        except BaseException:  # (the end of a finite input, or an error): not given
            self.steps.assign_sub(1)
            self._held.at -= 1
            raise

    def for_steps(self, count: int):
        """TensorFlow's distributed iterator at this position, its next `count` steps counted
        as given: pass it into a `tf.function` that takes exactly `count` `next`s from it per
        call (`for _ in tf.range(count): strategy.run(step, args=(next(it),))`), and save
        checkpoints between calls. A call cut short (an error, a kill) leaves no checkpoint
        saved inside it, so no position is lost."""
        count = arguments.count("count", count)
        if count < 1:
            raise ValueError(f"count must be >= 1, got {count}")
        if int(self.fingerprint.numpy()) != self._fingerprint:
            raise ValueError(
                epochs.other_records(
                    "This input's checkpoint", "another dataset, seed, host count, batch or shuffle"
                )
            )
        steps = int(self.steps.numpy())
        if steps != self._held.at:  # restored from a checkpoint: start again from there
            self._held.build(steps)
        self.steps.assign_add(count)
        self._held.at += count
        return self._held.iterator


class _Held:
    """What a DistributedIterator holds without saving it."""

    def __init__(self, strategy, input_fn):
        self.strategy, self.input_fn = strategy, input_fn
        self.contexts, self.iterator, self.at = [], None, 0

    def build(self, steps: int) -> None:
        def pipeline(context):
            self.contexts.append(context)
            return self.input_fn(context, start_batches=pipeline_batches(context, steps))

        self.iterator = iter(self.strategy.distribute_datasets_from_function(pipeline))
        self.at = steps
