"""The conversion job's options: our flags, Beam's, and the pipeline options they make.

Our flags become a `ConvertConfig` (`config_from_args`); every other flag must be Beam's
(`check_beam_flags`: Beam itself would drop a misspelt one with a warning). Beam is imported
only when Beam's flags are given: without them the job runs on the local engine, which needs
no Beam, and its import costs most of a CPU-second.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import logging
import math
import os
import shutil
import sys
import tempfile
from typing import TYPE_CHECKING

from beam_jobs import worker_wheel
from beam_jobs.config import CSV_HEADERS, LAYOUTS, ConvertConfig
from tfrecord_pipe._core import arguments, help_format, images

if TYPE_CHECKING:
    from apache_beam.options.pipeline_options import PipelineOptions

LOCAL_RUNNER = "FnApiRunner"  # what DirectRunner runs on; naming it skips the Prism attempt
_WHEEL_FOLDER = "tfrecord-pipe-wheel-"
_POLICY = images.ImagePolicy  # its class attributes are the defaults


def make_parser(prog: str = "python -m beam_jobs.convert") -> argparse.ArgumentParser:
    """Our flags; their defaults are ConvertConfig's and ImagePolicy's."""
    parser = help_format.Parser(
        prog=prog,
        description="Convert image folders or CSV lists into sharded TFRecords. "
        "Without --runner it runs here, a worker process per core; --runner DataflowRunner "
        "runs it on Dataflow (--runner DirectRunner: the Beam pipeline, here). "
        "Flags not listed here go to Beam (--runner, --project, --region, ...).",
        allow_abbrev=False,  # --num_shard is a typo to report, not --num_shards
        formatter_class=help_format.HelpFormatter,
    )
    add = parser.add_argument
    add("source", nargs="?", help="image folder, folder of split folders, or CSV (local or gs://)")
    add("output", nargs="?", help="dataset folder to write (local or gs://)")
    # As flags too: a Flex Template passes every parameter as --name=value.
    add("--source", dest="source_flag", metavar="SOURCE", help="SOURCE, given as a flag")
    add("--output", dest="output_flag", metavar="OUTPUT", help="OUTPUT, given as a flag")
    add("--layout", default=ConvertConfig.layout, choices=LAYOUTS,
        help="how SRC is organised; auto: split folders if every folder in SRC is named "
        "like a split (train, validation, test; val, valid, dev, eval, test1 beside one of "
        "those), label folders if none is named train, validation or test, else an error "
        "saying which")
    add("--csv_header", default=ConvertConfig.csv_header, choices=CSV_HEADERS,
        help="whether the CSV's first line is a header; auto: when its path cell is a plain "
        "name, no '/' or '.', that names no existing file")
    add("--validation_fraction", type=float, default=ConvertConfig.validation_fraction,
        help="share of inputs for validation, of label folders and of CSV lines without a "
        "split (refused with split folders)")
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
    add("--compress", action="store_true",
        help="write GZIP-compressed TFRecord shards (zstd-compressed ArrayRecord ones)")
    add("--formats", default=",".join(ConvertConfig.formats),
        help="shard file formats, comma-separated: tfrecord (tf.data), array_record (Grain, "
        "TFDS data sources), or both: the same records in the same shards")
    add("--overwrite", action="store_true", help="replace a dataset in OUTPUT")
    add("--dedupe", action="store_true",
        help="of inputs with the same bytes, keep the first by path and reject the others as "
        "duplicate_content (without it they are all written, and listed in duplicates.jsonl)")
    add("--no_wait", action="store_true",
        help="launch the job (Dataflow) and return: its last step finalises OUTPUT, and gives "
        "up the claim on it; check the result with `tfrecord-pipe verify`")
    add("--verbose", action="store_true", help="also show Beam's own log lines")
    return parser


def parse(parser: argparse.ArgumentParser, argv) -> tuple[argparse.Namespace, list[str]]:
    """(our options, Beam's flags) of a command line; SOURCE and OUTPUT given either way, and
    switches also as `--compress=true` / `=false` (a Flex Template passes every parameter as
    --name=value); paths with `~` expanded, as everywhere (`arguments.home_expanded`)."""
    as_given = _as_given(parser, argv)
    args, beam_args = parser.parse_known_args(as_given)
    for name in ("source", "output"):
        given, flag = getattr(args, name), getattr(args, f"{name}_flag")
        if given is not None and flag is not None:
            raise ValueError(f"{name.upper()} is given twice ({given}, and --{name} {flag}).")
        if given is None and flag is None:
            # `convert -photos out`: argparse took the path for a flag it does not know.
            dashed = next((arg for arg in beam_args if arg[:1] == "-" and arg[:2] != "--"), None)
            raise ValueError(
                f"No {name.upper()}: give SOURCE and OUTPUT (or --source and --output)."
                + (f" {dashed} was read as a flag: give a path that starts with '-' as "
                   f"./{dashed}, or after --." if dashed else "")
            )  # fmt: skip
        value = given if given is not None else flag
        if not value.strip():  # "" named no folder, and a message about it showed nothing
            what = "an image folder or a CSV list" if name == "source" else "a folder"
            raise ValueError(f"{name.upper()} is empty: give {what} (local or gs://).")
        setattr(args, name, arguments.home_expanded(value))
    if args.labels_file:
        args.labels_file = arguments.home_expanded(args.labels_file)
    end = as_given.index("--") if "--" in as_given else len(as_given)
    if args.num_shards is not None and any(
        arg.partition("=")[0] == "--shard_mb" for arg in as_given[:end]
    ):  # (it was ignored, in silence)
        raise ValueError("--num_shards and --shard_mb both given: --shard_mb only chooses the "
                         "number of shards where --num_shards does not. Give one of them.")
    return args, beam_args


def _as_given(parser: argparse.ArgumentParser, argv) -> list[str]:
    """The command line as argparse reads it: our flags spelt with dashes
    (`--validation-fraction`, as most tools spell them) in the spelling they are defined
    with, and switches given a value (`--compress=true`) as switches; Beam's flags, and
    everything after `--`, left as they are."""
    ours = help_format.flags_of(parser)
    switches = {
        flag for action in parser._actions if isinstance(action, argparse._StoreTrueAction)
        for flag in action.option_strings
    }  # fmt: skip
    given = list(sys.argv[1:] if argv is None else argv)
    end = given.index("--") if "--" in given else len(given)
    out = []
    for arg in given[:end]:
        flag, equals, value = arg.partition("=")
        if flag.startswith("--") and (spelt := "--" + flag[2:].replace("-", "_")) in ours:
            flag, arg = spelt, spelt + equals + value
        if flag in switches and equals:
            if value.lower() not in ("true", "false"):
                raise ValueError(f"{flag} takes true or false, got {value!r}")
            out += [flag] if value.lower() == "true" else []
        else:
            out.append(arg)
    return out + given[end:]


def config_from_args(args: argparse.Namespace) -> ConvertConfig:
    """The configuration of a command line's options.

    Raises:
      ValueError: an option out of range, said with its flag (`--max_side must be ...`).
    """
    for flag in ("shard_mb", "max_file_mb"):
        value = getattr(args, flag)
        if not math.isfinite(value) or value * (1 << 20) < 1:  # (not a byte: said in bytes)
            raise ValueError(f"--{flag} must be a positive number of MiB, a byte or more, "
                             f"got {value}")  # fmt: skip
    try:
        return _config(args)
    except arguments.Invalid as err:
        raise ValueError(as_flags(err, make_parser())) from None


def as_flags(refusal: arguments.Invalid, parser: argparse.ArgumentParser) -> str:
    """A refusal of ConvertConfig or ImagePolicy in a command line's words: each problem names
    its flag (`--max_side must be ...`) where its field has one, not the class the user never
    typed ("Invalid ImagePolicy: max_side must be ...")."""
    ours = help_format.flags_of(parser)
    said = [f"--{problem}" if "--" + problem.split(" ", 1)[0] in ours else problem
            for problem in refusal.problems]  # fmt: skip
    return f"Invalid option{'s' if len(said) > 1 else ''}: " + "; ".join(said)


def _config(args: argparse.Namespace) -> ConvertConfig:
    return ConvertConfig(
        source=args.source, output=args.output, layout=args.layout, csv_header=args.csv_header,
        validation_fraction=args.validation_fraction, labels_file=args.labels_file,
        label_offset=args.label_offset, num_shards=args.num_shards,
        shard_bytes=int(args.shard_mb * (1 << 20)), compress=args.compress,
        formats=tuple(f.strip() for f in args.formats.split(",") if f.strip()),
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
    config = config_from_args(argparse.Namespace(**{**defaults, **known}))
    # 0.1 re-encoded images without their colour profiles.
    policy = dataclasses.replace(config.policy, keep_icc_profile=False)
    return dataclasses.replace(config, policy=policy)


def check_beam_flags(beam_args: list[str], parser: argparse.ArgumentParser,
                     whose: str = "the converter's") -> None:  # fmt: skip
    """Raises ValueError for a flag that is neither ours (`parser`'s, `whose`) nor Beam's,
    naming the closest.

    Beam itself only logs a warning and drops it: `--validaton_fraction 0.2` would write a
    dataset without the validation split.
    """
    ours = help_format.flags_of(parser)
    given = [arg.split("=", 1)[0] for arg in beam_args if not _is_number(arg)]
    if not any(flag.startswith("-") and flag not in ours for flag in given):
        return  # nothing to look up in Beam's flags (which imports Beam)
    known = ours | _beam_flags()
    for flag in given:
        if flag.startswith("-") and flag not in known:
            names = sorted(name.lstrip("-") for name in known)
            import difflib  # only for a flag mistyped

            close = difflib.get_close_matches(flag.lstrip("-").lower(), names, n=1, cutoff=0.75)
            hint = f" Did you mean --{close[0]}?" if close else ""
            raise ValueError(
                f"Unknown flag {flag}: it is neither {whose} nor Beam's.{hint} "
                f"(--help lists {whose} flags.)"
            )


def _is_number(word: str) -> bool:
    """A value such as `-1`, never a flag's name (`--direct_num_workers -1`)."""
    try:
        float(word)
    except ValueError:
        return False
    return True


def stray_words(beam_args: list[str]) -> list[str]:
    """The words among Beam's flags that are no flag's value: a third path (a shell pattern
    that matched several folders, `convert data/* out`), a value whose flag was left out.
    Beam dropped them with a warning, and the job ran on what was left. Beam is imported only
    to tell a switch from a flag that takes a value, where a word follows a flag."""

    def takes_value(flag: str) -> bool:
        return flag.startswith("-") and "=" not in flag and flag not in beam_switches()

    return [word for before, word in zip(["", *beam_args], beam_args)
            if (_is_number(word) or not word.startswith("-")) and not takes_value(before)]  # fmt: skip


def _beam_flags() -> frozenset[str]:
    """Every flag of Beam's pipeline options (the runners' and Dataflow's included)."""
    return frozenset(flag for flags in _beam_options().values() for flag in flags)


def beam_switches() -> frozenset[str]:
    """Beam's flags that take no value (`--save_main_session`)."""
    return frozenset(flag for switch, flags in _beam_options().items() if switch for flag in flags)


@functools.cache
def _beam_options() -> dict[bool, frozenset[str]]:
    """Beam's flags, by whether they take no value."""
    from apache_beam.options.pipeline_options import PipelineOptions

    def subclasses(cls):
        for sub in cls.__subclasses__():
            yield sub
            yield from subclasses(sub)

    flags = {True: set(), False: set()}
    for options in set(subclasses(PipelineOptions)):
        parser = argparse.ArgumentParser(add_help=False, conflict_handler="resolve")
        options._add_argparse_args(parser)
        for action in parser._actions:
            flags[action.nargs == 0].update(action.option_strings)
    return {switch: frozenset(names) for switch, names in flags.items()}


def pipeline_options(
    beam_args: list[str],
    save_main_session: bool,
    worker_extras: tuple[str, ...] = worker_wheel.WORKER_EXTRAS,
) -> PipelineOptions:
    """Beam options; locally, the FnApiRunner (one in-process worker unless the user chose;
    used when Beam's runner was asked for: see `uses_local_engine`).
    Remote workers get a wheel of this project with the dependencies of `worker_extras`."""
    from apache_beam.options.pipeline_options import PipelineOptions, SetupOptions, StandardOptions

    options = PipelineOptions(beam_args)
    standard = options.view_as(StandardOptions)
    if runs_here(options):
        standard.runner = LOCAL_RUNNER
    elif not worker_wheel.user_packaged(beam_args):
        # Remote workers need our package; ship a wheel of it unless the user chose a way.
        folder = tempfile.mkdtemp(prefix=_WHEEL_FOLDER)
        wheel = worker_wheel.build_wheel(folder, worker_extras)
        options.view_as(SetupOptions).extra_packages = [str(wheel)]
    # Our DoFns live in an importable package, so workers need nothing from __main__; keeping
    # the option lets a user's own script that wraps run() pickle its globals.
    options.view_as(SetupOptions).save_main_session = save_main_session
    return options


@dataclasses.dataclass(frozen=True)
class Launch:
    """Where the job runs, as Beam's flags say.

    Attributes:
      here: on this machine (Beam's local runner, or the local engine).
      local_engine: on the local engine (`uses_local_engine`).
      template: where Dataflow's template is to be written, if that is what was asked for.
    """

    here: bool = True
    local_engine: bool = True
    template: str | None = None


def launch_of(beam_args: list[str]) -> Launch:
    """Where the job runs, from Beam's flags: with none, on the local engine, and Beam is not
    imported.

    Raises:
      ValueError: as `runs_here`.
    """
    if not beam_args:
        return Launch()
    from apache_beam.options.pipeline_options import GoogleCloudOptions, PipelineOptions

    given = PipelineOptions(beam_args)
    here = runs_here(given)
    return Launch(here, here and uses_local_engine(given),
                  given.view_as(GoogleCloudOptions).template_location)  # fmt: skip


def runs_here(options: PipelineOptions) -> bool:
    """Whether the runner is Beam's local one (named as Beam accepts it, in any case).

    Raises:
      ValueError: a runner that cannot run the job (UNSUPPORTED_RUNNERS), saying why; a
        negative number of local workers.
    """
    from apache_beam.options.pipeline_options import DirectOptions, StandardOptions

    workers = options.view_as(DirectOptions).direct_num_workers
    if workers < 0:  # Beam's runner failed on it with an IndexError
        raise ValueError(f"--direct_num_workers {workers}: give how many workers Beam's local "
                         "runner runs (0: one per core).")  # fmt: skip
    runner = options.view_as(StandardOptions).runner
    name = (runner or "").rsplit(".", 1)[-1].lower()
    if name in UNSUPPORTED_RUNNERS:
        raise ValueError(f"--runner {runner} cannot run this job: {UNSUPPORTED_RUNNERS[name]}")
    return runner is None or runner.lower() in ("direct", "directrunner", LOCAL_RUNNER.lower())


def uses_local_engine(options: PipelineOptions) -> bool:
    """Whether the job runs on the local engine (`local_engine.py`): when no runner was
    named and none of the options of Beam's local runner (--direct_...) was changed. Naming
    Beam's (`--runner DirectRunner`) runs the Beam pipeline here, as Dataflow would run it."""
    given = options.get_all_options(drop_default=True)
    return given.get("runner") is None and not any(name.startswith("direct_") for name in given)


# Runners tried that cannot run the job, and why (docs/conversion.md, "More than one process").
UNSUPPORTED_RUNNERS = {
    "daskrunner": (
        "Beam's Dask runner (2.77) gives every consumer of a step with several outputs all of "
        "that step's outputs, and computes only the branch behind the last step, so the job "
        "would fail or lose outputs. On one machine use several local worker processes "
        "(--direct_running_mode=multi_processing --direct_num_workers=N); on many, Dataflow."
    ),
}


def remove_wheel(options: PipelineOptions) -> None:
    """The wheel `pipeline_options` built, once the job has staged it."""
    from apache_beam.options.pipeline_options import SetupOptions

    for wheel in options.view_as(SetupOptions).extra_packages or ():
        folder = os.path.dirname(wheel)
        if os.path.basename(folder).startswith(_WHEEL_FOLDER):
            shutil.rmtree(folder, ignore_errors=True)


def local_load_threads(options: PipelineOptions) -> int:
    """Threads for each LoadImages: a core each when the job runs as one in-process worker.

    That is the local default: Beam's in-memory mode hands elements between steps without
    encoding them for gRPC, which made it faster than Beam's worker threads
    (`--direct_running_mode=multi_threading`; benchmarks/RESULTS.md, "Conversion: local
    runner"); worker processes (`multi_processing`) each start a Beam SDK harness first.
    Anything else the user chose keeps one thread per worker.
    """
    from apache_beam.options.pipeline_options import DirectOptions

    direct = options.view_as(DirectOptions)
    one_worker = direct.direct_running_mode == "in_memory" and direct.direct_num_workers == 1
    return (os.cpu_count() or 1) if one_worker else 1


# Where Beam logs a failed step's traceback (in-process runner, and SDK workers), and where
# the local engine logs a worker's.
BEAM_FAILURE_LOGGERS = ("apache_beam.runners.common", "apache_beam.runners.worker.sdk_worker",
                        "beam_jobs.local_engine")  # fmt: skip


# Where Beam relays its worker processes' log lines (`multi_processing`), as raw protobuf text.
BEAM_WORKER_RELAY = "apache_beam.runners.portability.local_job_service"


def _not_worker_start_chatter(record: logging.LogRecord) -> bool:
    """False for the warning every Beam worker process logs as it starts, which says nothing a
    user can act on ("No semi_persistent_directory found")."""
    return "No semi_persistent_directory found" not in record.getMessage()


@contextlib.contextmanager
def beam_logging(verbose: bool):
    """Beam's INFO lines are worker chatter, not progress (the progress line is ours); a failed
    step's traceback, which Beam logs before it stops, is said in one line by our error. The
    levels are put back after the run, for a program that runs other pipelines."""
    levels = {"apache_beam": logging.INFO if verbose else logging.WARNING}
    levels.update({name: logging.NOTSET if verbose else logging.CRITICAL
                   for name in BEAM_FAILURE_LOGGERS})  # fmt: skip
    before = {name: logging.getLogger(name).level for name in levels}
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level)
    relay = logging.getLogger(BEAM_WORKER_RELAY)
    if not verbose:
        relay.addFilter(_not_worker_start_chatter)
    try:
        yield
    finally:
        relay.removeFilter(_not_worker_start_chatter)
        for name, level in before.items():
            logging.getLogger(name).setLevel(level)
