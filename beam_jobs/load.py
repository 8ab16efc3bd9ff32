"""The inputs' checks: one input file in, a small `Checked` entry or one dead letter out.
Plain Python (no Beam), for the Beam job's `load_images.LoadImages` and the local engine's
workers.

The image bytes are not passed on. Carrying them through the shuffle that groups records by
shard made a local run hold the whole dataset in memory (Beam's local runner keeps grouped
data in RAM). Instead each shard writer reads its sources again (`read_record`): the bytes
are checked against the checksum taken here, and only images that are re-encoded pay for
normalising a second time.

Inputs are checked in batches. Remote sources (gs://...) are read ahead of their checks,
REMOTE_READERS at a time: one request after another, a worker would spend its time waiting on
the network. Checking can use a few threads too: locally the job runs as one in-process
worker (Beam's cheapest local mode), and this is where the cores are used; Pillow decoding,
hashing and reading release the GIL.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import hashlib
import operator
from collections.abc import Container, Mapping
from concurrent import futures

import google_crc32c

from beam_jobs import outcome, shard_plan, storage
from beam_jobs.source_file import SourceFile, rejection
from tfrecord_pipe._core import images, paths, schema

BATCH = 64  # inputs per check call: threads stay busy, and only small entries wait
REMOTE_READERS = 16  # threads reading remote sources at once, hiding request latency


@dataclasses.dataclass(frozen=True, slots=True)
class Checked:
    """A source that passed every check, and what its record will hold.

    Attributes:
      key: the record's order key (shard_plan.order_key of relpath).
      path: where to read the source again.
      relpath: the record's filename.
      label_index: 0-based label (-1 while the local engine does not know every label yet).
      label_text: the label's name.
      sha256: hex digest of the source bytes, stored in the record.
      crc32c: CRC-32C of the source bytes, compared when they are read again (a change is
        caught at a tenth of the cost of hashing them again); None where they are not read
        again (the local engine's shards written as their inputs are checked, `pieces.py`).
      height, width: of the stored image.
      size: bytes of the serialized record (for shard sizing).
      reencoded: the stored image is a re-encoding (else the source bytes themselves).
    """

    key: str
    path: str
    relpath: str
    label_index: int
    label_text: str
    sha256: str
    crc32c: int | None
    height: int
    width: int
    size: int
    reencoded: bool

    def __reduce__(self):
        # Pickled several times an input (to the launcher, through its sorts on disk, to the
        # shard's writer): a slots dataclass's own pickling looks its fields up every time, at
        # three times the cost, and the launcher's one core paid it.
        return Checked, _CHECKED_VALUES(self)

    def with_label_index(self, label_index: int) -> Checked:
        """This entry with its label's index, given once every label is known."""
        values = list(_CHECKED_VALUES(self))
        values[_LABEL_INDEX] = label_index
        return Checked(*values)


_CHECKED_NAMES = tuple(field.name for field in dataclasses.fields(Checked))
_CHECKED_VALUES = operator.attrgetter(*_CHECKED_NAMES)
_LABEL_INDEX = _CHECKED_NAMES.index("label_index")


def in_order(pool: futures.Executor, fn, items, window: int):
    """Futures of fn(item) on `pool`, yielded in item order, submitted up to `window` ahead.

    Consumed one at a time, at most `window` results wait in memory: reading remote sources
    ahead of the work that uses them, without holding a whole batch or shard.
    """
    pending = collections.deque()
    for item in items:
        pending.append(pool.submit(fn, item))
        if len(pending) >= window:
            yield pending.popleft()
    yield from pending


class SourceChangedError(RuntimeError):
    """A source's bytes differ between the check and the write: it changed during the job."""


def _changed(checked: Checked, how: str = "its checksum differs from when it was checked"
             ) -> SourceChangedError:  # fmt: skip
    return SourceChangedError(
        f"{checked.path} changed while the job ran ({how}). Rerun the conversion once the "
        "inputs are stable."
    )


def read_record(
    checked: Checked, policy: images.ImagePolicy, label_offset: int, read=storage.read_input
) -> bytes:
    """The serialized Example for a checked source, from its bytes read again (by `read`, as
    `storage.read_input` reads).

    Raises:
      SourceChangedError: the file changed since it was checked; rerun the job.
    """
    try:
        data = read(checked.path, policy.max_file_bytes)
    except FileNotFoundError as err:
        raise _changed(checked, "it is gone") from err
    except images.Rejected as err:  # emptied, replaced by a FIFO, grown past the cap...
        raise _changed(checked, f"now {err.detail}") from err
    except OSError as err:  # a local file made a link loop, or unreadable; not a network error
        if paths.is_remote(checked.path):
            raise
        raise _changed(checked, f"it cannot be read now: {err}") from err
    if google_crc32c.value(data) != checked.crc32c:
        raise _changed(checked)
    encoded = images.normalise(data, policy).encoded if checked.reencoded else data
    return serialized_record(checked, encoded, label_offset)


def serialized_record(checked: Checked, encoded: bytes, label_offset: int) -> bytes:
    """The serialized Example of a checked source whose stored image is `encoded`."""
    record = schema.ImageRecord(
        encoded=encoded,
        height=checked.height,
        width=checked.width,
        label_index=checked.label_index,
        label_text=checked.label_text,
        filename=checked.relpath,
        sha256=checked.sha256,
    )
    return schema.serialize(record, label_offset=label_offset)


class Checker:
    """Checks inputs, one batch at a time: plain Python, for LoadImages and the local engine.

    Remote sources (gs://...) are read REMOTE_READERS ahead of their checks; local ones in
    the checking thread. With `threads` > 1 the inputs of a batch are checked on that many
    threads: at most that many images are decoded at once, whatever the number of readers.
    With `read_again` False the entries have no checksum: the caller writes their records
    from the bytes read here.
    """

    def __init__(self, policy: images.ImagePolicy, threads: int = 1, read_again: bool = True):
        self._policy = policy
        self._read_again = read_again  # False: no checksum for a second read (`Checked.crc32c`)
        self._pool = futures.ThreadPoolExecutor(threads) if threads > 1 else None
        self._readers = futures.ThreadPoolExecutor(REMOTE_READERS)  # threads start when used
        self._labels: Container[str] = {}
        self._label_index: Mapping[str, int] = {}

    def close(self):
        for pool in (self._readers, self._pool):
            if pool is not None:  # None: one thread
                pool.shutdown()

    def set_labels(self, labels: Container[str], label_index: Mapping[str, int]) -> None:
        """The labels inputs may have, and the index each gets (`label_index` may lack some of
        `labels`: their entries get index -1, to be given once every label is known)."""
        self._labels, self._label_index = labels, label_index

    def check(self, batch: list[SourceFile]):
        """(source, Checked or None, bytes read, None or Rejection) per input, in input order,
        each once it and all before it are done; raises for an input only when the storage
        failed (`outcome.decide`), never for what the file holds."""
        return self.decide(batch, self.entry)

    def decide(self, batch: list[SourceFile], then):
        """then(source, `outcome.decide`'s Outcome) per input, in input order, run on the
        checking threads; each once it and all before it are done."""
        check = self._pool.map if self._pool else map
        # `read()` gives the source's bytes, or raises (see `outcome.decide`).
        decided = lambda source, read: then(
            source, outcome.decide(source, self._labels, self._policy, read)
        )
        if any(paths.is_remote(source.path) for source in batch):
            # Remote reads wait on the network: REMOTE_READERS of them run ahead of the checks.
            # (Several checking threads take a whole batch's reads at once: at most BATCH held.)
            reads = (
                future.result
                for future in in_order(self._readers, self._read, batch, REMOTE_READERS)
            )
            return check(decided, batch, reads)
        return self._decided_here(batch, check, decided)

    def _decided_here(self, batch: list[SourceFile], check, decided):
        """`decide` for local sources: a local read takes microseconds, in the checking
        thread, the disk's part asked for the whole batch ahead."""
        listed = (source.path for source in batch if source.problem is None)
        with storage.ReadAhead(listed) as ahead:
            reads = (functools.partial(self._read, source, ahead.read) for source in batch)
            yield from check(decided, batch, reads)

    def entry(self, source: SourceFile, result: outcome.Outcome):
        """(source, Checked or None, bytes read, None or Rejection) of a decided input."""
        if result.reason is not None:
            return source, None, len(result.data), rejection(source, result.reason, result.detail)
        return source, self._checked(source, result.data, result.stored), len(result.data), None

    def _read(self, source: SourceFile, read=storage.read_input) -> bytes:
        if outcome.refused_unread(source, self._labels) is not None:
            return b""  # not read: refused by its listing or its label (decide says why)
        return read(source.path, self._policy.max_file_bytes)

    def _checked(self, source: SourceFile, data: bytes, stored: images.StoredImage) -> Checked:
        return Checked(
            key=shard_plan.order_key(source.relpath),
            path=source.path,
            relpath=source.relpath,
            label_index=self._label_index.get(source.label, -1),
            label_text=source.label,
            sha256=hashlib.sha256(data).hexdigest(),
            crc32c=google_crc32c.value(data) if self._read_again else None,
            height=stored.height,
            width=stored.width,
            size=shard_plan.record_size(len(stored.encoded), source.relpath, source.label),
            reencoded=stored.reencoded,
        )
