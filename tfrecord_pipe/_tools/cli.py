"""The `tfrecord-pipe` command.

  convert SRC OUT [options] [Beam flags]   run the Beam conversion job (beam_jobs.convert)
  inspect PATH [--grid FILE.png]           what a dataset holds, with histograms and a picture
  verify SRC OUT [--decode] [Beam flags]   prove nothing was lost or changed (with Beam
                                           flags: as a Beam pipeline, e.g. on Dataflow)
  bench PATH                               the reader's images/s next to the decode ceiling

Exit codes: 0 success; 1 `verify` or `inspect --check` found problems, or a conversion or
verify itself failed (its Beam job, the storage, a worker); 2 bad input (a missing path, a
folder that is not a dataset, ...), with one line on stderr saying what to do; 130
interrupted (Ctrl-C).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile

from tfrecord_pipe._core import arguments, crops, extras, help_format, messages, naming, paths, program_exit
from tfrecord_pipe._reading import tensorflow_start

EXIT_OK, EXIT_PROBLEMS, EXIT_BAD_INPUT = 0, 1, 2
EXIT_INTERRUPTED = program_exit.INTERRUPTED
EXIT_BROKEN_PIPE = 141  # as a shell says of a command killed by SIGPIPE


def _parser() -> argparse.ArgumentParser:
    parser = help_format.Parser(
        prog="tfrecord-pipe",
        description="Image folders to sharded TFRecords, and TPU-ready input pipelines.",
        formatter_class=help_format.HelpFormatter,
        epilog="""examples:
  tfrecord-pipe convert flowers/ dataset/ --validation_fraction 0.1
  tfrecord-pipe inspect dataset/ --grid sample.png
  tfrecord-pipe verify flowers/ dataset/
  tfrecord-pipe bench dataset/ --batch_size 256

Paths may be local or gs://. Run `tfrecord-pipe COMMAND --help` for details.
Exit codes: 0 fine; 1 problems found (verify, inspect --check) or a job that failed (the
storage, a worker); 2 bad input; 130 interrupted (Ctrl-C); 143 convert terminated (SIGTERM).""",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.add_parser(
        "convert", add_help=False,
        help="convert an image folder or CSV list into TFRecord shards (see convert --help)",
    )  # fmt: skip
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--verbose", action="store_true",
        help="also show TensorFlow's start-up lines (CUDA probing, CPU features) and log lines",
    )  # fmt: skip
    sub = dict(parents=[common], formatter_class=help_format.HelpFormatter)
    inspect = commands.add_parser(
        "inspect", **sub,
        help="show what a dataset holds: splits, shards, labels, image sizes, rejections",
        description="Show what a dataset folder (or a pattern of TFRecord files) holds: splits, "
        "shard counts and sizes, record counts, a label histogram, the image size distribution "
        "and the rejected inputs with their reasons.",
    )
    inspect.add_argument("path", help="dataset folder, or a file pattern, quoted: 'out/train-*'")
    inspect.add_argument(
        "--grid", metavar="FILE.png",
        help="also draw a contact sheet of sample records with their labels into FILE.png",
    )  # fmt: skip
    inspect.add_argument(
        "--check", action="store_true",
        help="read every shard whole and compare its record count with the manifest (slow on "
        "big data)",
    )  # fmt: skip
    inspect.add_argument(
        "--sample", type=int, default=5000,
        help="records read per split for the image-size histograms, and for the label one "
        "where the manifest does not count labels (0 reads all)",
    )  # fmt: skip
    inspect.add_argument("--grid_count", type=int, default=24, help="records in the grid")
    inspect.add_argument(
        "--format", choices=naming.FILE_FORMATS,
        help="of a dataset written in both formats, the shards to read (default: tfrecord)",
    )  # fmt: skip
    inspect.add_argument(
        "--label_offset", type=int,
        help="for a file pattern without a manifest beside it: what the labels were written "
        "with (1 by tfrecord-pipe and the Cloud TPU scripts); unknown, labels show as stored",
    )  # fmt: skip
    verify = commands.add_parser(
        "verify", **sub, allow_abbrev=False,  # what it does not know goes to Beam, whole
        help="prove nothing was lost or changed between the inputs and a dataset",
        description="Check a dataset against the inputs it was converted from: every listed "
        "source is in exactly one shard (matched by its relative path) or in rejected/, no record "
        "appears twice, shard counts match the manifest, every record is byte for byte the one the "
        "converter writes for its source (and, with --decode, decodes with TensorFlow). Exits 1 and lists the problems otherwise. A worker "
        "process per core; memory stays flat however large the dataset. Given Beam flags, it runs the same checks as a "
        "Beam pipeline on their runner and prints the same report.",
        epilog="""on Dataflow (workers read the data; the report comes back here):
  tfrecord-pipe verify gs://b/images gs://b/dataset --runner DataflowRunner \\
      --project P --region R --temp_location gs://b/tmp""",
    )
    verify.add_argument("source", help="what was converted: the image folder or CSV list")
    verify.add_argument("dataset", help="the dataset folder written by `tfrecord-pipe convert`")
    verify.add_argument(
        "--decode", action="store_true",
        help="also decode every record's image as the reader will, with TensorFlow (the "
        "[reader] extra; some 700 MB of memory per worker process): proves TensorFlow reads "
        "every image, beyond the records being the converter's output",
    )  # fmt: skip
    verify.set_defaults(own_flags=verify)  # what is not among them goes to Beam
    bench = commands.add_parser(
        "bench", **sub,
        help="time the reader's training and evaluation pipelines against the decode ceiling",
        description="Run the reader's training and evaluation pipelines on a dataset for a fixed "
        "time each, with a progress bar, and print images/s next to the decode ceiling (the "
        "same records only parsed and fully decoded) measured in the same run. Compare the "
        "training rate with what your accelerator consumes (global batch x steps/s).",
    )
    bench.add_argument("path", help="dataset folder, or a file pattern, quoted: 'out/train-*'")
    bench.add_argument("--seconds", type=float, default=10.0, help="timed run per pipeline")
    bench.add_argument("--image_size", type=int, default=224,
                       help="side of the square images the pipelines make, in pixels")
    bench.add_argument("--batch_size", type=int, default=128, help="images per batch")
    bench.add_argument("--shuffle_buffer", type=int,
                       help="records the training pipeline shuffles in memory, as training "
                       "sets it (default: the reader's, at most an epoch)")  # fmt: skip
    bench.add_argument(
        "--dtype",
        default="float32",
        choices=crops.DTYPES,  # (it said "Invalid ReaderConfig: dtype must be ...")
        help="output dtype of the pipelines: float32, bfloat16 or uint8 (normalised on the "
        "accelerator; the least host work)",
    )
    bench.add_argument(
        "--label_offset", type=int,
        help="for a file pattern without a manifest beside it: what the labels were written "
        "with (1 by tfrecord-pipe and the Cloud TPU scripts, 0 for 0-based labels)",
    )  # fmt: skip
    bench.add_argument(
        "--data_service",
        help="grpc://HOST:PORT of a tf.data service dispatcher: time training batches made by "
        "its workers (the ceiling and evaluation still run here)",
    )
    return parser


# The commands' arguments that are paths (convert's: `beam_jobs.flags.parse`).
_PATHS = ("path", "source", "dataset", "grid")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = _parser()
    if not argv or argv[0] in ("-h", "--help"):
        parser.print_help()
        return EXIT_OK if argv else EXIT_BAD_INPUT
    if argv[0] in ("convert", "verify"):  # the job's workers: their server imports meanwhile
        from beam_jobs import worker_pool

        worker_pool.start_server_for(argv[1:])
    if argv[0] == "convert":
        from beam_jobs import convert  # without TensorFlow: the job starts in a second

        return convert.main(argv[1:], prog="tfrecord-pipe convert")
    if argv[0] == "verify":  # flags not its own go to Beam
        args, args.beam_args = parser.parse_known_args(argv)
        args.argv = argv[1:]
    else:
        args = parser.parse_args(argv)
    for name in _PATHS:  # `~` as the shell would have expanded it (not after `=`, nor quoted)
        if isinstance(getattr(args, name, None), str):
            setattr(args, name, arguments.home_expanded(getattr(args, name)))
    try:
        if args.command != "verify":  # verify reads shards without it
            tensorflow_start.start(args.verbose)
        code = COMMANDS[args.command](args)
        sys.stdout.flush()  # here, not at exit (where a closed pipe is an error we cannot catch)
        return code
    except BrokenPipeError:  # `tfrecord-pipe inspect DS | head`: the reader has had enough
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # (and at exit)
        return EXIT_BROKEN_PIPE
    except (ValueError, FileNotFoundError, ConnectionError) as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:  # Ctrl-C while TensorFlow or a command loads: one line
        return program_exit.interrupted()


# Each command imports what it runs when it runs: TensorFlow takes seconds to load, and
# `convert` does not need it at all.


def _inspect(args) -> int:
    from tfrecord_pipe._tools import inspection

    _require_path(args.path)
    if args.grid is not None:  # `--grid ''` drew nothing, and said nothing
        _check_writable_png(args.grid)
        import tensorflow as tf

        from tfrecord_pipe._reading import dataset

        try:  # (a traceback for a bucket that cannot be reached: a helper's trial)
            taken = tf.io.gfile.exists(args.grid) and not inspection.is_contact_sheet(args.grid)
        except tf.errors.OpError as err:
            raise dataset.unreachable(f"--grid {args.grid}", err) from err
        if taken:
            raise ValueError(f"--grid {args.grid}: a file of that name is there that does not "
                             "say inspect drew it (as sheets of 0.5.0 on do): give a new file "
                             "name, or remove it.")  # fmt: skip
    if args.sample < 0:
        raise ValueError(f"--sample must be 0 (every record) or more, got {args.sample}")
    if args.grid_count < 1:
        raise ValueError(f"--grid_count must be 1 or more, got {args.grid_count}")
    summary = inspection.summarize(
        args.path, sample=args.sample or None, check_counts=args.check,
        label_offset=args.label_offset, file_format=args.format,
    )  # fmt: skip
    print(inspection.render(summary))
    if args.grid is not None:
        drawn = len(inspection.contact_sheet(
            args.path, args.grid, count=args.grid_count, label_offset=args.label_offset,
            file_format=args.format,
        ))
        print(f"\ncontact sheet of {messages.counted(drawn, 'record')}: {args.grid}")
    return EXIT_PROBLEMS if summary.problems else EXIT_OK


def _check_writable_png(path: str) -> None:
    """Before any reading: a --grid path that cannot take a PNG is refused at once."""
    if not path.lower().endswith(".png"):
        raise ValueError(f"--grid {path}: the contact sheet is a PNG; give a name ending in .png")
    if paths.is_remote(path):
        return  # the bucket's permissions are known only when writing
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path) or not os.path.isdir(folder) or not _can_create_in(folder):
        raise ValueError(
            f"--grid {path}: cannot write there (a folder, or a folder that does not exist or "
            "is not writable). Give a file path in a writable folder."
        )


def _can_create_in(folder: str) -> bool:
    """Whether a file can be made in `folder`, tried: its mode says yes to root everywhere
    (/proc, a read-only mount), and the sheet failed after the whole summary (a helper's
    trial)."""
    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".tfrecord-pipe-grid-"):
            return True
    except OSError:
        return False


def _require_path(path: str) -> None:
    """A clear error for a path that does not exist (patterns are checked by what they match)."""
    if meant := paths.mistyped_url(path):  # (`gs:/b/x`: a local folder named "gs:")
        raise ValueError(paths.mistyped_said("The path", path, meant))
    import tensorflow as tf

    if paths.has_wildcard(path):
        return
    from tfrecord_pipe._reading import dataset

    try:
        exists = tf.io.gfile.exists(path)
    except tf.errors.OpError as err:  # an unreachable or forbidden bucket, or an outage
        raise dataset.unreachable(path, err) from err
    if not exists:
        raise _not_there(path)


def _not_there(path: str) -> FileNotFoundError:
    """The error for a path that is not there; a link that leads nowhere is said to be one
    (`ls` shows it), and an empty one empty (it said "error:  does not exist.")."""
    if not path.strip():
        return FileNotFoundError(f"A path given is empty ({path!r}): give a folder, local or "
                                 "gs://.")  # fmt: skip
    if not paths.is_remote(path) and os.path.islink(path):
        return FileNotFoundError(f"{path} is a link that leads nowhere (to {os.readlink(path)}: "
                                 "missing, or a loop of links).")  # fmt: skip
    return FileNotFoundError(f"{path} does not exist.")


def _require_path_without_tensorflow(path: str) -> None:
    """`_require_path` through Beam's filesystems, for `verify`, which never loads TensorFlow
    (some 700 MB a process)."""
    from beam_jobs import storage

    if problem := storage.scheme_problem(path, "The path"):
        raise ValueError(problem)
    if paths.has_wildcard(path):
        return
    try:
        there = os.path.exists(path) if not paths.is_remote(path) else (
            storage.exists(path) or any(storage.children(path)))  # fmt: skip
    except ConnectionError:  # no credentials, said (`storage.gcs_client`)
        raise
    except Exception as err:  # noqa: BLE001 - an unreachable or forbidden bucket
        raise FileNotFoundError(f"Cannot reach {path}: {messages.one_line(err)}") from err
    if not there:
        raise _not_there(path)


def _verify(args) -> int:
    from tfrecord_pipe._tools import verify

    if args.beam_args:
        from beam_jobs import flags

        _check_verify_order(args)
        flags.check_beam_flags(args.beam_args, args.own_flags, whose="verify's")
    _require_path_without_tensorflow(args.source)
    _require_path_without_tensorflow(args.dataset)
    if args.decode and not args.beam_args:  # this machine's workers load it (Dataflow's
        extras.require("tensorflow")  # install it): said here, not as each fails to start
    if not args.beam_args:
        from concurrent.futures.process import BrokenProcessPool

        from beam_jobs import worker_pool

        try:  # SIGTERM too: it ended verify without a word, and its sorts stayed in TMPDIR
            with program_exit.signals_as_interrupts() as stopped:
                report = verify.verify(args.source, args.dataset, show_progress=True,
                                       decode=args.decode)  # fmt: skip
        except KeyboardInterrupt:
            said, code = program_exit.stopped_by(stopped)
            print(f"\nerror: {said}; nothing was proven either way.", file=sys.stderr)
            return code
        except (worker_pool.WorkerError, BrokenProcessPool, OSError) as err:
            if isinstance(err, FileNotFoundError):
                raise  # the listing's: a source or a folder that is not there (exit 2)
            if args.verbose and isinstance(err, worker_pool.WorkerError):
                print(err.worker_traceback, file=sys.stderr)
            full = f" {verify.disk_full()}" if messages.disk_full(err) else ""
            print(f"error: verify failed ({type(err).__name__}: {messages.one_line(err)}); "
                  f"nothing was proven either way.{full}", file=sys.stderr)  # fmt: skip
            return EXIT_PROBLEMS
    else:
        from tfrecord_pipe._tools import verify_job

        try:
            report = verify_job.run(args.source, args.dataset, args.beam_args, args.decode,
                                    args.verbose)  # fmt: skip
        except verify_job.JobFailedError as err:
            print(f"error: {err}", file=sys.stderr)
            return EXIT_PROBLEMS
    print(report)
    return EXIT_OK if report.ok else EXIT_PROBLEMS


def _check_verify_order(args) -> None:
    """Beam's flags are not known here: a flag's value before SRC would be taken for SRC, and
    a stray word after them for one of Beam's. Both are refused, saying how to give them."""
    words = [word for word in args.argv if word not in ("--verbose", "--decode")]
    if any(word.startswith("-") for word in words[:2]):
        raise ValueError("Give SRC and OUT first, then Beam's flags: "
                         "tfrecord-pipe verify SRC OUT --runner ...")  # fmt: skip
    from beam_jobs import flags

    if strays := flags.stray_words(args.beam_args):
        hint = f" ({help_format.EXPANDED_FOLDERS})" if help_format.expanded(strays[0]) else ""
        raise ValueError(f"Unexpected argument {strays[0]!r}: verify takes SRC and OUT, then "
                         f"flags{hint}.")  # fmt: skip


def _bench(args) -> int:
    from tfrecord_pipe._tools import bench

    _require_path(args.path)
    wrong = [f"--{name} {getattr(args, name):g}" for name, right in (
        ("seconds", 0 < args.seconds < math.inf), ("batch_size", args.batch_size >= 1),
        ("image_size", args.image_size >= 1)) if not right]  # fmt: skip
    if wrong:  # (it named all three, whichever was wrong)
        raise ValueError(f"{', '.join(wrong)}: must be positive (and finite)")
    import tensorflow as tf

    try:
        results = bench.bench(
            args.path,
            args.seconds,
            image_size=args.image_size,
            batch_size=args.batch_size,
            **({} if args.shuffle_buffer is None else {"shuffle_buffer": args.shuffle_buffer}),
            dtype=args.dtype,
            label_offset=args.label_offset,
            data_service=args.data_service,
        )
    except tf.errors.OpError as err:  # another tool's records, a damaged shard: a traceback
        # inspect --check finds a damaged shard, not an image that does not decode: pointed
        # to for those, it said OK (a helper's trial).
        damaged = isinstance(err, tf.errors.DataLossError)
        hint = " (`tfrecord-pipe inspect --check` names the shard)" if damaged else ""
        raise ValueError(f"{args.path} cannot be read: {messages.one_line(err)}{hint}") from err
    served = f", training batches by the tf.data service at {args.data_service}"
    print(
        f"{args.path}: {args.image_size}x{args.image_size} {args.dtype}, batch {args.batch_size}, "
        f"{args.seconds:g} s per pipeline, {os.cpu_count()} CPU cores"
        + (served if args.data_service else "")
    )
    print(bench.render(results))
    if results[1].too_short:
        return EXIT_OK
    train = results[1].images_per_s / max(results[0].images_per_s, 1e-9)
    print(
        f"training runs at {train:.2f}x the decode ceiling; it keeps an accelerator busy if "
        f"that needs fewer than {results[1].images_per_s:.0f} images/s (global batch x steps/s)."
    )
    return EXIT_OK


COMMANDS = {"inspect": _inspect, "verify": _verify, "bench": _bench}


def run() -> None:
    """The `tfrecord-pipe` command: `main`, ended so that no thread can hold it up."""
    program_exit.run(main)


if __name__ == "__main__":
    run()
