"""The conversion job's launcher: image folders or CSV lists into balanced, deterministic
TFRecord shards. It checks the options, runs the pipeline (`pipeline.py`) and finalises the
output folder (`finalise.py`).

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
import difflib
import functools
import logging
import math
import os
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

import tfrecord_pipe
from beam_jobs import claim, finalise, packaging, pipeline, sources, worker_progress
from beam_jobs.config import CSV_HEADERS, LAYOUTS, ConvertConfig
from tfrecord_pipe.core import help_format, images, manifest, paths

LOG = logging.getLogger("beam_jobs.convert")

LOCAL_RUNNER = "FnApiRunner"  # what DirectRunner runs on; naming it skips the Prism attempt
_POLICY = images.ImagePolicy  # its class attributes are the defaults


def make_parser(prog: str = "python -m beam_jobs.convert") -> argparse.ArgumentParser:
    """Our flags; their defaults are ConvertConfig's and ImagePolicy's."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Convert image folders or CSV lists into sharded TFRecords. "
        "Flags not listed here go to Beam (--runner, --project, --region, ...).",
        allow_abbrev=False,  # --num_shard is a typo to report, not --num_shards
        formatter_class=help_format.HelpFormatter,
    )
    add = parser.add_argument
    add("source", help="image folder, folder of split folders, or CSV (local or gs://)")
    add("output", help="dataset folder to write (local or gs://)")
    add("--layout", default=ConvertConfig.layout, choices=LAYOUTS,
        help="how SRC is organised; auto: split folders if every folder in SRC is named "
        "train, validation or test, label folders if none is, else an error saying which")
    add("--csv_header", default=ConvertConfig.csv_header, choices=CSV_HEADERS,
        help="whether the CSV's first line is a header; auto: when its path cell is a plain "
        "name, no '/' or '.', that names no existing file")
    add("--validation_fraction", type=float, default=ConvertConfig.validation_fraction,
        help="share of inputs for validation when SRC does not split")
    add("--labels_file", help="label order, one per line (default: sorted names)")
    add("--label_offset", type=int, default=ConvertConfig.label_offset,
        help="added to label indices (1: index 0 is 'background', as Cloud TPU models expect)")
    add("--num_shards", type=int,
        help="shards per split (default: the least multiple of 64 within --shard_mb each, at "
        "most one per record, so that up to 64 hosts read files of their own)")
    add("--shard_mb", type=float, default=ConvertConfig.shard_bytes / (1 << 20),
        help="largest shard size in MiB when --num_shards is not given")
    add("--max_side", type=int, default=_POLICY.max_side,
        help="downscale images whose longer side is larger (pixels; default: keep sizes)")
    add("--max_pixels", type=int, default=_POLICY.max_pixels,
        help="reject images with more pixels (decompression-bomb guard)")
    add("--jpeg_quality", type=int, default=_POLICY.jpeg_quality,
        help="quality of re-encoded JPEGs")
    add("--max_file_mb", type=float, default=_POLICY.max_file_bytes / (1 << 20),
        help="reject input files larger than this (MiB), without reading them")
    add("--reject_other_formats", action="store_true",
        help="reject PNG/GIF/WebP/BMP/TIFF instead of re-encoding them")
    add("--compress", action="store_true", help="write GZIP-compressed shards")
    add("--overwrite", action="store_true", help="replace a dataset in OUTPUT")
    add("--dedupe", action="store_true",
        help="of inputs with the same bytes, keep the first by path and reject the others as "
        "duplicate_content (without it they are all written, and listed in duplicates.jsonl)")
    add("--verbose", action="store_true", help="also show Beam's own log lines")
    return parser


def config_from_args(args: argparse.Namespace) -> ConvertConfig:
    for flag in ("shard_mb", "max_file_mb"):
        value = getattr(args, flag)
        if not math.isfinite(value) or value <= 0:
            raise ValueError(f"--{flag} must be a positive number of MiB, got {value}")
    return ConvertConfig(
        source=args.source, output=args.output, layout=args.layout, csv_header=args.csv_header,
        validation_fraction=args.validation_fraction, labels_file=args.labels_file,
        label_offset=args.label_offset, num_shards=args.num_shards,
        shard_bytes=int(args.shard_mb * (1 << 20)), compress=args.compress,
        overwrite=args.overwrite, dedupe=args.dedupe,
        policy=images.ImagePolicy(
            max_side=args.max_side, jpeg_quality=args.jpeg_quality, max_pixels=args.max_pixels,
            allow_other_formats=not args.reject_other_formats,
            max_file_bytes=int(args.max_file_mb * (1 << 20)),
        ),
    )  # fmt: skip


def recorded_config(record: dict) -> ConvertConfig:
    """The configuration a manifest recorded: ConvertConfig.to_record's, or the command-line
    flags that manifests of tfrecord-pipe 0.1 held ({"flags": ...}).

    Raises:
      ValueError: the record is not one of these.
    """
    if "flags" not in record:
        return ConvertConfig.from_record(record)
    flags = record["flags"]
    defaults = vars(make_parser().parse_args([flags.get("source", ""), flags.get("output", "")]))
    known = {name: value for name, value in flags.items() if name in defaults}
    return config_from_args(argparse.Namespace(**{**defaults, **known}))


def check_beam_flags(beam_args: list[str], parser: argparse.ArgumentParser) -> None:
    """Raises ValueError for a flag that is neither ours nor Beam's, naming the closest.

    Beam itself only logs a warning and drops it: `--validaton_fraction 0.2` would write a
    dataset without the validation split.
    """
    ours = [flag for action in parser._actions for flag in action.option_strings]
    known = set(ours) | _beam_flags()
    for arg in beam_args:
        flag = arg.split("=", 1)[0]
        if flag.startswith("-") and flag not in known:
            names = sorted(name.lstrip("-") for name in known)
            close = difflib.get_close_matches(flag.lstrip("-"), names, n=1, cutoff=0.75)
            hint = f" Did you mean --{close[0]}?" if close else ""
            raise ValueError(
                f"Unknown flag {flag}: it is neither the converter's nor Beam's.{hint} "
                "(--help lists the converter's flags.)"
            )


@functools.cache
def _beam_flags() -> frozenset[str]:
    """Every flag of Beam's pipeline options (the runners' and Dataflow's included)."""

    def subclasses(cls):
        for sub in cls.__subclasses__():
            yield sub
            yield from subclasses(sub)

    flags = set()
    for options in set(subclasses(PipelineOptions)):
        parser = argparse.ArgumentParser(add_help=False, conflict_handler="resolve")
        options._add_argparse_args(parser)
        flags.update(flag for action in parser._actions for flag in action.option_strings)
    return frozenset(flags)


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
    encoding them for gRPC, which made it faster than Beam's worker threads
    (`--direct_running_mode=multi_threading`; benchmarks/RESULTS.md, "Conversion: local
    runner"); worker processes (`multi_processing`) each start a Beam SDK harness first.
    Anything else the user chose keeps one thread per worker.
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
    parser = make_parser(prog)
    args, beam_args = parser.parse_known_args(argv)
    check_beam_flags(beam_args, parser)
    # Beam's INFO lines are worker chatter, not progress (the progress line is ours).
    logging.getLogger("apache_beam").setLevel(logging.INFO if args.verbose else logging.WARNING)
    with _cloud_errors_said_plainly(f"{args.source} or {args.output}"):
        config = sources.resolve_layout(config_from_args(args))
        finalise.check_output(config)
        fixed_labels = _read_labels(config.labels_file) if config.labels_file else None
    options = pipeline_options(beam_args, save_main_session)
    template = options.view_as(GoogleCloudOptions).template_location
    temp_dir = paths.join(config.output, f"{finalise.TEMP_PREFIX}{uuid.uuid4().hex[:12]}")
    started = time.monotonic()
    # A template writes nothing into the output now: no claim to hold.
    with contextlib.nullcontext() if template else claim.Claim(config.output) as held:
        if held is not None:
            _clear_under_claim(config, held)
        LOG.info("Converting %s (%s layout) into %s", config.source, config.layout, config.output)
        try:
            _run_pipeline(config, options, temp_dir, fixed_labels)
        except (ValueError, FileNotFoundError, FileExistsError):
            raise  # bad input found while listing: its message says what to do
        except Exception as err:
            raise JobFailedError(
                f"The conversion job failed ({type(err).__name__}: {_first_line(err)}). Nothing "
                f"was finalised: {config.output} has no new manifest. Run it again; what this "
                "run left is removed then."
            ) from err
        if template:  # nothing ran: the template runs later, and finalising is the caller's part
            print(f"Dataflow template written to {template}; nothing was converted yet.", flush=True)
            return None
        result = finalise.finalise(config, temp_dir, tfrecord_pipe.__version__)
    print(finalise.summary_line(result, config.output, time.monotonic() - started), flush=True)
    return result


@contextlib.contextmanager
def _cloud_errors_said_plainly(what: str):
    """Google Cloud client errors before the job (no network, no access, retries given up) as
    one line: the client libraries' own tracebacks run to pages."""
    from google.api_core import exceptions as cloud

    try:
        yield
    except cloud.GoogleAPIError as err:
        raise ConnectionError(f"Cannot reach {what}: {_first_line(err)}") from err


class JobFailedError(RuntimeError):
    """The job itself failed (storage, workers): nothing was finalised."""


def _first_line(err: Exception) -> str:
    text = str(err).strip()
    return (text.splitlines()[0] if text else "")[:500]


def _clear_under_claim(config: ConvertConfig, held: claim.Claim) -> None:
    """Under the output's claim: checks it again, and removes what killed runs left."""
    if held.taken_over is not None:
        LOG.warning("Took over the claim on %s of %s, which had stopped renewing it.",
                    config.output, held.taken_over)  # fmt: skip
    finalise.check_output(config)  # what is there now, that no other run can change
    removed = finalise.clear_leftovers(config.output)
    if removed:
        LOG.warning("Removed %d temporary folder(s) left by runs that did not finish: %s",
                    len(removed), ", ".join(removed))  # fmt: skip


def _run_pipeline(config, options, temp_dir, fixed_labels) -> None:
    """Runs the conversion's pipeline; locally, with a progress line summed over workers."""
    local = options.view_as(StandardOptions).runner == LOCAL_RUNNER
    with tempfile.TemporaryDirectory(prefix="tfrecord-pipe-progress-") as progress_dir:
        shown = worker_progress.ProgressLine(progress_dir) if local else contextlib.nullcontext()
        with shown, beam.Pipeline(options=options) as job:
            pipeline.build_pipeline(
                job, config, temp_dir, fixed_labels,
                progress_dir if local else None, local_load_threads(options) if local else 1,
            )  # fmt: skip


def _read_labels(path: str) -> tuple[str, ...]:
    if not FileSystems.exists(path):
        raise FileNotFoundError(f"Labels file {path} does not exist.")
    with FileSystems.open(path) as f:
        data = f.read()
    try:
        return manifest.parse_labels(data.decode("utf-8-sig"), path)
    except UnicodeDecodeError as err:
        raise ValueError(
            f"Labels file {path} is not UTF-8 text (byte {err.start + 1}: {err.reason}). Save "
            "it as UTF-8, one label per line."
        ) from None


def main(argv: list[str] | None = None, prog: str = "python -m beam_jobs.convert") -> int:
    """Command-line entry: exit 0 on success, 2 with a one-line error for bad input, 1 with one
    for a job that failed (the storage, the workers)."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        run(argv, prog=prog)
    except (ValueError, FileNotFoundError, FileExistsError, ConnectionError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except JobFailedError as err:
        LOG.debug("The job's own error", exc_info=err.__cause__)
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
