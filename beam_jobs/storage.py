"""The few file operations the job needs, each written once, for every place it reads and
writes: local disk with Python's own calls, remote places (gs://, ...) through Beam's
filesystems, which reach them without TensorFlow.

Beam is imported only for a remote path: its import costs most of a CPU-second, and the local
engine's workers, which touch local files only for a local job, never pay it."""

from __future__ import annotations

import errno
import functools
import logging
import os
import re
import resource
import shutil
import stat
import sys
import threading
import time
import uuid
import zlib
from collections.abc import Iterable, Iterator
from typing import BinaryIO

from beam_jobs import listing
from tfrecord_pipe._core import extras, images, messages, paths

log = logging.getLogger(__name__)


def beam_filesystems():
    """Beam's FileSystems, imported on first use: for remote paths only. One thread imports
    it: a worker's readers reach a first remote path together, and Beam registers gs:// only
    if its GCS module imports whole."""
    with _BEAM_IMPORT:
        from apache_beam.io.filesystems import FileSystems
    return FileSystems


def scheme_problem(path: str, what: str) -> str | None:
    """Why no filesystem here reads the URL `path` (`what` names it in the message), or None
    for a local path or one Beam has a filesystem for (gs://; s3:// and others where their
    packages are installed). Beam's own error names a pip extra that does not help."""
    if meant := paths.mistyped_url(path):
        return paths.mistyped_said(what, path, meant)
    if not paths.is_remote(path):
        return None
    given, _, rest = path.partition("://")
    scheme = given.lower()
    if given != scheme:  # Beam's filesystems know schemes in lower case alone
        return (f"{what} {path!r}: write its scheme in lower case ({scheme}://{rest}).")
    if "//" in rest.rstrip("/"):  # an empty folder name: objects named so are no one's intent
        meant = f"{scheme}://{re.sub('/+', '/', rest)}"
        return (f"{what} {path!r} has an empty folder name ('//'): did you mean {meant}?")
    if scheme == "file":
        return (f"{what} {path!r} is a file:// URL: give it as a local path "
                f"({path[len('file://'):] or '/'}), without file://.")  # fmt: skip
    try:
        beam_filesystems().get_filesystem(path)
    except Exception:  # noqa: BLE001 - Beam says ValueError or BeamIOError, by scheme
        if scheme == "gs":  # Beam's GCS module did not import
            return (f"{what} {path!r}: Beam's Cloud Storage filesystem is not installed "
                    f"here: {extras.how_to_install('beam')}.")  # fmt: skip
        return (f"{what} {path!r}: nothing here reads {scheme}:// URLs. Local paths and gs:// "
                "are read (other object stores with Beam's filesystem for them installed); "
                "download or copy the files to one of those first.")  # fmt: skip
    return None


def _beam_compression(name: str):
    """Beam's CompressionTypes.<name>: imported, as FileSystems is, on first use."""
    beam_filesystems()
    from apache_beam.io.filesystem import CompressionTypes

    return getattr(CompressionTypes, name)


_BEAM_IMPORT = threading.Lock()


def size(path: str) -> int:
    """Bytes of the file at `path` (taken literally: no pattern)."""
    if not paths.is_remote(path):
        return os.path.getsize(path)
    return beam_filesystems().get_filesystem(path).metadata(path).size_in_bytes


def children(root: str) -> tuple[set[str], set[str]]:
    """(names of the folders, names of the files) directly in the folder `root`; none if it
    does not exist.

    Locally symlinks are followed. On gs:// the bucket is listed one level deep (a folder of a
    million images costs one request, not a listing of every object).

    Raises:
      NotADirectoryError: `root` is a file, not a folder.
    """
    if not paths.is_remote(root):
        if os.path.exists(root) and not os.path.isdir(root):
            raise NotADirectoryError(f"{root} is a file, not a folder")
        if not os.path.isdir(root):
            return set(), set()
        folders, files = set(), set()
        for child in os.scandir(root):
            try:
                is_dir = child.is_dir()
            except OSError:  # a link that cannot be followed (ELOOP): an entry, not a folder
                is_dir = False
            (folders if is_dir else files).add(child.name)
        return folders, files
    if root.startswith("gs://"):
        bucket, _, prefix = root[len("gs://") :].partition("/")
        prefix = f"{prefix}/" if prefix else ""
        blobs = gcs_client().list_blobs(bucket, prefix=prefix, delimiter="/", retry=gcs_retry())
        files = {blob.name[len(prefix) :] for blob in blobs if blob.name != prefix}
        folders = {name[len(prefix) :].rstrip("/") for name in blobs.prefixes}
        if not files and not folders and prefix and gcs_client().bucket(bucket).blob(
            prefix[:-1]).exists(retry=gcs_retry()):  # fmt: skip
            # An object by that name: a dataset written "into" it lay beside it, under
            # NAME/ (`convert imgs gs://b/ds/manifest.json`, in a helper's trial).
            raise NotADirectoryError(f"{root} is a file, not a folder")
        return folders, files
    # Other filesystems: a whole listing; Beam's filesystems have no cheaper way.
    parts = [entry.relpath.split("/") for entry in listing.walk(root)]
    return {p[0] for p in parts if len(p) > 1}, {p[0] for p in parts if len(p) == 1}


@functools.cache
def gcs_client():
    import google.auth.exceptions
    from google.cloud import storage as gcs  # only where gs:// is used

    try:
        return gcs.Client()
    except google.auth.exceptions.DefaultCredentialsError as err:
        raise ConnectionError(NO_CREDENTIALS) from err


def gcs_blob(path: str, client=None):
    """The object at the gs:// `path`, through `client` (default: `gcs_client`'s)."""
    bucket, _, name = path[len("gs://") :].partition("/")
    return (client or gcs_client()).bucket(bucket).blob(name)


@functools.cache
def _gcs_reader():
    """A client to read gs:// with: without credentials, an anonymous one, as Beam's
    filesystem reads (public data: a tutorial's CSV list on gs://cloud-ml-data)."""
    try:
        return gcs_client()
    except ConnectionError:
        from google.cloud import storage as gcs

        log.info("No Google Cloud credentials here: gs:// is read anonymously, which public "
                 "data allows (gcloud auth application-default login gives credentials).")  # fmt: skip
        return gcs.Client.create_anonymous_client()


GCS_RETRY_S = 120.0  # how long a Cloud Storage call is retried (the client library's default)
GCS_RETRY_SAID_EVERY_S = 30.0  # a retry said at most this often


@functools.cache
def gcs_retry():
    """The client library's retry policy for Cloud Storage calls, each retry said on the log:
    alone, a run with no network or a wrong endpoint waits two minutes in silence."""
    from google.api_core.retry import Retry
    from google.cloud.storage import retry

    last_said = -GCS_RETRY_SAID_EVERY_S

    def said(err: Exception) -> None:
        nonlocal last_said
        if time.monotonic() - last_said >= GCS_RETRY_SAID_EVERY_S:
            last_said = time.monotonic()
            log.warning("Cloud Storage did not answer; retrying for up to %.0f s (Ctrl-C stops): "
                        "%.200s", GCS_RETRY_S, messages.one_line(err))  # fmt: skip

    # The library's own predicate (which errors are passing); it has no way to add on_error.
    return Retry(predicate=retry.DEFAULT_RETRY._predicate, timeout=GCS_RETRY_S, on_error=said)


class StorageFailed(OSError):
    """An input could not be read for the storage's sake, not the file's: it is not rejected
    (a run at another hour would have read it); the job stops instead, and nothing is lost."""


# Errors that say the storage or the way to it failed (no network, a server error, throttling,
# credentials, retries given up), by the module that defines them: checked only where that
# module was imported, so a local job imports none of them.
_OUTAGE_ERRORS = (
    ("builtins", ("ConnectionError", "TimeoutError")),
    ("http.client", ("HTTPException",)),
    ("google.api_core.exceptions", ("ServerError", "TooManyRequests", "RetryError")),
    ("google.auth.exceptions", ("TransportError", "RefreshError", "DefaultCredentialsError")),
    ("requests.exceptions", ("ConnectionError", "Timeout")),
    ("urllib3.exceptions", ("HTTPError",)),
)


def is_outage(err: BaseException) -> bool:
    """Whether `err`, or an error it was raised from, says that the storage failed rather
    than the file (which may be missing, unreadable to us, or no file)."""
    for cause in _chain(err):
        if getattr(cause, "outage", False) is True:  # a worker's, told on its way back
            return True
        for module_name, names in _OUTAGE_ERRORS:
            module = sys.modules.get(module_name)
            kinds = tuple(getattr(module, name) for name in names if hasattr(module, name))
            if kinds and isinstance(cause, kinds):
                return True
    return False


def _chain(err: BaseException | None) -> Iterator[BaseException]:
    """`err`, then each error it was raised from (or while handling), once each."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        yield err
        err = err.__cause__ or err.__context__


def reach(path: str, what: str) -> None:
    """Asks the storage of the remote file `path` (`what` names it) once, before a job reads
    it there: with no network, the job's reads failed only after two minutes of silent
    retries. The file's own answer (missing, no access: anonymous reading of private data)
    is the job's to judge: it rejects that input, naming it.

    Raises:
      ConnectionError: the storage did not answer (its retries said).
    """
    if not path.startswith("gs://"):
        return  # (other stores: their filesystems' own errors)
    try:
        exists(path)
    except Exception as err:
        if not is_outage(err):
            log.debug("%s: %s (the job judges the file)", path, messages.one_line(err))
            return
        auth = sys.modules.get("google.auth.exceptions")
        expired = auth is not None and any(isinstance(c, auth.RefreshError) for c in _chain(err))
        if expired:  # (or revoked)
            raise ConnectionError(
                f"{what} {path}: the Google Cloud credentials here could not be refreshed "
                f"({messages.one_line(err)[:300]}). Log in again (gcloud auth "
                "application-default login), then run the command again."
            ) from err
        raise ConnectionError(
            f"{what} {path}: Cloud Storage cannot be reached ({messages.one_line(err)[:300]}). "
            "Check the network, then run the command again."
        ) from err


NO_CREDENTIALS = (
    "No Google Cloud credentials to reach gs://: run `gcloud auth application-default login`, "
    "or set GOOGLE_APPLICATION_CREDENTIALS to a service account key file."
)


def delete(files: list[str]) -> None:
    """Deletes these files, taken literally (Beam's delete takes them as patterns, locally
    and on gs://, so a name with "[" in it was not found)."""
    for path in files:
        if not paths.is_remote(path):
            os.remove(path)
        elif path.startswith("gs://"):
            gcs_blob(path).delete()
        else:
            beam_filesystems().delete([path])


def delete_folder(folder: str) -> None:
    """Deletes `folder` and everything in it (on gs://, every object below it)."""
    if paths.is_remote(folder):
        delete([meta.path for meta in listing.matching_below(folder)])
    else:
        shutil.rmtree(folder, ignore_errors=True)


def exists(path: str) -> bool:
    """Whether a file is at `path` (taken literally: no pattern). On gs:// by the client
    library, whose retries are said (Beam's filesystem retries two minutes in silence, a
    traceback at each); anonymously without credentials, as Beam's reads."""
    if not paths.is_remote(path):
        return os.path.isfile(path)
    if path.startswith("gs://"):
        return gcs_blob(path, _gcs_reader()).exists(retry=gcs_retry())
    return beam_filesystems().exists(path)


def exists_at_all(path: str) -> bool:
    """Whether anything is at `path`: a file, or locally a folder too (taken literally)."""
    if not paths.is_remote(path):
        return os.path.exists(path)
    return exists(path)


def open_to_read(path: str, by_name: bool = False) -> BinaryIO:
    """The file at `path`, open to read its bytes as stored; with `by_name`, decompressed
    when its name says so (`list.csv.gz`), as Beam's filesystems read a file.

    Locally Python's own calls read it; a compressed one, and a remote one, Beam's
    filesystems (what they always read, so the same names keep working)."""
    compressed = by_name and path.lower().endswith(COMPRESSED_SUFFIXES)
    if not paths.is_remote(path) and not compressed:
        return open(path, "rb")
    kind = _beam_compression("AUTO" if compressed else "UNCOMPRESSED")
    return beam_filesystems().open(path, compression_type=kind)


# The names Beam's filesystems decompress a file by (CompressionTypes.detect_compression_type).
COMPRESSED_SUFFIXES = (".bz2", ".deflate", ".gz", ".zst", ".zstd", ".xz", ".lzma")


def read_bytes(path: str, by_name: bool = False) -> bytes:
    """The whole file's bytes (`by_name`: as `open_to_read`)."""
    with open_to_read(path, by_name) as f:
        return f.read()


def read_text(path: str) -> str:
    return read_bytes(path).decode("utf-8")


def read_lines(path: str) -> Iterator[str]:
    """The lines of a UTF-8 text file, without their ends, read a block at a time.

    Raises:
      UnicodeDecodeError: a line is not UTF-8.
    """
    with open_to_read(path) as f:
        rest = b""
        while block := f.read(LINES_BLOCK):
            *lines, rest = (rest + block).split(b"\n")
            for line in lines:
                yield line.decode("utf-8")
        if rest:
            yield rest.decode("utf-8")


LINES_BLOCK = 1 << 20


def read_input(path: str, max_bytes: int) -> bytes:
    """An input file's bytes, as stored (never decompressed because of its name).

    Only a regular file of at most `max_bytes` is read: anything else (a FIFO would block the
    job, /dev/zero never ends) is refused without reading it, with its reason. Local files
    are read with the system's calls: Beam's FileSystems costs more per file, and the job
    reads every input twice (benchmarks/RESULTS.md, "Reading inputs").

    Raises:
      images.Rejected: not a regular file, or larger than `max_bytes`.
      OSError, or Beam's own errors: the file cannot be read.
    """
    if paths.is_remote(path):
        with open_to_read(path) as f:
            return _within(f.read(max_bytes + 1), max_bytes)
    # O_NONBLOCK: opening a FIFO that nobody writes to returns at once instead of waiting.
    try:
        handle = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as err:
        if err.errno != errno.ENXIO:
            raise
        # A socket, or a device with nothing behind it: nothing a file could hold.
        raise images.Rejected(images.NOT_A_FILE, "not a regular file (a socket or an "
                              "absent device): not read") from err  # fmt: skip
    return _read_and_close(handle, max_bytes)


def _read_and_close(handle: int, max_bytes: int) -> bytes:
    """The bytes of the open local file `handle` (as `read_input` says), which is closed."""
    try:
        return _within(_read_local(handle, max_bytes), max_bytes)
    finally:
        os.close(handle)


def _within(data: bytes, max_bytes: int) -> bytes:
    if len(data) > max_bytes:  # a remote file, or one that grew since fstat
        raise images.Rejected(images.FILE_TOO_LARGE, _too_large(None, max_bytes))
    return data


_MOST_PER_READ = 1 << 30  # Linux gives at most 2 GiB less 4 KiB in one read


class ReadAhead:
    """Local files asked into the kernel's cache all at once, then read: read one after
    another, files not in the cache each waited on the disk in turn (a 500,000-input
    conversion took twice as long with a cold cache). Each file stays open from the asking
    to its read (`read`), which so opens nothing again: an open and a close fewer per read.

    Best effort: a file that cannot be opened or advised is left to `read_input`, which says
    what is wrong. Use it as a context: the files never read are closed at its end. `read`
    may be called from several threads; each opened file is read once, the path's other
    reads (or any after the end) go to `read_input`. A file is read as it was when asked
    for: replaced or removed since, its bytes then (the write's checksum catches a change
    after the check). At most HELD_AT_MOST files are held open so in a process, whatever
    its number of threads: past that a file is asked for and closed at once, and the read
    opens it again.
    """

    def __init__(self, local_paths: Iterable[str]):
        local_paths = list(local_paths)
        self._slots = _HELD.take(len(local_paths))  # how many may stay open, given back at the end
        self._opened: dict[str, list[int]] = {}
        self._kept = 0
        try:
            for path in local_paths:
                self._ask(path)
        except BaseException:
            self.close()
            raise

    def _ask(self, path: str) -> None:
        try:
            handle = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        except (OSError, ValueError):  # ValueError: a NUL in the name
            return
        try:
            os.posix_fadvise(handle, 0, 0, os.POSIX_FADV_WILLNEED)
        except OSError:  # a FIFO, a socket...
            pass
        if self._kept < self._slots:
            self._opened.setdefault(path, []).append(handle)
            self._kept += 1
        else:
            os.close(handle)

    def read(self, path: str, max_bytes: int) -> bytes:
        """`read_input(path, max_bytes)`, from the file opened ahead where there is one."""
        try:
            handle = self._opened[path].pop()  # one thread's alone once taken
        except (KeyError, IndexError):
            return read_input(path, max_bytes)
        return _read_and_close(handle, max_bytes)

    def close(self) -> None:
        for handles in self._opened.values():
            while handles:
                try:
                    handle = handles.pop()
                except IndexError:  # a reader took it meanwhile
                    break
                os.close(handle)
        slots, self._slots = self._slots, 0
        _HELD.give_back(slots)

    def __enter__(self) -> ReadAhead:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _Slots:
    """A count shared by a process's threads: how many more files may be held open ahead."""

    def __init__(self, count: int):
        self._left = count
        self._lock = threading.Lock()

    def take(self, wanted: int) -> int:
        with self._lock:
            taken = min(wanted, self._left)
            self._left -= taken
            return taken

    def give_back(self, count: int) -> None:
        with self._lock:
            self._left += count


def _held_at_most() -> int:
    """256, or a quarter of this process's limit of open files where that is less."""
    limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return 256 if limit == resource.RLIM_INFINITY else max(0, min(256, limit // 4))


# Files held open ahead of their reads, in all of a process's threads together: a batch or a
# window is 64, and many threads holding theirs (Beam's multi-threaded local runner) must not
# reach the limit of open files (often 1,024), where every other open would fail.
HELD_AT_MOST = _held_at_most()
_HELD = _Slots(HELD_AT_MOST)


def _read_local(handle: int, max_bytes: int) -> bytes:
    """The bytes of the open local file `handle`, as `read_input` describes. Read from the
    descriptor: a Python file object would cost four system calls more per input (an fstat,
    an ioctl, an lseek, a read that finds the end), paid twice per input."""
    info = os.fstat(handle)
    if not stat.S_ISREG(info.st_mode):
        raise images.Rejected(images.NOT_A_FILE, "not a regular file: not read")
    if info.st_size > max_bytes:
        raise images.Rejected(images.FILE_TOO_LARGE, _too_large(info.st_size, max_bytes))
    if info.st_size == 0:
        # Kernel files (/proc, /sys) say 0 bytes whatever they give; reading one may wait, or
        # take what it gives from others (/proc/kmsg).
        raise images.Rejected(
            images.EMPTY_FILE, "0 bytes (empty, or a kernel file such as /proc/...): not read"
        )
    # As much as it says it holds, and one byte more, which a file that grew since fstat
    # fills: read(n) sets n bytes aside first, and the cap's 128 MiB for every input tripled
    # the cost of reading a small one. A read that gives less than asked once the size is in
    # is the end: one read, for an image on a local disk. Before that it is only a short read
    # (a FUSE mount may give 4 KiB at a time): on, to an empty one.
    parts, size, wanted = [], 0, info.st_size + 1
    while size <= max_bytes:
        asked = min(wanted - size, _MOST_PER_READ)
        try:
            part = os.read(handle, asked)
        except BlockingIOError:  # a kernel file with nothing to give without waiting
            raise images.Rejected(images.NOT_A_FILE, "gives no data without waiting: not read")
        parts.append(part)
        size += len(part)
        if size == wanted:  # it grew since (or holds more than it says): on, to the cap
            wanted = max_bytes + 1
        elif not part or (len(part) < asked and size >= info.st_size):
            break
    return b"".join(parts)


def _too_large(size: int | None, max_bytes: int) -> str:
    found = f"{size} bytes" if size is not None else f"more than {max_bytes} bytes"
    return (
        f"{found}, over the cap of {max_bytes} (ImagePolicy.max_file_bytes, --max_file_mb); "
        "not read whole"
    )


def part_path(path: str) -> str:
    """Where a file is written before it takes its name: a hidden, unique name beside it.

    A retried or duplicated worker (Dataflow retries failed bundles, and may run a slow one
    twice) then never leaves a half-written file under the real name, nor do two attempts
    write into one file.
    """
    return paths.join(
        paths.parent(path), f"{PART_PREFIX}{uuid.uuid4().hex[:12]}-{paths.basename(path)}"
    )


PART_PREFIX = ".part-"

# What a local disk that takes no hard links answers `os.link` (FAT, some network disks).
NO_HARD_LINKS = (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK)


def put_in_place(part: str, path: str) -> None:
    """Renames a finished part file to its name, replacing what is there (in one step on
    local disk and on gs://)."""
    rename([part], [path])


def rename(sources: list[str], targets: list[str]) -> None:
    """Renames each file of `sources` to the same place in `targets`, replacing what is
    there (remote ones in batches: on gs:// a rename is a copy and a delete)."""
    if not any(paths.is_remote(path) for path in (*sources, *targets)):
        for source, target in zip(sources, targets, strict=True):
            try:
                os.rename(source, target)
            except OSError as err:  # a failed job's, not a missing input (as Beam raised it)
                raise OSError(f"Cannot rename {source} to {target}: {err}") from err
    else:
        beam_filesystems().rename(sources, targets)


def create(path: str, mime_type: str = "application/octet-stream",
           compress: bool = False) -> BinaryIO:  # fmt: skip
    """A new file at `path` (its folder made if need be), open to write; with `compress`, one
    gzip stream of what is written, as Beam's GZIP writes it on every filesystem."""
    if paths.is_remote(path):
        kind = _beam_compression("GZIP" if compress else "UNCOMPRESSED")
        return beam_filesystems().create(path, mime_type=mime_type, compression_type=kind)
    if paths.parent(path):  # a bare name is written in the working folder
        paths.make_local_folder(paths.parent(path))
    raw = open(path, "wb", buffering=WRITE_BUFFER)
    return _Gzipped(raw) if compress else raw


# Bytes a local file gathers before each write to the system. With Python's 8 KiB, each
# record of a shard went out in a call of its own: a third more time in the kernel per
# 46 KB record than in 1 MiB writes (benchmarks/RESULTS.md, "shards written in 1 MiB").
WRITE_BUFFER = 1 << 20


class _Gzipped:
    """What is written, as one gzip stream into `raw` (closed with it): zlib's gzip framing,
    byte for byte what Beam's GZIP writes (no name, no time), so that a local file is the
    same whichever engine wrote it."""

    def __init__(self, raw: BinaryIO):
        self._raw = raw
        self._zip = zlib.compressobj(zlib.Z_DEFAULT_COMPRESSION, zlib.DEFLATED, GZIP_WBITS)

    def write(self, data: bytes) -> None:
        self._raw.write(self._zip.compress(data))

    def close(self) -> None:
        try:
            self._raw.write(self._zip.flush())
        finally:
            self._raw.close()

    def __enter__(self):
        return self

    def __exit__(self, *_) -> None:
        self.close()


GZIP_WBITS = zlib.MAX_WBITS | 16  # zlib's gzip framing


def write_bytes(path: str, data: bytes, mime_type: str = "application/octet-stream") -> None:
    """Writes a whole file: it appears under `path` complete, or not at all."""
    write_chunks(path, [data], mime_type)


def write_chunks(path: str, chunks: Iterable[bytes],
                 mime_type: str = "application/octet-stream") -> None:  # fmt: skip
    """Writes a file from its parts, as they come (never all held): under `path` complete,
    or not at all."""
    part = part_path(path)
    with create(part, mime_type) as f:
        for chunk in chunks:
            f.write(chunk)
    put_in_place(part, path)
