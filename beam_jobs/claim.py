"""An exclusive claim on an output folder, so that two conversions never write into one.

Two runs into the same folder would each finalise their own shards beside the other's. The
launcher claims the folder before it writes anything (`OUT/.tfrecord-pipe-claim`), renews
the claim while the job runs, and gives it up at the end. Taking a claim is atomic: a
claim written whole and then linked to its name on local disk, an object created only if none exists
(`if_generation_match=0`) on gs://. A claim not renewed for STALE_AFTER_S (or, on this
machine, one whose process is gone) belongs to a run that died: the next run takes it over,
and says so. A run stopped that long (Ctrl-Z, a suspended VM) may so lose its claim while it
lives: before it changes the output it checks that the claim is still its own
(`check_held`), and stops if not. Other filesystems have no atomic create here: there the
claim is checked, then written, and a warning says that two runs started at the same moment
are not told apart.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import socket
import threading
import time
import uuid

from beam_jobs import storage
from tfrecord_pipe._core import messages, naming, paths

LOG = logging.getLogger(__name__)

CLAIM_NAME = naming.CLAIM_NAME
RENEW_EVERY_S = 30.0
STALE_AFTER_S = 300.0  # ten renewals missed: the run that holds it is gone
GIVE_UP_WAIT_S = 5.0  # a failed run's wait for a renewal in flight, and its try to give up
# A job launched without waiting holds the claim itself: nobody renews it, and its last step
# gives it up. This long, so that a day-long job keeps it; a job that failed keeps it too,
# until then, or until the claim file is removed (the busy error says so).
JOB_LEASE_S = 48 * 3600.0
JOB_HOST = "(the job)"


class OutputBusyError(FileExistsError):
    """Another conversion is writing into the output folder; the message says which."""


class ClaimLostError(RuntimeError):
    """This run's claim on the output was taken over (it stopped renewing it for the lease:
    stopped or suspended), or removed; the message says what became of the output."""


def this_host() -> str:
    """The host a claim names: its name, and on Linux its PID namespace, in which alone a
    claim's pid can be looked up (containers may share a host name, not their processes)."""
    try:
        space = os.readlink("/proc/self/ns/pid")  # "pid:[4026531836]"
    except OSError:
        return socket.gethostname()
    return f"{socket.gethostname()} {space}"


@dataclasses.dataclass(frozen=True)
class Holder:
    """Who holds a claim. Attributes: run id, host (JOB_HOST for a job launched without
    waiting), pid, started and renewed (Unix seconds), and how long it lasts unrenewed."""

    run: str
    host: str
    pid: int
    started: float
    renewed: float
    lease_s: float = STALE_AFTER_S

    def is_stale(self, now: float) -> bool:
        if self.host == this_host() and not _alive(self.pid):
            return True
        return now - self.renewed > self.lease_s

    def __str__(self):
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.started))
        if self.host == JOB_HOST:
            return f"run {self.run} (a job launched without waiting, started {started})"
        name, _, space = self.host.partition(" ")  # (`this_host`: the name, the namespace)
        pid = f"pid {self.pid}" + (f" in {space}" if space else "")
        return f"run {self.run} (host {name}, {pid}, started {started})"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


class Claim:
    """The claim on `folder` for one run; a context manager that takes, renews and gives it up.

    Attributes:
      taken_over: the holder of a stale claim this run replaced, or None.
    """

    def __init__(self, folder: str, run: str | None = None):
        self.path = paths.join(folder, CLAIM_NAME)
        self.taken_over: Holder | None = None
        self._handed_over = False
        now = time.time()
        run = run or uuid.uuid4().hex[:12]
        self._me = Holder(run, this_host(), os.getpid(), now, now)
        self._store = _store_for(self.path)
        self._stop = threading.Event()
        self._renewer = threading.Thread(target=self._renew_until_stopped, daemon=True)

    def __enter__(self) -> Claim:
        self.acquire()
        self._renewer.start()
        return self

    def __exit__(self, kind, *_) -> None:
        self._stop.set()
        # A renewal in flight ends within its retries; a run that failed (a storage outage,
        # most often) does not wait that long for it.
        self._renewer.join(None if kind is None else GIVE_UP_WAIT_S)
        if not self._handed_over or kind is not None:  # a launch that failed keeps no claim
            try:
                self._store.release(self._me)
            except Exception as err:  # noqa: BLE001 - any storage's: the claim expires
                LOG.warning(
                    "Could not give up the claim %s (%s): a run on this machine takes it over "
                    "at once, one elsewhere %.0f s after this run's last sign of life.",
                    self.path, messages.one_line(err), self._me.lease_s,
                )  # fmt: skip

    @property
    def run(self) -> str:
        return self._me.run

    def lost(self) -> ClaimLostError | None:
        """None while this run holds the claim (or the storage cannot say); else the error
        saying what became of it."""
        try:
            said = _lost(self._store, self._me.run)
        except Exception:  # the storage cannot say: not known to be lost
            return None
        return None if said is None else _lost_error(paths.parent(self.path), self.run, said)

    def hand_over(self) -> None:
        """Leaves the claim to the job about to be launched: no more renewals from here, a lease of
        JOB_LEASE_S, and the job's last step gives it up (`give_up`)."""
        self._stop.set()
        self._renewer.join()
        self._me = dataclasses.replace(
            self._me, host=JOB_HOST, pid=0, renewed=time.time(), lease_s=JOB_LEASE_S
        )
        self._store.renew(self._me)
        self._handed_over = True

    def acquire(self) -> None:
        """Takes the claim, or raises OutputBusyError naming the run that holds it."""
        for _ in range(3):  # a race with another run taking over the same stale claim
            if self._store.create(self._me):
                return
            holder = self._store.read()
            if holder is None:  # given up between our two looks
                continue
            if not holder.is_stale(time.time()):
                raise OutputBusyError(
                    f"{paths.parent(self.path)} is being written by another conversion: "
                    f"{holder}, alive {time.time() - holder.renewed:.0f} s ago. Wait for it to "
                    f"finish, or write elsewhere. If it was killed, its claim expires "
                    f"{holder.lease_s:.0f} s after its last sign of life, or remove {self.path}."
                )
            if self._store.remove_stale(holder):
                self.taken_over = holder
        raise OutputBusyError(f"Could not claim {self.path}: other runs keep taking it.")

    def _renew_until_stopped(self) -> None:
        while not self._stop.wait(RENEW_EVERY_S):
            try:
                self._me = dataclasses.replace(self._me, renewed=time.time())
                self._store.renew(self._me)
            except Exception as err:  # a missed renewal is not fatal: ten in a row are
                LOG.warning("Could not renew the claim %s (%s); trying again in %.0f s",
                            self.path, messages.one_line(err), RENEW_EVERY_S)  # fmt: skip


def _lost(store, run: str) -> str | None:
    holder = store.read()
    if holder is not None and holder.run == run:
        return None
    return (f"{holder} holds it now" if holder is not None
            else "no run holds it now (it was removed, or taken over and given up)")  # fmt: skip


def check_held(folder: str, run: str) -> None:
    """Raises ClaimLostError unless run `run` still holds the claim on `folder`: a run that
    lost it (stopped for longer than the lease: Ctrl-Z, a suspended VM) must change nothing
    there, where another run may have written since."""
    said = _lost(_store_for(paths.join(folder, CLAIM_NAME)), run)
    if said is not None:
        raise _lost_error(folder, run, said)


def _lost_error(folder: str, run: str, said: str) -> ClaimLostError:
    return ClaimLostError(
        f"This conversion (run {run}) no longer holds the claim on {folder}: {said}. A claim "
        "is taken over once its lease ends unrenewed (this process stopped or suspended, its "
        "storage out of reach, a job's 48-hour lease spent), or it was removed. This run "
        f"changes nothing more in {folder}; check what is there (tfrecord-pipe inspect "
        f"{folder} --check), and run the conversion again if needed."
    )


def give_up(folder: str, run: str) -> None:
    """Removes the claim on `folder` if run `run` holds it (a job's last step does this)."""
    _store_for(paths.join(folder, CLAIM_NAME)).release_run(run)


def _store_for(path: str):
    if not paths.is_remote(path):
        return _LocalClaim(path)
    if path.startswith("gs://"):
        return _GcsClaim(path)
    return _OtherClaim(path)


def _link_or_exclusive_copy(source: str, target: str) -> None:
    """Gives `source`'s whole content the name `target` if no file has it (FileExistsError
    if one does). Where the filesystem has no hard links, an exclusive create and a write:
    there a reader may see the claim empty for a moment."""
    try:
        os.link(source, target)
        return
    except FileExistsError:
        raise
    except OSError as err:
        if err.errno not in storage.NO_HARD_LINKS:
            raise
    fd = os.open(target, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    with os.fdopen(fd, "wb") as f, open(source, "rb") as whole:
        f.write(whole.read())


def _encode(holder: Holder) -> bytes:
    return json.dumps(dataclasses.asdict(holder)).encode()


def _decode(data: bytes) -> Holder | None:
    try:
        return Holder(**json.loads(data))
    except (ValueError, TypeError):  # half-written, or not ours: treat as long dead
        return Holder("?", "?", 0, 0.0, 0.0)


class _LocalClaim:
    """On local disk: the claim is written whole under another name, then linked to its own
    (a link, like O_EXCL, fails if the name exists); a stale claim is renamed away (only one
    run can). Created with O_EXCL and then written, a claim was empty for a moment, and a run
    that read it then took it for a dead one's and took it over: two runs wrote at once."""

    def __init__(self, path: str):
        self._path = path

    def create(self, holder: Holder) -> bool:
        folder = paths.parent(self._path) or "."
        partial = f"{self._path}.{holder.run}.new"
        try:
            paths.make_local_folder(folder)  # a link to nowhere: FileExistsError, not a claim
            with open(partial, "wb") as f:
                f.write(_encode(holder))
            _link_or_exclusive_copy(partial, self._path)
        except FileExistsError:
            if not os.path.isdir(folder):
                raise ValueError(f"Cannot write into {folder}: it is a link to nothing, or a "
                                 "file. Give an output folder.") from None  # fmt: skip
            return False
        except OSError as err:  # a read-only disk, no permission, a path through a file
            raise ValueError(
                f"Cannot write into {folder} ({err.strerror}): give an output folder that can "
                "be created and written to."
            ) from None
        finally:
            with contextlib.suppress(OSError):
                os.remove(partial)
        return True

    def read(self) -> Holder | None:
        try:
            with open(self._path, "rb") as f:
                return _decode(f.read())
        except FileNotFoundError:
            return None

    def remove_stale(self, holder: Holder) -> bool:
        aside = f"{self._path}.stale-{uuid.uuid4().hex[:8]}"
        try:
            os.rename(self._path, aside)
        except FileNotFoundError:  # another run took it over first
            return False
        os.remove(aside)
        return True

    def renew(self, holder: Holder) -> None:
        current = self.read()
        if current is not None and current.run == holder.run:
            partial = f"{self._path}.{holder.run}"
            with open(partial, "wb") as f:
                f.write(_encode(holder))
            os.replace(partial, self._path)

    def release(self, holder: Holder) -> None:
        self.release_run(holder.run)

    def release_run(self, run: str) -> None:
        current = self.read()
        if current is not None and current.run == run:
            with contextlib.suppress(FileNotFoundError):
                os.remove(self._path)


class _GcsClaim:
    """On gs://: object preconditions (if_generation_match) make each step atomic. A request
    that took effect and whose answer was lost is retried by the client, and its
    precondition then fails on the object it made itself: the claim object is read, and
    where it is this run's, its generation taken as ours (`_adopt`). A create so refused read
    as another run's claim, and one renewal so refused failed every renewal after it (a
    helper's trial)."""

    def __init__(self, path: str):
        self._blob = storage.gcs_blob(path)
        self._generation = None  # of our claim object
        self._seen_generation = None  # of the claim object read last

    def create(self, holder: Holder) -> bool:
        from google.api_core import exceptions

        try:
            self._blob.upload_from_string(_encode(holder), if_generation_match=0)
        except exceptions.PreconditionFailed:
            return self._adopt(holder)
        self._generation = self._blob.generation
        return True

    def _adopt(self, holder: Holder) -> bool:
        """Whether the claim object is `holder`'s run's; if so, its generation is ours now."""
        current = self.read()
        if current is None or current.run != holder.run:
            return False
        self._generation = self._seen_generation
        return True

    def read(self) -> Holder | None:
        from google.api_core import exceptions

        try:
            self._blob.reload()
            self._seen_generation = self._blob.generation
            data = self._blob.download_as_bytes()
        except exceptions.NotFound:
            return None
        return _decode(data)

    def remove_stale(self, holder: Holder) -> bool:
        from google.api_core import exceptions

        try:
            self._blob.delete(if_generation_match=self._seen_generation)
        except (exceptions.PreconditionFailed, exceptions.NotFound):
            return False
        return True

    def renew(self, holder: Holder) -> None:
        from google.api_core import exceptions

        try:
            self._blob.upload_from_string(_encode(holder), if_generation_match=self._generation)
        except exceptions.PreconditionFailed:
            if not self._adopt(holder):
                raise
            self._blob.upload_from_string(_encode(holder), if_generation_match=self._generation)
        self._generation = self._blob.generation

    def release(self, holder: Holder) -> None:
        from google.api_core import exceptions

        for _ in range(2):
            try:  # briefly: a claim not given up expires, and the run is ending
                self._blob.delete(if_generation_match=self._generation, timeout=GIVE_UP_WAIT_S,
                                  retry=storage.gcs_retry().with_timeout(GIVE_UP_WAIT_S))
                return
            except exceptions.NotFound:  # (gone: our delete's answer lost, or removed)
                return
            except exceptions.PreconditionFailed:
                if not self._adopt(holder):
                    break
        LOG.warning("The claim %s was not ours any more when the run ended", self._blob.name)

    def release_run(self, run: str) -> None:
        from google.api_core import exceptions

        current = self.read()
        if current is None or current.run != run:
            return
        try:
            self._blob.delete(if_generation_match=self._seen_generation)
        except (exceptions.PreconditionFailed, exceptions.NotFound):
            pass  # renewed or removed meanwhile: not ours to remove


class _OtherClaim:
    """Filesystems without an atomic create: checked, then written (best effort)."""

    def __init__(self, path: str):
        self._path = path

    def create(self, holder: Holder) -> bool:
        if storage.exists(self._path):
            return False
        LOG.warning(
            "%s: this filesystem has no atomic create; two conversions started at the same "
            "moment into this folder would not be told apart.", self._path,
        )  # fmt: skip
        storage.write_bytes(self._path, _encode(holder))
        return True

    def read(self) -> Holder | None:
        if not storage.exists(self._path):
            return None
        return _decode(storage.read_bytes(self._path))

    def remove_stale(self, holder: Holder) -> bool:
        storage.delete([self._path])
        return True

    def renew(self, holder: Holder) -> None:
        storage.write_bytes(self._path, _encode(holder))

    def release(self, holder: Holder) -> None:
        self.release_run(holder.run)

    def release_run(self, run: str) -> None:
        current = self.read()
        if current is not None and current.run == run:
            storage.delete([self._path])
