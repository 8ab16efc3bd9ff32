"""The Grain input pipeline over a dataset's ArrayRecord shards: what the tf.data reader does,
with Grain's random access.

Training: the split's records as one random-access sequence; each epoch a permutation of all
of them (Grain's index shuffle, seeded by the seed and the epoch); the epochs end to end; each
record's crop and flip drawn from a Generator that Grain seeds from the seed and the record's
place in that stream; host i of n takes places i, i + n, i + 2n, ... So the hosts' batches
of one step are one contiguous window of the stream, every record is read once per epoch
across the hosts, and a record's pixels do not depend on the number of hosts. Batches are cut
while the stream is indexable, so threads and worker processes make whole batches, the same
ones whatever their number. Resuming is Grain's iterator state (`resume.py`).

Evaluation: host i takes records i, i + n, ...; every host yields the same number of full
batches, the last ones filled with weight-0 examples, and every real example weighs slots /
records, as the tf.data reader's padded evaluation does (`padded.padded_weight`): a mean over
the weights is the mean over the records.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import sys
import threading

import numpy as np

from tfrecord_pipe._core import arguments, crops, naming, parent_watch, schema
from tfrecord_pipe._grain import images
from tfrecord_pipe._grain.resume import GrainInput, fingerprint
from tfrecord_pipe._grain.source import Keyed, Split, find_split, grain_module, source

# Threads that make batches ahead of the one being used, in each process (OpenCV decodes
# and resizes without the GIL); each holds one batch.
DEFAULT_THREADS = 4

log = logging.getLogger(__name__)


def _label(record: schema.ImageRecord, split: Split) -> np.int32:
    if not 0 <= record.label_index < split.num_classes:
        raise ValueError(
            f"{record.filename}: label {record.label_index} after subtracting label_offset="
            f"{split.label_offset} is not in 0..{split.num_classes - 1}"
        )
    return np.int32(record.label_index)


def _hosts(host_index: int | None, host_count: int | None) -> tuple[int, int]:
    """This host's place: as given, else JAX's process index and count (one host without
    JAX)."""
    if (host_index is None) != (host_count is None):
        raise ValueError("Give both host_index and host_count, or neither (JAX's are used).")
    if host_index is None:
        try:
            import jax
        except ImportError:
            return 0, 1
        return jax.process_index(), jax.process_count()
    if not 0 <= host_index < host_count:
        raise ValueError(f"host_index must be in 0..{host_count - 1}, got {host_index}")
    return host_index, host_count


def make_dataset(
    data: str,
    split: str | None = None,
    *,
    is_training: bool,
    batch_size: int,
    image_size: int = 224,
    dtype: str = "float32",
    seed: int | None = None,
    num_epochs: int | None = None,
    with_keys: bool = False,
    host_index: int | None = None,
    host_count: int | None = None,
    worker_count: int = 0,
    threads: int = DEFAULT_THREADS,
) -> GrainInput:
    """This host's batches of a dataset's ArrayRecord shards, through Grain.

    Args:
      data: a local dataset folder converted with `--formats ...array_record`.
      split: default "train" for training, "validation" for evaluation.
      is_training: training (per-epoch global shuffle, random crop and flip, batches with
        drop_remainder) or evaluation (centre crop, every record once in padded batches).
      batch_size: this host's batch size (the global batch over host_count).
      image_size: side of the square images.
      dtype: "float32" / "bfloat16" (normalised) or "uint8" (normalise on the device).
      seed: training only, and required there: the order and every random choice are a
        function of it, and a resumed run must use the same one.
      num_epochs: training: None repeats forever (for a run that counts its own steps, and
        may be resumed to train longer); else that many epochs, the last global batch that
        would be short dropped (every host stops at the same step).
      with_keys: training: each batch also holds its records' numbers in the split (int64),
        as the tf.data reader's `with_keys`.
      host_index, host_count: this host's place among the hosts reading; default JAX's.
      worker_count: processes that read and preprocess (Grain's `mp_prefetch`); 0 reads in
        this process, on `threads` threads. The batches are the same whatever the count; a
        saved state is resumed with the same count (its shape depends on it).
      threads: threads in each process, each making a whole batch ahead (so up to `threads`
        batches in memory per process, beside the one in use).

    Returns:
      A `GrainInput`: iterate it for (images [batch, size, size, 3], labels int32 [batch]
      [, keys]) tuples in training, (images, labels, weights float32 [batch]) in evaluation.
      Its iterators have `get_state()` / `set_state(state)`.
    """
    grain = grain_module()
    # Types first (`arguments`): a numpy int is stored as an int, as the state is JSON.
    data = arguments.path("data", data)
    split = arguments.text("split", split, optional=True)
    is_training = arguments.flag("is_training", is_training)
    with_keys = arguments.flag("with_keys", with_keys)
    batch_size = arguments.count("batch_size", batch_size)
    image_size = arguments.count("image_size", image_size)
    worker_count = arguments.count("worker_count", worker_count)
    threads = arguments.count("threads", threads)
    seed = arguments.count("seed", seed, optional=True)
    num_epochs = arguments.count("num_epochs", num_epochs, optional=True)
    host_index = arguments.count("host_index", host_index, optional=True)
    host_count = arguments.count("host_count", host_count, optional=True)
    crops.check_dtype(dtype)
    if batch_size < 1 or image_size < 1:
        raise ValueError(f"batch_size and image_size must be >= 1, got {batch_size}, {image_size}")
    if is_training and seed is None:
        raise ValueError(
            "seed is required for Grain training: the shuffle and the augmentation are a "
            "function of it, and a resumed run must pass the same seed."
        )
    if is_training and not 0 <= seed < 2**32:
        raise ValueError(f"seed must be in 0..2**32-1, got {seed}")
    if not is_training and (seed is not None or num_epochs is not None or with_keys):
        raise ValueError(
            "seed, num_epochs and with_keys are for training; evaluation reads every record once."
        )
    if num_epochs is not None and num_epochs < 1:
        raise ValueError(f"num_epochs must be >= 1 or None (forever), got {num_epochs}")
    if host_count is not None and host_count < 1:
        raise ValueError(f"host_count must be >= 1, got {host_count}")
    if worker_count < 0 or threads < 1:
        raise ValueError(f"worker_count must be >= 0 and threads >= 1, got {worker_count}, {threads}")
    index, count = _hosts(host_index, host_count)
    chosen = find_split(data, split or (naming.TRAIN if is_training else naming.VALIDATION))
    records = grain.MapDataset.source(Keyed(source(chosen), chosen))
    if is_training:
        examples = _training(records, chosen, seed, num_epochs, index, count, batch_size)
    else:
        examples = _evaluation(records, chosen, image_size, index, count, batch_size)
    make_batch = _batch_maker(image_size, dtype, threads, keys=with_keys, weights=not is_training)
    # Batched while the stream is still indexable: batch j is places j*batch ... of the
    # stream, whoever makes it. Each thread, or worker process, makes whole batches, and the
    # batches come back in order: the same ones whatever the threads and workers (batched in
    # the workers' own streams, each worker would drop its own remainder: records lost).
    batches = examples.batch(batch_size, drop_remainder=True, batch_fn=make_batch)
    read = grain.ReadOptions(num_threads=threads, prefetch_buffer_size=threads)
    stream = batches.to_iter_dataset(read)
    if worker_count:
        _absl_flags_at_defaults()
        stream = stream.mp_prefetch(
            grain.MultiprocessingOptions(num_workers=worker_count), worker_init_fn=_exit_with_parent
        )
    settings = {
        "records": fingerprint(chosen),
        "training": is_training,
        "seed": seed,
        # Where the stream ends: a state saved at the end (all of Grain's workers finished)
        # would resume into a longer stream as ended, silently. Train on with num_epochs=None.
        "num_epochs": num_epochs,
        "batch_size": batch_size,
        "image_size": image_size,
        "dtype": dtype,
        "with_keys": with_keys,
        "host": [index, count],
        "worker_count": worker_count,
    }
    return GrainInput(stream, settings)


def _absl_flags_at_defaults() -> None:
    """Grain's worker processes read Grain's absl flags, and fail in a program that did not
    start through `absl.app` ("flags were not parsed"). Such a program has them at their
    defaults: say so to absl. A program that parsed its flags keeps them."""
    from absl import flags

    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()


def _exit_with_parent(worker_index: int, worker_count: int) -> None:
    """Run in each of Grain's worker processes: ends it when the training process is gone
    (Grain's workers stop only when told to)."""
    parent_watch.exit_with_parent()




def _training(records, split, seed, num_epochs, index, count, batch_size):
    def choices(keyed, rng: np.random.Generator) -> _Planned:
        """A record, and its crop and flip drawn (the window, then the flip, as
        `images.train_image` draws them)."""
        key, serialized = keyed
        record = schema.decode_example(serialized, label_offset=split.label_offset)
        window = images.random_window(record.height, record.width, rng)
        return _Planned(record, window, bool(rng.random() < 0.5), _label(record, split), key)

    stream = records.shuffle(seed=seed).repeat(num_epochs).random_map(choices, seed=seed)
    if num_epochs is not None:  # whole global batches only: every host stops at the same step
        window = count * batch_size
        if len(stream) < window:
            raise ValueError(
                f"{num_epochs} epoch(s) of split {split.name!r} hold {len(stream)} records, "
                f"fewer than one global batch ({batch_size} x {count} hosts): there would be "
                "no batch at all. Give a smaller batch_size or more epochs."
            )
        stream = stream[: len(stream) // window * window]
    if len(records) < count * batch_size:
        log.warning(
            "Training global batches of %d (%d a host x %d) from split %r's %d records: "
            "every global batch holds some records more than once. Give a batch_size of at "
            "most %d a host, or train on more records.", count * batch_size, batch_size, count,
            split.name, len(records), len(records) // count,
        )  # fmt: skip
    return stream[index::count]


def _evaluation(records, split, image_size, index, count, batch_size):
    grain = grain_module()
    mine = records[index::count]
    # Every host yields as many batches as the host with the most records needs.
    steps = math.ceil(math.ceil(split.num_examples / count) / batch_size)
    weight = np.float32(steps * batch_size * count / split.num_examples)
    real = len(mine)

    def planned(position: int) -> _Planned | None:
        if position >= real:
            return None  # a padding slot
        _, serialized = mine[position]
        record = schema.decode_example(serialized, label_offset=split.label_offset)
        window = crops.centre_window(record.height, record.width, image_size)
        return _Planned(record, window, False, _label(record, split), weight=weight)

    slots = grain.MapDataset.range(steps * batch_size).map(planned)
    return slots


@dataclasses.dataclass(frozen=True)
class _Planned:
    """A record and what to make of it: its window, its flip, its label; its key (training)
    or weight (evaluation)."""

    record: schema.ImageRecord
    window: tuple[int, int, int, int]
    flip: bool
    label: np.int32
    key: int = 0
    weight: np.float32 = np.float32(1.0)


def _batch_maker(image_size: int, dtype: str, threads: int, keys: bool = False,
                 weights: bool = False):  # fmt: skip
    """Grain's `batch_fn`: a batch's images made straight into it (None: a padding slot,
    a zero image of weight 0)."""
    shape = (image_size, image_size, 3)
    # Each thread makes one batch and its prefetch holds one more; the trainer holds a few.
    arrays = _BatchArrays(kept=2 * threads + 4)

    def make(planned: list[_Planned | None]):
        count = len(planned)
        images_out = arrays.take((count, *shape), images.numpy_dtype(dtype))
        labels = np.zeros(count, np.int32)
        extra = np.zeros(count, np.float32 if weights else np.int64)
        for slot, plan in enumerate(planned):
            if plan is None:
                images_out[slot] = 0
                continue
            record = plan.record
            images.write(images_out[slot], record.encoded, (record.height, record.width),
                         plan.window, plan.flip, dtype)  # fmt: skip
            labels[slot] = plan.label
            extra[slot] = plan.weight if weights else plan.key
        if weights or keys:
            return images_out, labels, extra
        return images_out, labels

    return make


class _BatchArrays:
    """The batches' image arrays, each used again once nobody holds it: a fresh 77 MB batch
    is 19,000 page faults (benchmarks/RESULTS.md, "Grain").
    An array is free when only this pool refers to it: a trainer holding the batch, a view
    of it, or an array that aliases it (a zero-copy `jax.device_put` on CPU) refers to it
    too. Worker processes each start with an empty pool. The arrays live as long as the
    `GrainInput` (up to `kept` batches' memory between two evaluations, say)."""

    def __init__(self, kept: int):
        # At most this many arrays kept; more are made fresh. None where the GIL is off: a
        # free-threaded build's reference counts are not read this way.
        self._kept = kept if getattr(sys, "_is_gil_enabled", lambda: True)() else 0
        self._arrays: list[np.ndarray] = []
        self._lock = threading.Lock()

    def take(self, shape: tuple[int, ...], dtype) -> np.ndarray:
        with self._lock:
            for place in range(len(self._arrays)):
                if sys.getrefcount(self._arrays[place]) == _COUNT_WHEN_ONLY_LISTED:
                    if self._arrays[place].shape == shape:
                        return self._arrays[place]
            array = np.empty(shape, dtype)
            if len(self._arrays) < self._kept:
                self._arrays.append(array)
            return array

    def __getstate__(self):
        return {"kept": self._kept}

    def __setstate__(self, state):
        self.__init__(state["kept"])


def _count_when_only_listed() -> int:
    """What `sys.getrefcount` says of an item only a list holds, asked as `take` asks: 2 on
    CPython 3.11 (the list and the argument); newer versions may skip the argument's
    reference, and a fixed 2 would then take a held array for a free one."""
    listed = [object()]
    return sys.getrefcount(listed[0])


_COUNT_WHEN_ONLY_LISTED = _count_when_only_listed()
