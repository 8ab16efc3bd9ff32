"""The output folder: checked and cleared before the job, finished as the job's last step.

`check_output` refuses an output folder that would cause trouble; `clear_leftovers` removes
what runs that were killed left; `finalise` moves what the pipeline wrote into a temporary
folder into place, and writes labels.txt and manifest.json last (a manifest means a complete
dataset). `FinaliseDataset` runs it on a worker once everything else is written, so a job
that nobody waits for (Dataflow, a template) finishes its dataset itself. It is safe to run
again, whole or after failing midway: a retried worker ends with the same files, byte for
byte. All of it runs under the output folder's claim (`claim.py`): no other conversion writes
there meanwhile.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Iterable

from beam_jobs import claim, storage, summary
from beam_jobs.config import ConvertConfig
from tfrecord_pipe._core import images, manifest, messages, naming, paths, tfds_metadata

LOG = logging.getLogger(__name__)
TEMP_PREFIX = naming.TEMP_PREFIX  # OUT/.tmp-<run>: where a run writes before finalising
# In the temporary folder:
SUMMARY_NAME = "_summary.json"  # the job's shards, counts and labels (`pipeline.WriteSummary`)
PLAN_NAME = "_finalising.json"  # the old dataset's manifest, kept for a finalise run again
NOTHING_NAME = "_nothing_written.txt"  # why there is no dataset, for the launcher to say
DONE_NAME = "_done"  # the manifest is written: only the clean-up is left


# Written beside the shards (and rejected/): the files that describe a dataset, but its
# manifest, and its duplicates' report.
_DESCRIBING = (naming.LABELS_NAME, *tfds_metadata.FILES, naming.DUPLICATES_NAME)


class NothingWrittenError(ValueError):
    """Every input was rejected: there is no dataset to finalise."""


def check_output(config: ConvertConfig, again: bool = False) -> manifest.Manifest | None:
    """Refuses an output that is a file, lies inside the input folder or holds it, already
    holds a dataset (unless overwrite was asked for), or holds files by a dataset's names
    that no dataset or run of ours explains; returns the dataset's manifest, if one is there.

    Raises:
      ValueError: the output is a file, inside the input folder or holding it, or its
        manifest.json is not a valid manifest (so the old dataset's files are unknown).
      FileExistsError: the output holds a dataset and `config.overwrite` is off, or files of
        someone else's that a dataset written there would replace or lie beside.
    """
    if problem := storage.scheme_problem(config.output, "OUT"):
        raise ValueError(problem)
    out = paths.folder(config.output)
    if config.layout != "csv" and paths.is_inside(out, config.source_root):
        if paths.is_inside(config.source_root, out):
            raise ValueError(f"OUTPUT {out} is the input folder: write the dataset to a folder "
                             "of its own, outside the images.")  # fmt: skip
        raise ValueError(
            f"{out} is inside the input folder {config.source_root}: every file there is an "
            "input, so a later run would take this dataset's shards and manifest for images "
            f"(and the folder name for a label). Write the dataset outside {config.source_root}."
        )
    if config.layout != "csv" and paths.is_inside(config.source_root, out):
        raise ValueError(
            f"{out} holds the input folder {config.source_root}: the dataset's shards and "
            "files would lie among the folders of your images. Write the dataset to a folder "
            f"of its own (a new one, or a dataset's), not one that holds {config.source_root}."
        )
    try:
        folders, files = storage.children(out)
    except NotADirectoryError as err:
        raise ValueError(f"{err}: the output must be a folder (a new one, or a dataset's).")
    old = read_manifest(out) if naming.MANIFEST_NAME in files else None
    # What a failed or killed finalise moved in is no dataset: the next run removes it.
    leftovers = _leftovers(out, folders)
    moved = [_moved_in(out, folder) for folder in leftovers]
    unfinished = {name for names in moved if names is not None for name in names}
    cannot_tell = None in moved  # a leftover that cannot be read may explain any file
    found = sorted(
        name for name in files
        if (naming.split_of(name) or name == naming.MANIFEST_NAME) and name not in unfinished
    )  # fmt: skip
    if naming.REJECTED_DIR in folders:
        _, rejected = storage.children(paths.join(out, naming.REJECTED_DIR))
        if {f"{naming.REJECTED_DIR}/{name}" for name in rejected} - unfinished:
            found.append(naming.REJECTED_DIR + "/")
    # `again`: at the finalise, under the claim the launcher's check was made under, which
    # let through files that a leftover since removed (`clear_leftovers`) could not explain.
    if found and old is None and not cannot_tell and not again:
        # No run of ours left them (where one's leftover cannot be read, they are taken for a
        # dataset's): whose? --overwrite replaced none of them, and said nothing.
        raise FileExistsError(
            f"{out} holds {messages.some(found)}, named like a dataset's files, but no "
            f"{naming.MANIFEST_NAME}: not a dataset this tool finished (one cut short by hand, "
            "or another tool's), so --overwrite would leave them among the new shards. Move "
            "them, or write the dataset to another folder."
        )
    if found and not config.overwrite and old is not None and any(
        written(folder) for folder in leftovers
    ):  # killed after its manifest, a run told "run the same command again" met the line below
        raise FileExistsError(
            f"OUTPUT {out} already holds a dataset, written whole by a run that was stopped as it "
            f"cleaned up ({naming.MANIFEST_NAME}, written last, is there): `tfrecord-pipe "
            "verify SRC OUT` proves it. Pass --overwrite to convert again."
        )
    if found and not config.overwrite:
        raise FileExistsError(
            f"OUTPUT {out} already holds a dataset (found {messages.some(found)}). "
            "Choose an empty folder, or pass --overwrite to replace it."
        )
    if not found and not again and (pictures := _images_in(out, folders, files)):
        raise FileExistsError(
            f"OUTPUT {out} holds images ({messages.some(pictures, 3)}) and no dataset: the "
            "dataset's files would lie among them, and a conversion of that folder take them "
            "for inputs. Write the dataset to a folder of its own (a new one, or a dataset's); "
            "the images to convert come first: tfrecord-pipe convert IMAGES OUT."
        )
    # No dataset, but a file of the user's by a name the dataset writes (labels.txt, most
    # likely): it was replaced without a word. A killed finalise's own are its leftovers.
    theirs = set(files) & set(_DESCRIBING) - unfinished
    if config.labels_file and paths.same_file(config.labels_file,
                                              paths.join(out, naming.LABELS_NAME)):  # fmt: skip
        theirs.discard(naming.LABELS_NAME)  # written again with the labels read from it
    theirs = sorted(theirs)
    if not found and theirs and not again:
        them = "it" if len(theirs) == 1 else "them"
        raise FileExistsError(
            f"{out} holds {messages.some(theirs)} but no dataset (no {naming.MANIFEST_NAME}): "
            f"a dataset written there would replace {them}, --overwrite too. Move {them}, or "
            "write the dataset to another folder (a new one, or a dataset's)."
        )
    return old


def dataset_in(folder: str) -> manifest.Manifest | None:
    """The manifest of a dataset this tool wrote in `folder`; None where there is none (or
    another tool's file of that name, or one that cannot be read)."""
    path = paths.join(folder, naming.MANIFEST_NAME)
    try:
        return manifest.Manifest.from_file_text(storage.read_text(path), path)
    except Exception:  # noqa: BLE001 - missing, unreadable, not ours: not a dataset
        return None


def read_manifest(folder: str) -> manifest.Manifest:
    """The manifest of a dataset folder, read through Beam's filesystems.

    Raises:
      ValueError: it is not a valid manifest; the message names the file.
    """
    path = paths.join(folder, naming.MANIFEST_NAME)
    try:
        try:
            text = storage.read_text(path)
        except UnicodeDecodeError as err:
            raise ValueError(f"{path} is not UTF-8 text ({err.reason})") from err
        return manifest.Manifest.from_file_text(text, path)
    except ValueError as err:
        raise ValueError(
            f"{err}, so the files of the dataset in that folder are unknown. Write elsewhere, "
            "or remove that dataset first."
        ) from err.__cause__


def clear_leftovers(out: str) -> list[str]:
    """Removes the temporary folders of runs that did not finish; returns them, to say so.

    Only under the output's claim: then no run that is still going owns one of them.
    """
    try:
        folders, _ = storage.children(paths.folder(out))
    except NotADirectoryError:
        return []
    out = paths.folder(out)
    leftovers = _leftovers(out, folders)
    for folder in leftovers:
        # A run killed while finalising moved some of its files in, and the manifest of the
        # dataset it replaced may be gone: only its temporary folder knows those files.
        storage.delete([paths.join(out, name) for name in _moved_in(out, folder) or ()])
        storage.delete_folder(folder)
    _, files = storage.children(out)
    parts = sorted(paths.join(out, name) for name in files if name.startswith(storage.PART_PREFIX))
    storage.delete(parts)  # a manifest being written when its run was killed
    return leftovers + parts


def _images_in(out: str, folders, files, most: int = 3) -> list[str]:
    """Up to `most` image files, by their names, of `out` (its sub-folders `folders` and
    files `files`) where it or one of its first sub-folders is a folder of images (two or
    more, half its files or more): a folder of images given as OUTPUT (two image folders in
    the wrong order) was written into in silence, its label folders among the shards. A
    project's folder with its logo.png is no such folder."""
    found = _mostly_images("", files)
    ours = {naming.REJECTED_DIR} | {name for name in folders if name.startswith(TEMP_PREFIX)}
    for folder in sorted(set(folders) - ours)[:most]:
        if len(found) >= most:
            break
        try:
            _, inside = storage.children(paths.join(out, folder))
        except OSError:  # not ours to read: not judged
            continue
        found += _mostly_images(f"{folder}/", inside)
    return found[:most]


def _mostly_images(prefix: str, names) -> list[str]:
    """The image files among `names` (prefixed), where they are two or more and half or more."""
    pictures = [prefix + name for name in sorted(names) if naming.is_image_name(name)]
    return pictures if len(pictures) >= 2 and 2 * len(pictures) >= len(names) else []


def _leftovers(out: str, folders) -> list[str]:
    """The temporary folders of runs in `out` (its sub-folders `folders`)."""
    return sorted(paths.join(out, name) for name in folders if name.startswith(TEMP_PREFIX))


def _moved_in(out: str, temp_dir: str) -> list[str] | None:
    """What a run's finalise moved into `out` and left there; None when its temporary folder
    cannot be read (damaged, or going away as that run ends): files there then count as a
    dataset's, which only --overwrite replaces, and are not deleted with the folder (a
    warning names it)."""
    try:
        return _orphans(out, temp_dir)
    except (OSError, ValueError, KeyError, TypeError) as err:  # BeamIOError is an OSError
        LOG.warning("Cannot tell what %s moved into %s: %s", temp_dir, out, err)
        return None


def began(temp_dir: str) -> bool:
    """Whether a run's finalise had begun to change the output folder."""
    return storage.exists(paths.join(temp_dir, PLAN_NAME))


def written(temp_dir: str) -> bool:
    """Whether a run's finalise wrote the manifest (only its clean-up may be left)."""
    return storage.exists(paths.join(temp_dir, DONE_NAME))


def _orphans(out: str, temp_dir: str) -> list[str]:
    """Files in `out` that a killed finalise left without a manifest to describe them: those
    of the dataset it replaced and its own (labels.txt and TensorFlow Datasets' files too,
    where no manifest is there), less what the manifest now in `out` lists."""
    if not began(temp_dir):
        return []
    named = set()
    replaced = _replaced(temp_dir)
    if replaced is not None:
        named |= set(_files_of(replaced))
    if storage.exists(paths.join(temp_dir, SUMMARY_NAME)):
        job = _read_summary(temp_dir)
        named |= {row.file for row in job.shards}
        named |= {naming.rejected_name(row.split) for row in job.counts}
        named.add(naming.DUPLICATES_NAME)
    if storage.exists(paths.join(out, naming.MANIFEST_NAME)):
        named -= set(_files_of(read_manifest(out)))
    else:  # and what it wrote before the manifest, or left of the dataset it replaced
        named |= set(_DESCRIBING)
    return sorted(name for name in named if storage.exists(paths.join(out, name)))


def _files_of(found: manifest.Manifest) -> list[str]:
    return [*_shard_files(found), *_rejected_files(found), *_duplicates_file(found)]


def finalise(
    config: ConvertConfig, temp_dir: str, version: str, run: str | None = None,
    claimed_by: str | None = None,
) -> manifest.Manifest:
    """Moves the job's outputs from `temp_dir` into the output folder; manifest.json last.

    With overwrite, the old dataset loses its manifest first, so at no moment does a manifest
    describe a mix of old and new shards; then exactly the old manifest's files that the new
    dataset does not replace are deleted, and nothing else. Run again (a retried worker), it
    picks up where it stopped and ends with the same files; run after it finished, it changes
    nothing.

    Args:
      config: the conversion's configuration (recorded in the manifest).
      temp_dir: where the pipeline wrote (`pipeline.build_pipeline`).
      version: the tfrecord-pipe version, for the manifest.
      run: the run holding the output's claim, which is given up at the end; None to leave it.
      claimed_by: the run whose claim on the output must still be held before anything there
        changes (`claim.check_held`); None where none claims it (a template's job).

    Returns:
      The manifest written.

    Raises:
      claim.ClaimLostError: the claim of `claimed_by` was taken over (that run was stopped
        for longer than the claim's lease); nothing more is changed in the output.
      NothingWrittenError: no input was listed, or every input was rejected. Nothing is
        finalised: an old dataset stays as it was, and the rejections stay in `temp_dir` for
        the user to read. The reason is also left in `temp_dir` (`nothing_written`).
    """
    out = paths.folder(config.output)
    manifest_path = paths.join(out, naming.MANIFEST_NAME)
    summary_path = paths.join(temp_dir, SUMMARY_NAME)
    finished = written(temp_dir) or (
        not storage.exists(summary_path) and storage.exists(manifest_path)
    )
    if finished:  # an earlier try wrote the manifest; its clean-up may not have ended
        _clean_up(out, temp_dir, run)
        return read_manifest(out)
    if not storage.exists(summary_path):
        _nothing_written(out, temp_dir, run, "The job's summary is missing from "
                         f"{temp_dir}: was that folder changed? Run the conversion again.")  # fmt: skip
    job = _read_summary(temp_dir)
    if not job.counts:
        _nothing_written(
            out, temp_dir, run,
            f"No record was written: no input was found under {config.source} (only empty "
            "folders, or nothing the listing could see).",
        )  # fmt: skip
    result = _manifest(config, job, version)
    if not any(info.num_examples for info in result.splits.values()):
        reasons = ", ".join(f"{k} {v}" for k, v in sorted(result.rejected_reasons.items()))
        first = _first_rejection(temp_dir)
        said = (
            f"No record was written: all {result.num_rejected} inputs were rejected "
            f"({reasons}). The reasons are in {paths.join(temp_dir, naming.REJECTED_DIR)} (the "
            f"next conversion into {out} removes it){first}."
        )
        if config.layout == "csv" and images.UNREADABLE in result.rejected_reasons:
            folder = config.source_root
            folder = folder if paths.is_remote(folder) else os.path.abspath(folder or ".")
            said += (f" The paths of a CSV list are taken from its own folder ({folder}), or "
                     "are absolute.")  # fmt: skip
            if "\\" in first:  # a list written on Windows: `images\cat\1.jpg`
                said += " A \\ is part of a file's name here: write folders with / between them."
        if set(result.rejected_reasons) == {images.UNKNOWN_LABEL} and result.labels:
            said += (f" Each line of {config.labels_file} is one whole label, as the inputs "
                     f"give it; its first line is {result.labels[0]!r}.")  # fmt: skip
        if set(result.rejected_reasons) == {images.NO_LABEL} and config.layout == "csv":
            said += (
                f" No line of {config.source} gave a label: write each as path,label[,split], "
                "comma-separated."
            )
        elif set(result.rejected_reasons) == {images.NO_LABEL}:  # a flat folder, most likely
            under = config.source if config.layout != "splits" else paths.join(
                config.source, "<split>")  # fmt: skip
            said += (
                f" No input had a label: put the images in one sub-folder per label under "
                f"{under} (cat/1.jpg, dog/2.jpg), or list them with their labels in a CSV file."
            )
        _nothing_written(out, temp_dir, run, said)
    still_held = _ClaimGuard(out, claimed_by)
    still_held(now=True)
    old = _old_dataset(config, temp_dir)
    # First: no manifest ever describes a mix, nor does TFDS's metadata (which a killed run
    # may have left without a manifest, so it goes whenever it is there).
    _delete_existing([manifest_path] + [paths.join(out, n) for n in tfds_metadata.FILES])
    moves = [(paths.join(temp_dir, file), paths.join(out, file)) for file in _shard_files(result)]
    moves += [
        (paths.join(temp_dir, name), paths.join(out, name))
        for name in (*_rejected_files(result), *_duplicates_file(result))
    ]
    paths.make_local_folder(paths.join(out, naming.REJECTED_DIR))
    _move(moves, still_held)
    if old is not None:
        replaced = {target for _, target in moves}
        stale = [
            paths.join(out, name)
            for name in (*_shard_files(old), *_rejected_files(old), *_duplicates_file(old))
            if paths.join(out, name) not in replaced
        ]
        still_held()
        _delete_existing(stale)
    still_held(now=True)
    for name, text in manifest.files_of(result):  # manifest.json last
        storage.write_bytes(paths.join(out, name), text.encode("utf-8"), mime_type="text/plain")
    storage.write_bytes(paths.join(temp_dir, DONE_NAME), b"")
    _clean_up(out, temp_dir, run)
    return result


def _clean_up(out: str, temp_dir: str, run: str | None) -> None:
    """After the manifest: the claim given up, the temporary folder removed (its summary
    first, so that a try cut short here is seen as finished)."""
    if run is not None:
        claim.give_up(out, run)
    _delete_existing([paths.join(temp_dir, SUMMARY_NAME)])
    storage.delete_folder(temp_dir)


def _first_rejection(temp_dir: str) -> str:
    """"; the first: PATH (REASON: DETAIL)" for the first line of the job's rejection lists,
    or "" when there is none to read: what most often says what went wrong for all."""
    folder = paths.join(temp_dir, naming.REJECTED_DIR)
    try:
        first = min(storage.children(folder)[1])
        row = json.loads(next(storage.read_lines(paths.join(folder, first))))
    except (ValueError, OSError, StopIteration):
        return ""
    return f"; the first: {row.get('path')} ({row.get('reason')}: {row.get('error')})"


def _nothing_written(out: str, temp_dir: str, run: str | None, said: str):
    """Raises NothingWrittenError, leaving its message for the launcher (a worker's exception
    reaches it wrapped in the runner's), and gives up the claim: the job is over."""
    storage.write_bytes(paths.join(temp_dir, NOTHING_NAME), said.encode("utf-8"))
    if run is not None:
        claim.give_up(out, run)
    raise NothingWrittenError(said)


def nothing_written(temp_dir: str) -> str | None:
    """Why a finalise found nothing to finalise, if that is why it failed."""
    path = paths.join(temp_dir, NOTHING_NAME)
    return storage.read_text(path) if storage.exists(path) else None


def _old_dataset(config: ConvertConfig, temp_dir: str) -> manifest.Manifest | None:
    """The dataset this run replaces: checked now (under the claim) and kept in temp_dir, so
    that a finalise run again, after the old manifest is gone, still knows its files."""
    if began(temp_dir):
        return _replaced(temp_dir)
    old = check_output(config, again=True)
    text = json.dumps({"old": old.to_json() if old is not None else None})
    plan = paths.join(temp_dir, PLAN_NAME)
    storage.write_bytes(plan, text.encode("utf-8"), mime_type="application/json")
    return old


def _replaced(temp_dir: str) -> manifest.Manifest | None:
    """The dataset a begun finalise replaces, as its plan kept it (None: there was none)."""
    kept = _read_json(temp_dir, PLAN_NAME)["old"]
    return manifest.Manifest.from_json(kept) if kept is not None else None


class _ClaimGuard:
    """Checks that run `run` still holds the claim on `out` (`claim.check_held`), before the
    finalise changes anything there: always when asked `now`, else when a check is older than
    CHECK_EVERY_S (the process may have been stopped in between: another run can take a claim
    over only after STALE_AFTER_S of silence). Without a run (a template's job), nothing."""

    CHECK_EVERY_S = 10.0

    def __init__(self, out: str, run: str | None):
        self._out, self._run, self._checked = out, run, -math.inf

    def __call__(self, now: bool = False) -> None:
        if self._run is None or (not now and time.time() - self._checked < self.CHECK_EVERY_S):
            return
        claim.check_held(self._out, self._run)
        self._checked = time.time()


MOVES_A_CHECK = 100  # renames between two looks at the claim (gs://: one batch of Beam's)


def _move(moves: list[tuple[str, str]], still_held=lambda now=False: None) -> None:
    """Renames each file into place; one already there (moved by an earlier try) is left.
    `still_held` is asked before each group of renames."""
    pending = [(source, target) for source, target in moves if storage.exists(source)]
    missing = [
        source for source, target in moves
        if (source, target) not in pending and not storage.exists(target)
    ]  # fmt: skip
    if missing:
        raise FileNotFoundError(
            f"{len(missing)} file(s) the job wrote are gone, e.g. {missing[0]}: was the "
            "temporary folder changed? Run the conversion again."
        )
    for start in range(0, len(pending), MOVES_A_CHECK):
        group = pending[start : start + MOVES_A_CHECK]
        still_held()
        storage.rename([source for source, _ in group], [target for _, target in group])


def _shard_files(found: manifest.Manifest) -> list[str]:
    return [file for info in found.splits.values() for file in info.all_files]


def _duplicates_file(found: manifest.Manifest) -> list[str]:
    return [naming.DUPLICATES_NAME] if found.duplicates.get("groups") else []


def _rejected_files(found: manifest.Manifest) -> list[str]:
    """The rejected-inputs files of a dataset: one per split with rejections."""
    return [naming.rejected_name(split) for split, info in found.splits.items() if info.rejected]


def _delete_existing(files: list[str]) -> None:
    storage.delete([path for path in files if storage.exists(path)])


def _read_summary(temp_dir: str) -> summary.Summary:
    return summary.Summary.from_json(storage.read_text(paths.join(temp_dir, SUMMARY_NAME)))


def _read_json(temp_dir: str, name: str) -> dict:
    return json.loads(storage.read_text(paths.join(temp_dir, name)))


def _manifest(config: ConvertConfig, written: summary.Summary, version: str) -> manifest.Manifest:
    """The manifest of the job's summary: per split, its shards and counts."""
    splits, reasons = {}, {}
    records = {(split, label): n for split, label, n in written.label_counts}
    for split in sorted({row.split for row in written.counts}, key=naming.split_order):
        rows = [row for row in written.counts if row.split == split]
        for row in rows:
            if row.reason is not None:
                reasons[row.reason] = reasons.get(row.reason, 0) + row.n
        mine = sorted((s for s in written.shards if s.split == split), key=lambda s: s.index)
        by_format = {
            file_format: [s for s in mine if s.file_format == file_format]
            for file_format in naming.FILE_FORMATS
        }
        counted = next((shards for shards in by_format.values() if shards), [])
        splits[split] = manifest.SplitInfo(
            num_examples=sum(s.count for s in counted),
            shard_lengths=tuple(s.count for s in counted),
            num_bytes=sum(s.bytes for s in mine),
            listed=sum(row.n for row in rows if row.reason is None),
            rejected=sum(row.n for row in rows if row.reason is not None),
            files=tuple(s.file for s in by_format[naming.TFRECORD]),
            array_record_files=tuple(s.file for s in by_format[naming.ARRAY_RECORD]),
            shard_digests=tuple(s.digest for s in counted) if all(s.digest for s in counted)
            else (),
            label_counts=tuple(records.get((split, label), 0) for label in written.labels)
            if records else (),
            file_bytes=tuple(s.bytes for f in naming.FILE_FORMATS for s in by_format[f]),
        )
    return manifest.Manifest(
        labels=written.labels,
        label_offset=config.label_offset,
        compression=naming.GZIP if config.compress else "",
        splits=splits,
        rejected_reasons=reasons,
        conversion=config.to_record(),
        tool_version=version,
        duplicates=dict(written.duplicates),
    )


def stray_files(dataset: str, found: manifest.Manifest) -> list[str]:
    """The files in the dataset's folder named like a shard, or matched by a split's pattern
    (`train-*`), that the manifest does not list, said: a reader of that pattern, TFDS's or
    ours, would read them as part of the dataset. And the folders such a pattern matches,
    which it cannot read. (verify reports them; a conversion warns of them.)"""
    listed = {name for info in found.splits.values() for name in info.all_files}
    try:
        folders, names = storage.children(dataset)
    except Exception as err:  # noqa: BLE001 - any filesystem's error: said, not fatal
        return [f"{dataset} cannot be listed: {messages.one_line(err)}"]
    splits = sorted(found.splits)

    def matched(name: str) -> str | None:  # the split whose pattern `{split}-*` reads `name`
        return next((split for split in splits if name.startswith(f"{split}-")), None)

    problems = []
    for name in sorted(folders):
        if split := matched(name):
            problems.append(f"{name}/: a folder, which the pattern {split}-* of split {split} "
                            "matches (a reader of that pattern fails on it)")  # fmt: skip
    for name in sorted(set(names) - listed):
        if (split := naming.split_of(name)) is not None:
            problems.append(f"{name}: named like a shard of split {split}, but the manifest does "
                            "not list it (a file pattern would read it as part of the dataset)")  # fmt: skip
        elif split := matched(name):
            # train-copy.tfrecord, a shard's .bak: read as records by the pattern `train-*`
            problems.append(f"{name}: the pattern {split}-* of split {split} reads it as part of "
                            "the dataset, but the manifest does not list it")  # fmt: skip
    return problems


def summary_line(result: manifest.Manifest, out: str, seconds: float,
                 also: Iterable[str] = ()) -> str:  # fmt: skip
    """`Converted into OUT in 5.1 s: train: 98 in 2 shards; ...; 1 rejected (truncated 1).`
    (the formats after OUT where they are not TFRecord alone), then a `WARNING:` line for
    each of the dataset's warnings (`Manifest.warnings`), and for each of `also` (what the
    launcher found beside it)."""
    parts = [
        f"{name}: {info.num_examples} in {messages.counted(len(info.shard_lengths), 'shard')}"
        for name, info in result.splits.items()
    ]
    rejected = f"{result.num_rejected} rejected"
    if result.rejected_reasons:
        reasons = sorted(result.rejected_reasons.items())
        rejected += " (" + ", ".join(f"{k} {v}" for k, v in reasons) + ")"
    formats = result.file_formats
    files = "" if formats == (naming.TFRECORD,) else (
        " (" + " and ".join(f".{f}" for f in formats) + " files)")  # fmt: skip
    line = (f"Converted into {out}{files} in {seconds:.1f} s: " + "; ".join(parts)
            + f"; {rejected}.")  # fmt: skip
    warnings = [*result.warnings(out), *also]
    return "\n".join([line, *(f"WARNING: {warning}" for warning in warnings)])


def splits_gone(result: manifest.Manifest, replaced: manifest.Manifest | None) -> list[str]:
    """What to say of the splits of the dataset replaced that the new one lacks: the tour's
    `--overwrite` to add a format, with `--validation_fraction` left out, lost validation
    without a word (a new user's trial), and evaluation then had nothing to read."""
    if replaced is None:
        return []
    gone = [name for name, info in replaced.splits.items()
            if info.num_examples and name not in result.splits]  # fmt: skip
    if not gone:
        return []
    fraction = replaced.conversion.get("validation_fraction")
    given = result.conversion.get("validation_fraction")
    again = (f" (it was converted with --validation_fraction {fraction}: give it again)"
             if naming.VALIDATION in gone and fraction and not given else "")  # fmt: skip
    return [
        "the dataset this replaced had split(s) "
        + ", ".join(f"{name} ({replaced.splits[name].num_examples} records)" for name in gone)
        + f", which this one has not{again}."
    ]
