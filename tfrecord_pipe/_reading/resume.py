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

import contextlib
import hashlib
import json
from typing import Any

import tensorflow as tf

from tfrecord_pipe._core import arguments, messages
from tfrecord_pipe._reading import epochs, file_share, seeded

FORMAT = "tfrecord-pipe/position"
VERSION = 1


@contextlib.contextmanager
def damage_said(data: str):
    """TensorFlow's error for a record damaged inside a shard ("truncated record at 5085")
    names no file, and the seeded stream cannot use the error catcher that would (it is not
    checkpointable): the error is raised again saying what to do."""
    try:
        yield
    except tf.errors.DataLossError as err:
        raise tf.errors.DataLossError(
            err.node_def, err.op,
            f"{messages.one_line(err)}. A shard of {data} is damaged; the seeded reader cannot "
            f"name it: `tfrecord-pipe inspect {data} --check` does. Restore the shard (or "
            "convert again), then resume from the last checkpoint.",
        ) from err  # fmt: skip


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
        try:
            with damage_said(self._input_fn.config.data):
                batch = next(self._iterator)
        except BaseException:
            # TensorFlow's iterator may have gone past the batch that failed, which was not
            # counted: a caller that catches the error and goes on would get the batches
            # after it while the state lagged one behind (a resume repeated a batch). The
            # next call rebuilds the stream at the count, so it tries that batch again.
            self._iterator = None
            raise
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
        state = arguments.json_values(state)
        if state.get("version") != VERSION:
            raise ValueError(
                f"A position state of version {state.get('version')}; this tfrecord-pipe reads "
                f"version {VERSION}."
            )
        here = self._pipeline()
        said = epochs.differences(state, here, batch_of="this host's")
        if said:
            raise ValueError(epochs.other_records(
                "This position state", said,
                "do not set it: the input starts at its first batch"))  # fmt: skip
        batches = state.get("batches")
        if not isinstance(batches, int) or isinstance(batches, bool) or batches < 0:
            raise ValueError(
                f"A position state with batches={batches!r}: it is the count of batches given "
                "out, a whole number >= 0. Restore the state get_state() gave, as it was saved."
            )
        self._given = batches
        self._iterator = None


def pipeline_batches(context: tf.distribute.InputContext, steps: int) -> int:
    """The batches one input pipeline gives in `steps` global steps: one per replica it
    feeds."""
    return steps * file_share.replicas_per_pipeline(context)


class DistributedIterator(tf.Module):
    """A seeded training input under a tf.distribute strategy, as an iterator that
    `tf.train.Checkpoint` saves and restores: TensorFlow's own distributed iterator cannot be
    checkpointed (it is not trackable). What is saved is the number of steps given out and
    the fingerprint of this worker's layout and batch; after a restore the next step is the
    one after the save, and nothing skipped is decoded.

    `next(iterator)` gives a step's per-replica batches outside a `tf.function`. A function
    that runs several steps per call (as TPUs need) takes `iterator.in_function()` as an
    argument and calls `next` on it inside: each step is counted in the function, as it is
    taken (`distribute.resumable_iterator` makes one).
    """

    def __init__(self, strategy: tf.distribute.Strategy, input_fn):
        super().__init__(name="tfrecord_pipe_input")
        if not input_fn.config.seeded:
            raise ValueError(
                "A resumable iterator keeps a position, which only a seeded pipeline has: give "
                "seed= to make_input_fn (with is_training=True)."
            )
        with tf.init_scope():  # plain variables, whichever strategy scope this is made in
            self.steps = tf.Variable(0, dtype=tf.int64, trainable=False, name="steps")
            # Not tracked (a plain holder): only `steps` and `fingerprint` make the checkpoint.
            # The tf.data iterator's own state would tie it to the start it was built from.
            self._held = _Held(strategy, input_fn, self.steps)
        self._held.build(0)
        context = self._held.contexts[0]
        batch = context.get_per_replica_batch_size(input_fn.config.batch_size)
        # The settings behind the fingerprint, saved in words so that a refusal names them
        # (as JSON, the restored ones too: tf.Module would track a dict).
        named = seeded.position_facts(input_fn.config, context)
        named["pipeline"] = [context.input_pipeline_id, context.num_input_pipelines]
        named.update(batch_size=batch, replicas=context.num_replicas_in_sync)
        self._facts = json.dumps(named)
        self._restored_facts = None
        self._fingerprint = _fingerprint(named["fingerprint"], batch, named["replicas"])
        with tf.init_scope():
            self.fingerprint = tf.Variable(
                self._fingerprint, dtype=tf.int64, trainable=False, name="fingerprint"
            )

    # A tensor of its own beside the two variables, as TensorFlow's own iterator saves one
    # (its state): a checkpoint of one kind restored into the other then fails, naming the
    # tensor it lacks, where it matched nothing and the input started again from its first
    # batch, silently. (A checkpoint saved before 0.5 has none, and restores as before.) Its
    # value is the settings behind the fingerprint, as JSON.
    _KIND = "a_tfrecord_pipe_resumable_iterator"  # (the name a restore says it lacks)

    def _serialize_to_tensors(self):
        return {self._KIND: tf.constant(self._facts)}

    def _restore_from_tensors(self, restored_tensors):
        saved = restored_tensors[self._KIND]
        if tf.executing_eagerly():  # (a SavedModel's restore runs in a graph; it names none)
            self._restored_facts = saved.numpy().decode()
        return tf.no_op()  # (the variables carry the position; a SavedModel needs an op here)

    def _copy_trackable_to_cpu(self, object_map):
        object_map.setdefault(self, self)  # (asynchronous checkpoints: the marker is constant)

    def __iter__(self) -> DistributedIterator:
        return self

    def __next__(self):
        stream = self.in_function()  # (after a step that failed, built again at the count)
        with damage_said(self._held.input_fn.config.data):
            return next(stream)

    def _differences(self) -> str:
        saved = _facts_of(self._restored_facts)
        # The settings restored last, where they are those of the fingerprint restored (a
        # checkpoint of 0.4 holds none, and a graph's restore gives none).
        restored = int(self.fingerprint.numpy())
        said = ""
        if saved and _fingerprint(saved.get("fingerprint"), saved.get("batch_size"),
                                  saved.get("replicas")) == restored:  # fmt: skip
            said = epochs.differences(saved, json.loads(self._facts))
        return said or "another dataset, seed, host count, batch or shuffle"

    def in_function(self) -> Steps:
        """This input's steps for a `tf.function` that takes several per call: pass it as an
        argument on every call (a restore replaces it) and call `next` on it inside. Each
        step is counted as it is taken, so a checkpoint between calls holds the exact
        position, however many steps a call took."""
        if int(self.fingerprint.numpy()) != self._fingerprint:
            raise ValueError(epochs.other_records(
                "This input's checkpoint", self._differences(),
                "make a new distribute.resumable_iterator, outside that checkpoint (the rest of "
                "it is restored): it starts at its first batch"))  # fmt: skip
        steps, held = int(self.steps.numpy()), self._held
        # Restored, or a step failed inside a call (TensorFlow's iterator may have gone past
        # it, uncounted): start again from the count.
        if steps != int(held.given.numpy()) or int(held.asked.numpy()) != steps:
            held.build(steps)
        return held.stream


def _fingerprint(layout: str, batch: int, replicas: int) -> int:
    """What a DistributedIterator's position means, as the number its checkpoint holds."""
    facts = f"{layout}/{batch}/{replicas}"
    return int(hashlib.sha256(facts.encode()).hexdigest()[:15], 16)


def _facts_of(saved: str | None) -> dict | None:
    """The settings a checkpoint's marker holds; None for a marker that holds none."""
    if saved is None:
        return None
    try:
        facts = json.loads(saved)
    except ValueError:
        return None
    return facts if isinstance(facts, dict) else None


class Steps:
    """A DistributedIterator's steps, as a `tf.function` takes them (`in_function`): TensorFlow's
    distributed iterator, each `next` counted beside it."""

    def __init__(self, iterator, steps: tf.Variable, given: tf.Variable, asked: tf.Variable):
        self._iterator, self._steps, self._given, self._asked = iterator, steps, given, asked

    def __iter__(self) -> Steps:
        return self

    def __next__(self):
        # A stream restored, or past a step that failed, under a function that kept this
        # object would read on from the wrong place: refused before the step is taken (in a
        # tf.function an assertion is ordered by its dependants alone). A step that fails is
        # not counted, but was asked for: `in_function` then builds the stream again.
        checks = [tf.debugging.assert_equal(
            counted, self._given,
            message="This input was restored from a checkpoint, or a step of it failed, after "
            "this function took its steps object: pass iterator.in_function() to the "
            "function on every call.",
        ) for counted in (self._steps, self._asked)]  # fmt: skip
        with tf.control_dependencies([check for check in checks if check is not None]):
            asked = self._asked.assign_add(1)  # (the checks are None when eager)
        with tf.control_dependencies([asked]):
            batch = next(self._iterator)
        with tf.control_dependencies(tf.nest.flatten(batch, expand_composites=True)):
            self._steps.assign_add(1)
            self._given.assign_add(1)
        return batch


class _Held:
    """What a DistributedIterator holds without saving it: the stream, and how many steps it
    has given counted from where it was built (a restore changes the saved count alone)."""

    def __init__(self, strategy, input_fn, saved: tf.Variable):
        self.strategy, self.input_fn, self.saved = strategy, input_fn, saved
        self.contexts, self.stream = [], None
        self.given = tf.Variable(0, dtype=tf.int64, trainable=False, name="given")
        # Steps asked of the stream, taken or failed: ahead of `given` after a failure.
        self.asked = tf.Variable(0, dtype=tf.int64, trainable=False, name="asked")

    def build(self, steps: int) -> None:
        def pipeline(context):
            self.contexts.append(context)
            return self.input_fn(context, start_batches=pipeline_batches(context, steps))

        iterator = iter(self.strategy.distribute_datasets_from_function(pipeline))
        self.given.assign(steps)
        self.asked.assign(steps)
        self.stream = Steps(iterator, self.saved, self.given, self.asked)
