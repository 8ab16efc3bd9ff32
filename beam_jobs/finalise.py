"""The output folder: checked before the job, finished after it.

`check_output` refuses an output folder that would cause trouble; `finalise` moves what the
pipeline wrote into a temporary folder into place, and writes labels.txt and manifest.json
last (a manifest means a complete dataset).
"""

from __future__ import annotations

import json
import shutil

from apache_beam.io.filesystems import FileSystems

from beam_jobs import pipeline, storage
from beam_jobs.config import ConvertConfig
from tfrecord_pipe.core import manifest, naming, paths


def check_output(config: ConvertConfig) -> None:
    """Refuses an output folder inside the input folder, or one that already holds a dataset
    (unless overwrite was asked for).

    Raises:
      ValueError: the output is inside the input folder.
      FileExistsError: the output holds a dataset and `config.overwrite` is off.
    """
    out = paths.folder(config.output)
    if config.layout != "csv" and paths.is_inside(out, config.source_root):
        raise ValueError(
            f"{out} is inside the input folder {config.source_root}: every file there is an "
            "input, so a later run would take this dataset's shards and manifest for images "
            f"(and the folder name for a label). Write the dataset outside {config.source_root}."
        )
    existing = [
        pattern for pattern in (
            paths.join(out, naming.MANIFEST_NAME),
            paths.join(out, "*.tfrecord*"),
            paths.join(out, naming.REJECTED_DIR, "*"),
        ) if storage.exists(pattern)
    ]  # fmt: skip
    if existing and not config.overwrite:
        raise FileExistsError(
            f"{out} already holds a dataset (found {', '.join(existing)}). "
            "Choose an empty folder, or pass --overwrite to replace it."
        )


def finalise(config: ConvertConfig, temp_dir: str, version: str) -> manifest.Manifest:
    """Moves the job's outputs from `temp_dir` into the output folder; manifest.json last.

    Old datasets (with overwrite) lose their manifest first, so at no moment does a manifest
    describe a mix of old and new shards.

    Args:
      config: the conversion's configuration (recorded in the manifest).
      temp_dir: where the pipeline wrote (`pipeline.build_pipeline`).
      version: the tfrecord-pipe version, for the manifest.

    Returns:
      The manifest written.
    """
    out = paths.folder(config.output)
    result = _manifest(config, _read_summary(temp_dir), version)
    if config.overwrite:
        storage.delete_matching(paths.join(out, naming.MANIFEST_NAME))
        storage.delete_matching(paths.join(out, "*.tfrecord*"))
        storage.delete_matching(paths.join(out, naming.REJECTED_DIR, "*"))
    moves = [
        (paths.join(temp_dir, file), paths.join(out, file))
        for info in result.splits.values()
        for file in info.files
    ]
    for path in storage.matching(paths.join(temp_dir, naming.REJECTED_DIR, "*")):
        name = paths.basename(path)
        moves.append((path, paths.join(out, naming.REJECTED_DIR, name)))
    if moves:
        paths.make_local_folder(paths.join(out, naming.REJECTED_DIR))
        FileSystems.rename([source for source, _ in moves], [target for _, target in moves])
    for name, text in manifest.files_of(result):  # manifest.json last
        storage.write_bytes(paths.join(out, name), text.encode("utf-8"), mime_type="text/plain")
    storage.delete_matching(paths.join(temp_dir, "**"))
    if not paths.is_remote(temp_dir):
        shutil.rmtree(temp_dir, ignore_errors=True)
    return result


def _read_summary(temp_dir: str) -> dict:
    with FileSystems.open(paths.join(temp_dir, pipeline.SUMMARY_NAME)) as f:
        return json.loads(f.read().decode("utf-8"))


def _manifest(config: ConvertConfig, summary: dict, version: str) -> manifest.Manifest:
    """The manifest of the job's summary: per split, its shards and counts."""
    shards, counts = summary["shards"], summary["counts"]
    (labels,) = summary["labels"] or [[]]
    splits, reasons = {}, {}
    for split in sorted({row["split"] for row in counts}, key=naming.split_order):
        rows = [r for r in counts if r["split"] == split]
        listed = sum(r["n"] for r in rows if r["what"] == "listed")
        rejected = sum(r["n"] for r in rows if r["what"].startswith("rejected:"))
        for r in rows:
            if r["what"].startswith("rejected:"):
                reason = r["what"].split(":", 1)[1]
                reasons[reason] = reasons.get(reason, 0) + r["n"]
        mine = sorted((s for s in shards if s["split"] == split), key=lambda s: s["index"])
        splits[split] = manifest.SplitInfo(
            num_examples=sum(s["count"] for s in mine),
            shard_lengths=tuple(s["count"] for s in mine),
            num_bytes=sum(s["bytes"] for s in mine),
            listed=listed,
            rejected=rejected,
            files=tuple(s["file"] for s in mine),
        )
    return manifest.Manifest(
        labels=tuple(labels),
        label_offset=config.label_offset,
        compression=naming.GZIP if config.compress else "",
        splits=splits,
        rejected_reasons=reasons,
        conversion=config.to_record(),
        tool_version=version,
    )


def summary_line(result: manifest.Manifest, out: str, seconds: float) -> str:
    """`Converted into OUT in 5.1 s: train: 98 in 2 shards; ...; 1 rejected (truncated 1).`"""
    parts = [
        f"{name}: {info.num_examples} in {len(info.files)} shards"
        for name, info in result.splits.items()
    ]
    rejected = f"{result.num_rejected} rejected"
    if result.rejected_reasons:
        reasons = sorted(result.rejected_reasons.items())
        rejected += " (" + ", ".join(f"{k} {v}" for k, v in reasons) + ")"
    return f"Converted into {out} in {seconds:.1f} s: " + "; ".join(parts) + f"; {rejected}."
