"""Every file under an input folder, each once, with what is wrong with it if it cannot be read.

One function for the conversion job and `verify`, so that both see the same inputs:

- Paths are literal: "[", "*" and "?" in a folder's name are characters, not patterns.
- Symlinks are followed, to files and to folders. A folder is listed once: a link to a folder
  listed already (a cycle, a second link, a link to a folder inside the input folder) is one
  entry that says so. A file reached through a link and also directly, or through two links,
  is listed once; its other paths are entries that name the one kept.
- Nothing is dropped: a broken link, a FIFO, a device, a folder that cannot be opened is an
  entry with its problem, which the job rejects with that reason, without reading it.

Local folders are walked with os.scandir, one folder's names in memory at a time; gs:// is
listed a page at a time (google-cloud-storage), other filesystems whole through Beam's; there
are no links or special files there.
"""

from __future__ import annotations

import collections
import dataclasses
import errno
import os
import stat
import tempfile
from collections.abc import Iterator

from tfrecord_pipe._core import images, paths

UNREADABLE, NOT_A_FILE, DUPLICATE = images.UNREADABLE, images.NOT_A_FILE, images.DUPLICATE
GCS_PAGE = 1000  # objects a gs:// listing request gives (GCS's most)


@dataclasses.dataclass(frozen=True)
class Entry:
    """One listed path.

    Attributes:
      path: where to read it.
      relpath: its path below the listed folder, "/"-separated.
      problem: (reason code, detail) when it cannot be an input; None when it can.
    """

    path: str
    relpath: str
    problem: tuple[str, str] | None = None


def walk(root: str, output: str | None = None) -> Iterator[Entry]:
    """The entries under the folder `root` (local or remote), in a deterministic order.

    Raises:
      ValueError: a link under the local `root` leads to the folder `output` or into it: the
        listing would take the dataset's own files for inputs.
    """
    if paths.is_remote(root):
        yield from _walk_remote(paths.folder(root))
    else:
        yield from _Walk(paths.folder(root), output).entries()


def matching_below(folder: str) -> list:
    """Beam's metadata of every object below the remote `folder`, taken literally.

    Beam's patterns cannot quote "[", "*" or "?": the listing asks for everything that starts
    like `folder` up to the first of them, and keeps what lies below `folder` itself.
    """
    from beam_jobs import storage  # storage lists with this module

    below = paths.folder(folder) + "/"
    cut = min((below.index(char) for char in "[*?" if char in below), default=len(below))
    found = storage.beam_filesystems().match([below[:cut] + "**"])[0].metadata_list
    return [meta for meta in found if meta.path.startswith(below)]


def _walk_remote(root: str) -> Iterator[Entry]:
    # Folder markers (empty objects named "images/daisy/", which the Cloud console makes for
    # "Create folder") are folders, not inputs.
    if root.startswith("gs://"):
        # Streamed a page at a time (GCS lists in name order): ten million objects listed
        # whole would hold gigabytes.
        from beam_jobs import storage  # storage lists with this module

        import google.api_core.exceptions
        import google.auth.exceptions

        bucket, _, prefix = root[len("gs://") :].partition("/")
        prefix = f"{prefix}/" if prefix else ""
        blobs = storage.gcs_client().list_blobs(bucket, prefix=prefix, page_size=GCS_PAGE,
                                                retry=storage.gcs_retry())  # fmt: skip
        try:
            for blob in blobs:  # a page is fetched when the one before is used up
                if not blob.name.endswith("/"):
                    yield Entry(f"gs://{bucket}/{blob.name}", blob.name[len(prefix) :])
        except (google.api_core.exceptions.GoogleAPIError,
                google.auth.exceptions.GoogleAuthError) as err:  # fmt: skip
            # As Beam's listing said it (an OSError): a storage failure, not bad input.
            raise OSError(f"Listing {root} failed: {type(err).__name__}: {err}") from err
        return
    for meta in sorted(matching_below(root), key=lambda meta: meta.path):
        if not meta.path.endswith("/"):
            yield Entry(meta.path, meta.path[len(root) + 1 :])


class _Walk:
    """A walk of a local folder: first every path without a link in it, then the folders that
    links lead to (so a path without links is the one kept for a file reached both ways)."""

    def __init__(self, root: str, output: str | None = None):
        self._root = root
        self._real_root = os.path.realpath(root)
        # Where the dataset is written (a folder inside the root is refused before listing).
        local = output is not None and not paths.is_remote(output)
        self._output = os.path.realpath(output) if local else None
        # Where the job's own temporary files lie (a folder inside the root is refused before
        # listing, `sources.resolve_layout`).
        self._temp = os.path.realpath(tempfile.gettempdir())
        self._folders: dict[tuple[int, int], str] = {}  # (device, inode) -> relpath listed
        self._linked_files: dict[str, str] = {}  # real path -> relpath kept
        self._linked_folders = collections.deque()  # (path, relpath) of links to folders

    def entries(self) -> Iterator[Entry]:
        yield from self._folder(self._root, "", through_link=False)
        while self._linked_folders:
            path, relpath = self._linked_folders.popleft()
            yield from self._folder(path, relpath, through_link=True)

    def _not_into_our_folders(self, path: str) -> None:
        """Refuses a linked folder that is the output folder, holds it or lies inside it, or
        that holds the temporary folder: the listing would take the job's own files for
        inputs. (One inside the temporary folder is not refused: images kept in /tmp.)"""
        real = os.path.realpath(path)
        if self._output is not None and os.path.commonpath((real, self._output)) in (
            real, self._output
        ):  # (both real)
            raise ValueError(
                f"{path} in the input folder is a link to {real}, which holds the output folder "
                f"{self._output} or lies inside it: the listing would take the dataset's own "
                "files for inputs. Write the dataset elsewhere, or remove the link."
            )
        if os.path.commonpath((real, self._temp)) == real:
            raise ValueError(
                f"{path} in the input folder is a link to {real}, which holds the temporary "
                f"folder {self._temp} (TMPDIR): the listing would take the job's own temporary "
                "files for inputs. Set TMPDIR to another folder, or remove the link."
            )

    def _folder(self, path: str, relpath: str, through_link: bool) -> Iterator[Entry]:
        try:
            info = os.stat(path)
        except OSError as err:
            yield Entry(path, relpath, problem=(UNREADABLE, f"cannot open the folder: {err}"))
            return
        key = (info.st_dev, info.st_ino)
        if key in self._folders:
            seen = self._folders[key] or "the input folder itself"
            yield Entry(path, relpath, problem=(
                DUPLICATE, f"a link to a folder listed already ({seen}); not followed again"
            ))  # fmt: skip
            return
        self._folders[key] = relpath
        try:
            children = sorted(os.scandir(path), key=lambda child: child.name)
        except OSError as err:
            yield Entry(path, relpath, problem=(UNREADABLE, f"cannot list the folder: {err}"))
            return
        for child in children:
            child_relpath = f"{relpath}/{child.name}" if relpath else child.name
            yield from self._child(child, child_relpath, through_link)

    def _child(self, child: os.DirEntry, relpath: str, through_link: bool) -> Iterator[Entry]:
        is_link = child.is_symlink()
        if not is_link and child.is_file(follow_symlinks=False):
            # The folder's listing says so on most filesystems: no stat (a system call an
            # input, in the launcher). The reader checks the file again when it opens it.
            yield self._linked_file(child.path, relpath) if through_link else Entry(child.path, relpath)
            return
        try:
            info = child.stat()  # follows links
        except OSError as err:
            detail = _link_problem(child.path, err) if is_link else str(err)
            yield Entry(child.path, relpath, problem=(UNREADABLE, detail))
            return
        if stat.S_ISDIR(info.st_mode):
            if is_link:  # after every path without links; refused at once if it must be
                self._not_into_our_folders(child.path)
                self._linked_folders.append((child.path, relpath))
            else:
                yield from self._folder(child.path, relpath, through_link)
        elif not stat.S_ISREG(info.st_mode):
            kind = _kind(info.st_mode)
            yield Entry(child.path, relpath, problem=(
                NOT_A_FILE, f"a {kind}, not a regular file: not read"
            ))  # fmt: skip
        elif is_link or through_link:
            yield self._linked_file(child.path, relpath)
        else:
            yield Entry(child.path, relpath)

    def _linked_file(self, path: str, relpath: str) -> Entry:
        """A file reached through a link: kept, unless its real path is listed already."""
        real = os.path.realpath(path)
        if paths.is_inside(real, self._real_root):
            direct = os.path.relpath(real, self._real_root).replace(os.sep, "/")
            return Entry(path, relpath, problem=(
                DUPLICATE, f"the same file as {direct} (through a symlink); {direct} is kept"
            ))  # fmt: skip
        kept = self._linked_files.setdefault(real, relpath)
        if kept != relpath:
            return Entry(path, relpath, problem=(
                DUPLICATE, f"the same file as {kept} (both links to {real}); {kept} is kept"
            ))  # fmt: skip
        return Entry(path, relpath)


def _kind(mode: int) -> str:
    kinds = ((stat.S_ISFIFO, "FIFO"), (stat.S_ISSOCK, "socket"), (stat.S_ISCHR, "character device"),
             (stat.S_ISBLK, "block device"))  # fmt: skip
    return next((name for test, name in kinds if test(mode)), "special file")


def _link_problem(path: str, err: OSError) -> str:
    """What is wrong with the symlink at `path`, which `err` stopped from being followed."""
    target = os.readlink(path)
    if err.errno == errno.ELOOP:
        return f"a symlink to {target!r} in a loop of links: not read"
    if err.errno in (errno.ENOENT, errno.ENOTDIR):
        return f"a broken symlink to {target!r}"
    return f"a symlink to {target!r}, which cannot be followed: {err}"
