"""The conversion job: image folders or CSV lists into balanced, deterministic TFRecord shards.

Outputs, in OUT:
  train-00000-of-000NN.tfrecord ...      shards (".tfrecord.gz" with --compress)
  validation-00000-of-000MM.tfrecord ...
  rejected/rejected-SPLIT.jsonl          one line per input that could not be used, with reason
  labels.txt, manifest.json              written last: a manifest means a complete dataset

Inputs (SRC):
  a folder whose sub-folders are labels       flowers/daisy/1.jpg
  a folder of split folders                   flowers/train/daisy/1.jpg, flowers/validation/...
  a CSV of `path,label` or `path,label,split` lines (paths relative to the CSV, or absolute)

Run locally (no cloud account; uses every core):
  python -m beam_jobs.convert SRC OUT [--validation_fraction 0.1] [--compress]

Run on Dataflow (the usual Beam flags pass through):
  python -m beam_jobs.convert gs://bucket/images gs://bucket/dataset \\
      --runner DataflowRunner --project P --region R --temp_location gs://bucket/tmp
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import os
import posixpath
import sys
import tempfile
import time
import uuid

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import (
    DirectOptions,
    GoogleCloudOptions,
    PipelineOptions,
    SetupOptions,
    StandardOptions,
)

from beam_jobs import packaging, progress, sharding
from beam_jobs.config import ConvertConfig
from beam_jobs.load import BATCH, LoadImages
from beam_jobs.shards import WriteShards
from beam_jobs.sources import SPLITS, TRAIN, DropDuplicatePaths, ListSources
from tfrecord_pipe import images, manifest, schema

LOG = logging.getLogger("beam_jobs.convert")

LOCAL_RUNNER = "FnApiRunner"  # what DirectRunner runs on; naming it skips the Prism attempt


class CollectLabels(beam.PTransform):
    """The label list: from the labels file when given, else the sorted distinct labels seen.

    At most one element, a tuple; none when no input has a label.
    """

    def __init__(self, fixed_labels: tuple[str, ...] | None):
        super().__init__()
        self._fixed = fixed_labels

    def expand(self, sources):
        if self._fixed is not None:
            return sources.pipeline | "FixedLabels" >> beam.Create([self._fixed])
        return (
            sources
            | "Labels" >> beam.FlatMap(lambda s: [s.label] if s.label is not None else [])
            | "SortedSet" >> beam.CombineGlobally(SortedSet()).without_defaults()
        )


class SortedSet(beam.CombineFn):
    """The distinct values as a sorted tuple (each worker sends its set, not every value)."""

    def create_accumulator(self):
        return set()

    def add_input(self, accumulator, value):
        accumulator.add(value)
        return accumulator

    def merge_accumulators(self, accumulators):
        return set().union(*accumulators)

    def extract_output(self, accumulator):
        return tuple(sorted(accumulator))


class WriteRejected(beam.PTransform):
    """One `rejected-<split>.jsonl` per split with rejections, lines sorted by path.

    Sorted, so that re-runs write the same files. Rejections are few next to the inputs;
    one worker per split writes them (Beam's text sink would cost four more stages here).
    """

    def __init__(self, folder: str):
        super().__init__()
        self._folder = folder

    def expand(self, rejected):
        folder = self._folder
        return (
            rejected
            | "BySplit" >> beam.Map(
                lambda row: (row["split"], (row["path"], json.dumps(row, sort_keys=True)))
            )
            | "PerSplit" >> beam.GroupByKey()
            | "WriteJsonl" >> beam.MapTuple(
                lambda split, rows: _write_lines(
                    posixpath.join(folder, f"rejected-{split}.jsonl"),
                    [line for _, line in sorted(rows)],
                )
            )
        )


def _write_lines(path: str, lines: list[str]) -> None:
    with FileSystems.create(path, mime_type="application/x-ndjson") as f:
        for line in lines:
            f.write(line.encode("utf-8") + b"\n")


SUMMARY_NAME = "_summary.json"  # in the temp folder: shards, counts and labels, for finalize()


class WriteSummary(beam.PTransform):
    """Writes the job's small results (shard infos, counts, the label list) as one JSON file.

    A few hundred rows at most, so one worker writes them; one file instead of three text
    sinks also spares a dozen pipeline stages, each with a fixed start-up cost. The rows are
    gathered under one key rather than with `ToList`, whose empty-input branch costs two more
    stages: there is always a row (every job lists at least one input).
    """

    def __init__(self, path: str):
        super().__init__()
        self._path = path

    def expand(self, parts):
        shards, counts, labels = parts
        path = self._path
        return (
            (
                shards | "TagShard" >> beam.Map(lambda row: ("shards", row)),
                counts | "TagCount" >> beam.Map(lambda row: ("counts", row)),
                labels | "TagLabels" >> beam.Map(lambda row: ("labels", list(row))),
            )
            | "Rows" >> beam.Flatten()
            | "OneKey" >> beam.Map(lambda row: (None, row))
            | "AllRows" >> beam.GroupByKey()
            | "WriteJson" >> beam.MapTuple(lambda _, rows: _write_summary(path, rows))
        )


def _write_summary(path: str, rows) -> None:
    summary = {"shards": [], "counts": [], "labels": []}
    for kind, row in rows:
        summary[kind].append(row)
    summary["shards"].sort(key=lambda s: (s["split"], s["index"]))
    summary["counts"].sort(key=lambda c: (c["split"], c["what"]))
    with FileSystems.create(path, mime_type="application/json") as f:
        f.write(json.dumps(summary, sort_keys=True).encode("utf-8"))


def build_pipeline(pipeline: beam.Pipeline, config: ConvertConfig, temp_dir: str,
                   fixed_labels: tuple[str, ...] | None, progress_dir: str | None = None,
                   load_threads: int = 1) -> None:
    """Adds the conversion's steps to `pipeline`; outputs land in `temp_dir` for finalize().

    `progress_dir` and `load_threads` are for local runs: where LoadImages reports its counts
    for the progress line, and how many threads each LoadImages instance checks inputs on.
    """
    listed = pipeline | "List" >> ListSources(config)
    duplicates = ()
    if config.layout == "csv":
        # Grouping by path also spreads the lines over workers. Labels come from the lines
        # kept: a label only a dropped duplicate gives is no label of the dataset.
        deduplicated = listed | "DropDuplicatePaths" >> DropDuplicatePaths()
        sources, duplicates = deduplicated.sources, (deduplicated[DropDuplicatePaths.REJECTED],)
        labels = sources | "CollectLabels" >> CollectLabels(fixed_labels)
    else:
        # Folder listings cannot name a file twice. Labels are collected in the listing's
        # own step, so no step reads the whole spread listing just for them.
        labels = listed | "CollectLabels" >> CollectLabels(fixed_labels)
        sources = listed | "Spread" >> beam.Reshuffle()
    loaded = (
        sources
        | "Batch" >> beam.BatchElements(min_batch_size=BATCH, max_batch_size=BATCH)
        | "LoadImages" >> beam.ParDo(
            LoadImages(config.policy, config.label_offset, progress_dir, load_threads),
            labels=beam.pvalue.AsSingleton(labels, default_value=()),
        ).with_outputs(LoadImages.REJECTED, main="records")
    )
    shards = loaded.records | "WriteShards" >> WriteShards(config, temp_dir)
    rejected = (*duplicates, loaded[LoadImages.REJECTED]) | "AllRejected" >> beam.Flatten()

    counts = (
        (
            listed | "ListedPerSplit" >> beam.Map(lambda s: ((s.split, "listed"), 1)),
            rejected
            | "RejectedPerReason" >> beam.Map(lambda r: ((r["split"], "rejected:" + r["reason"]), 1)),
        )
        | "AllCounts" >> beam.Flatten()
        | "SumCounts" >> beam.CombinePerKey(sum)
        | "CountRows" >> beam.MapTuple(lambda key, n: {"split": key[0], "what": key[1], "n": n})
    )
    _ = (shards, counts, labels) | "Summary" >> WriteSummary(posixpath.join(temp_dir, SUMMARY_NAME))
    _ = rejected | "WriteRejected" >> WriteRejected(posixpath.join(temp_dir, manifest.REJECTED_DIR))


# ---------------------------------------------------------------------------------------------
# Launch-time checks and finalisation (run on the launching machine, before and after the job).


def _exists(pattern: str) -> bool:
    try:
        return bool(FileSystems.match([pattern], limits=[1])[0].metadata_list)
    except Exception:  # a pattern that matches nothing raises on some filesystems
        return False


def resolve_layout(config: ConvertConfig) -> ConvertConfig:
    """Fills in layout="auto" by looking at the source, and checks the source exists."""
    if config.source.lower().endswith(".csv"):
        if not FileSystems.exists(config.source):
            raise FileNotFoundError(f"CSV list {config.source} does not exist.")
        return dataclasses.replace(config, layout="csv")
    root = config.source.rstrip("/")
    if not _exists(root + "/**"):
        raise FileNotFoundError(
            f"No files found under {root}. Give a folder whose sub-folders are labels "
            "(SRC/daisy/1.jpg), a folder of split folders (SRC/train/daisy/1.jpg), or a CSV file."
        )
    if config.layout != "auto":
        return config
    has_splits = _exists(posixpath.join(root, TRAIN, "**"))
    return dataclasses.replace(config, layout="splits" if has_splits else "labels")


def _inside(path: str, folder: str) -> bool:
    """Whether `path` is `folder` or below it (local paths resolved first)."""
    if "://" not in path and "://" not in folder:
        path, folder = os.path.realpath(path), os.path.realpath(folder)
    path, folder = path.rstrip("/"), folder.rstrip("/")
    return path == folder or path.startswith(folder + "/")


def check_output(config: ConvertConfig) -> None:
    """Refuses an output folder inside the input folder, or one that already holds a dataset
    (unless overwrite was asked for)."""
    out = config.output.rstrip("/")
    if config.layout != "csv" and _inside(out, config.source_root):
        raise ValueError(
            f"{out} is inside the input folder {config.source_root}: every file there is an "
            "input, so a later run would take this dataset's shards and manifest for images "
            f"(and the folder name for a label). Write the dataset outside {config.source_root}."
        )
    existing = [
        pattern for pattern in (
            posixpath.join(out, manifest.MANIFEST_NAME),
            posixpath.join(out, "*.tfrecord*"),
            posixpath.join(out, manifest.REJECTED_DIR, "*"),
        ) if _exists(pattern)
    ]
    if existing and not config.overwrite:
        raise FileExistsError(
            f"{out} already holds a dataset (found {', '.join(existing)}). "
            "Choose an empty folder, or pass --overwrite to replace it."
        )


def _read_labels(path: str) -> tuple[str, ...]:
    if not FileSystems.exists(path):
        raise FileNotFoundError(f"Labels file {path} does not exist.")
    with FileSystems.open(path) as f:
        return manifest.parse_labels(f.read().decode("utf-8"), path)


def _read_summary(temp_dir: str) -> dict:
    with FileSystems.open(posixpath.join(temp_dir, SUMMARY_NAME)) as f:
        return json.loads(f.read().decode("utf-8"))


def _delete_matching(pattern: str) -> None:
    paths = [m.path for m in FileSystems.match([pattern])[0].metadata_list]
    if paths:
        FileSystems.delete(paths)


def finalize(config: ConvertConfig, temp_dir: str, options: dict, version: str) -> manifest.Manifest:
    """Moves the job's outputs from `temp_dir` into the output folder; manifest.json last.

    Old datasets (with overwrite) lose their manifest first, so at no moment does a manifest
    describe a mix of old and new shards.
    """
    out = config.output.rstrip("/")
    summary = _read_summary(temp_dir)
    shards, counts = summary["shards"], summary["counts"]
    (labels,) = summary["labels"] or [[]]

    split_names = sorted({row["split"] for row in counts}, key=_split_order)
    splits, reasons = {}, {}
    for split in split_names:
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
    result = manifest.Manifest(
        labels=tuple(labels), label_offset=config.label_offset,
        compression="GZIP" if config.compress else "", splits=splits,
        rejected_reasons=reasons, options=options, tool_version=version,
    )

    if config.overwrite:
        _delete_matching(posixpath.join(out, manifest.MANIFEST_NAME))
        _delete_matching(posixpath.join(out, "*.tfrecord*"))
        _delete_matching(posixpath.join(out, manifest.REJECTED_DIR, "*"))
    moves = [(posixpath.join(temp_dir, s["file"]), posixpath.join(out, s["file"])) for s in shards]
    rejected_files = FileSystems.match(
        [posixpath.join(temp_dir, manifest.REJECTED_DIR, "*")]
    )[0].metadata_list
    for meta in rejected_files:
        name = posixpath.basename(meta.path)
        moves.append((meta.path, posixpath.join(out, manifest.REJECTED_DIR, name)))
    if moves:
        if not out.startswith("gs://"):
            os.makedirs(posixpath.join(out, manifest.REJECTED_DIR), exist_ok=True)
        FileSystems.rename([m[0] for m in moves], [m[1] for m in moves])
    for name, text in manifest.files_of(result):  # manifest.json last
        with FileSystems.create(posixpath.join(out, name), mime_type="text/plain") as f:
            f.write(text.encode("utf-8"))
    _delete_matching(posixpath.join(temp_dir, "**"))
    if not temp_dir.startswith("gs://"):
        import shutil
        shutil.rmtree(temp_dir, ignore_errors=True)
    return result


def _split_order(name: str):
    return (SPLITS.index(name) if name in SPLITS else len(SPLITS), name)


def summary_line(result: manifest.Manifest, out: str, seconds: float) -> str:
    parts = [f"{name}: {info.num_examples} in {len(info.files)} shards"
             for name, info in result.splits.items()]
    rejected = f"{result.num_rejected} rejected"
    if result.rejected_reasons:
        rejected += " (" + ", ".join(f"{k} {v}" for k, v in sorted(result.rejected_reasons.items())) + ")"
    return f"Converted into {out} in {seconds:.1f} s: " + "; ".join(parts) + f"; {rejected}."


# ---------------------------------------------------------------------------------------------
# Entry point.


def make_parser(prog: str = "python -m beam_jobs.convert") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Convert image folders or CSV lists into sharded TFRecords. "
        "Flags not listed here go to Beam (--runner, --project, --region, ...).",
    )
    parser.add_argument("source", help="image folder, folder of split folders, or CSV (local or gs://)")
    parser.add_argument("output", help="dataset folder to write (local or gs://)")
    parser.add_argument("--layout", default="auto", choices=["auto", "labels", "splits", "csv"],
                        help="how SRC is organised (default: detect)")
    parser.add_argument("--validation_fraction", type=float, default=0.0,
                        help="share of inputs for validation when SRC does not split (default 0)")
    parser.add_argument("--labels_file", help="label order, one per line (default: sorted names)")
    parser.add_argument("--label_offset", type=int, default=schema.DEFAULT_LABEL_OFFSET,
                        help="added to label indices (default 1, as Cloud TPU models expect)")
    parser.add_argument("--num_shards", type=int, help="shards per split (default: ~128 MiB each)")
    parser.add_argument("--shard_mb", type=float, default=sharding.DEFAULT_SHARD_BYTES / (1 << 20),
                        help="target shard size in MiB when --num_shards is not given")
    parser.add_argument("--max_side", type=int, help="downscale images larger than this (pixels)")
    parser.add_argument("--max_pixels", type=int, default=images.DEFAULT_MAX_PIXELS,
                        help="reject images with more pixels (decompression-bomb guard)")
    parser.add_argument("--jpeg_quality", type=int, default=95, help="quality of re-encoded JPEGs")
    parser.add_argument("--reject_other_formats", action="store_true",
                        help="reject PNG/GIF/WebP/BMP/TIFF instead of re-encoding them")
    parser.add_argument("--compress", action="store_true", help="write GZIP-compressed shards")
    parser.add_argument("--overwrite", action="store_true", help="replace a dataset in OUTPUT")
    return parser


def config_from_args(args: argparse.Namespace) -> ConvertConfig:
    return ConvertConfig(
        source=args.source, output=args.output, layout=args.layout,
        validation_fraction=args.validation_fraction, labels_file=args.labels_file,
        label_offset=args.label_offset, num_shards=args.num_shards,
        shard_bytes=int(args.shard_mb * (1 << 20)), compress=args.compress,
        overwrite=args.overwrite,
        policy=images.ImagePolicy(
            max_side=args.max_side, jpeg_quality=args.jpeg_quality, max_pixels=args.max_pixels,
            allow_other_formats=not args.reject_other_formats,
        ),
    )


def pipeline_options(beam_args: list[str], save_main_session: bool) -> PipelineOptions:
    """Beam options; locally, the FnApiRunner (one in-process worker unless the user chose)."""
    options = PipelineOptions(beam_args)
    standard = options.view_as(StandardOptions)
    if standard.runner in (None, "DirectRunner"):
        standard.runner = LOCAL_RUNNER
    elif not packaging.user_packaged(beam_args):
        # Remote workers need our package; ship a wheel of it unless the user chose a way.
        wheel = packaging.build_wheel(tempfile.mkdtemp(prefix="tfrecord-pipe-wheel-"))
        options.view_as(SetupOptions).extra_packages = [str(wheel)]
    # Our DoFns live in an importable package, so workers need nothing from __main__; keeping
    # the option lets a user's own script that wraps run() pickle its globals.
    options.view_as(SetupOptions).save_main_session = save_main_session
    return options


def local_load_threads(options: PipelineOptions) -> int:
    """Threads for each LoadImages: a core each when the job runs as one in-process worker.

    That is the local default: Beam's in-memory mode hands elements between steps without
    encoding them for gRPC. Measured on 2 cores (medians of 3-5 runs, 1000/4000/8000 images):
    1.16/2.67/4.98 s, against 1.45/2.79/5.21 s for two worker threads
    (`--direct_running_mode=multi_threading`); worker processes (`multi_processing`) each
    start a Beam SDK harness first. Anything else the user chose keeps one thread per worker.
    """
    direct = options.view_as(DirectOptions)
    one_worker = direct.direct_running_mode == "in_memory" and direct.direct_num_workers == 1
    return (os.cpu_count() or 1) if one_worker else 1


def run(argv: list[str] | None = None, save_main_session: bool = True,
        prog: str = "python -m beam_jobs.convert") -> manifest.Manifest | None:
    """Runs the conversion; returns the manifest written (None when only a template was written).

    Raises:
      ValueError, FileNotFoundError, FileExistsError: bad options, caught before the job starts.
    """
    from tfrecord_pipe import __version__

    args, beam_args = make_parser(prog).parse_known_args(argv)
    config = resolve_layout(config_from_args(args))
    check_output(config)
    fixed_labels = _read_labels(config.labels_file) if config.labels_file else None
    options = pipeline_options(beam_args, save_main_session)

    temp_dir = posixpath.join(config.output.rstrip("/"), f".tmp-{uuid.uuid4().hex[:12]}")
    started = time.monotonic()
    LOG.info("Converting %s (%s layout) into %s", config.source, config.layout, config.output)
    local = options.view_as(StandardOptions).runner == LOCAL_RUNNER
    with tempfile.TemporaryDirectory(prefix="tfrecord-pipe-progress-") as progress_dir:
        shown = progress.ProgressLine(progress_dir) if local else contextlib.nullcontext()
        with shown, beam.Pipeline(options=options) as pipeline:
            build_pipeline(
                pipeline, config, temp_dir, fixed_labels,
                progress_dir if local else None, local_load_threads(options) if local else 1,
            )  # fmt: skip
    template = options.view_as(GoogleCloudOptions).template_location
    if template:  # nothing ran: the template runs later, and finalising is the caller's part
        print(f"Dataflow template written to {template}; nothing was converted yet.", flush=True)
        return None
    recorded = dict(vars(args))
    result = finalize(config, temp_dir, recorded, __version__)
    print(summary_line(result, config.output, time.monotonic() - started), flush=True)
    return result


def main(argv: list[str] | None = None, prog: str = "python -m beam_jobs.convert") -> int:
    """Command-line entry: exit 0 on success, 2 with a one-line error for bad input."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("apache_beam").setLevel(logging.WARNING)  # worker chatter, not progress
    try:
        run(argv, prog=prog)
    except (ValueError, FileNotFoundError, FileExistsError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
