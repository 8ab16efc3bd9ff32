"""The conversion job's launcher: image folders or CSV lists into balanced, deterministic
TFRecord shards. It checks the options (`flags.py`), claims the output folder and launches the
pipeline (`pipeline.py`), whose last step finalises the output folder (`finalise.py`).

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

Run on Dataflow (the usual Beam flags pass through); --no_wait returns once it is launched:
  python -m beam_jobs.convert gs://bucket/images gs://bucket/dataset \\
      --runner DataflowRunner --project P --region R --temp_location gs://bucket/tmp
"""

from __future__ import annotations

import sys

if __name__ == "__main__":
    # Run as a program: the workers' server starts first, and imports the job's modules
    # while this process imports its own.
    from beam_jobs import worker_pool

    worker_pool.start_server_for(sys.argv[1:])

import contextlib
import logging
import os
import re
import tempfile
import time
import uuid

import tfrecord_pipe
from beam_jobs import (claim, finalise, flags, local_engine, sources, storage, work_folder,
                       worker_pool, worker_progress)
from beam_jobs.config import ConvertConfig
from tfrecord_pipe._core import (array_records, help_format, manifest, messages, paths,
                                 program_exit)

LOG = logging.getLogger("beam_jobs.convert")
FLEX_LAUNCHER = "FLEX_TEMPLATE_PYTHON_PY_FILE"  # set in a Flex Template's launcher container
PROGRESS_PREFIX = "tfrecord-pipe-progress-"  # the progress line's counts' folder, in TMPDIR


def run(
    argv: list[str] | None = None,
    save_main_session: bool = True,
    prog: str = "python -m beam_jobs.convert",
) -> manifest.Manifest | None:
    """Runs the conversion; returns the manifest written, or None when the job was launched
    without waiting (`--no_wait`, and in a Flex Template's launcher).

    Raises:
      ValueError, FileNotFoundError, FileExistsError: bad options, caught before the job starts.
      finalise.NothingWrittenError: every input was rejected, or none was found.
      JobFailedError: the job failed (storage, workers); nothing was finalised.
    """
    parser = flags.make_parser(prog)
    args, beam_args = flags.parse(parser, argv)
    flags.check_beam_flags(beam_args, parser)
    if strays := flags.stray_words(beam_args):
        hint = f" ({help_format.EXPANDED_FOLDERS})" if help_format.expanded(strays[0]) else ""
        raise ValueError(
            f"Unexpected argument {strays[0]!r}: convert takes SOURCE and OUTPUT, then flags{hint}."
        )
    with flags.beam_logging(args.verbose):
        return _convert(args, beam_args, save_main_session)


def _convert(args, beam_args, save_main_session: bool) -> manifest.Manifest | None:
    launch = flags.launch_of(beam_args)  # Beam's options themselves are made at launch
    local = launch.here
    if launch.local_engine:  # the server imports while this process lists the inputs
        worker_pool.start_server(remote=any(map(paths.is_remote, (args.source, args.output))))
    with _cloud_errors_said_plainly(f"{args.source} or {args.output}"):
        config = sources.resolve_layout(flags.config_from_args(args))
        finalise.check_output(config)
        fixed_labels = sources.read_labels_file(config.labels_file) if config.labels_file else None
        if fixed_labels:
            sources.refuse_labels_alike(config, fixed_labels)
    if local:  # written by this machine's workers
        array_records.require(config.formats)
    if args.no_wait and local:
        raise ValueError("--no_wait is for a runner that runs the job elsewhere (Dataflow); "
                         "the local runner runs it in this process.")  # fmt: skip
    template = launch.template
    # In a Flex Template's launcher: submit and return (it must not wait), and the job, not
    # this process, holds the output's claim.
    if args.no_wait and template:
        raise ValueError("--no_wait launches a job; --template_location writes one into a "
                         "template. Give --no_wait alone.")  # fmt: skip
    # (Not where the job runs here: a local run in the launcher's image, `docker run` to try
    # it, ended "Launched" and left a 48-hour claim nobody gave up: a helper's trial.)
    no_wait = args.no_wait or (FLEX_LAUNCHER in os.environ and not local)
    if no_wait:
        template = None  # a Flex launcher's template_location is this run's
    if template:
        raise ValueError(
            f"--template_location {template}: a classic template freezes the run's temporary "
            "folder into it, so its runs share one (a run after a failed one mixed their "
            "files, or kept the old dataset), and its jobs hold no claim on the output. Build "
            "the Flex Template instead (dataflow/, docs/dataflow.md): each of its runs takes "
            "its own parameters and temporary folder, and holds the output's claim."
        )
    run_id = uuid.uuid4().hex[:12]
    temp_dir = paths.join(config.output, f"{finalise.TEMP_PREFIX}{run_id}")
    started = time.monotonic()
    with claim.Claim(config.output, run_id) as held:
        replaced = _clear_under_claim(config, held)  # the dataset it replaces (--overwrite)
        LOG.info("Converting %s (%s) into %s", config.source,
                 sources.layout_said(config, args.csv_header), config.output)  # fmt: skip
        waits = not no_wait
        if no_wait:
            # Before the job starts, which may finish and give the claim up at once. Should
            # the launch fail, leaving this block gives the claim up again.
            held.hand_over()
        try:
            if launch.local_engine:
                result = _run_locally(config, temp_dir, fixed_labels, claimed_by=run_id)
            else:
                options = flags.pipeline_options(beam_args, save_main_session)
                result = _run_pipeline(config, options, temp_dir, fixed_labels, local, waits,
                                       run=run_id if no_wait else None,
                                       claimed_by=run_id)  # fmt: skip
        except Exception as err:
            # In an outage the storage that failed the job fails each look at what it left
            # too, after minutes of retries each (eight minutes in all, in a helper's trial):
            # none is taken.
            outage = storage.is_outage(err)
            # Lost while this run was stopped (Ctrl-Z, a suspended VM): what failed may be
            # the other run's doing (it removed this one's temporary folder).
            lost = held.lost() if not outage else None
            if lost is not None:
                raise JobFailedError(str(lost)) from err
            if isinstance(err, (ValueError, FileNotFoundError, FileExistsError)):
                raise  # bad input found while listing: its message says what to do
            try:  # the job's last step found no dataset?
                said = None if outage else finalise.nothing_written(temp_dir)
            except Exception as look:  # the storage failed this look too
                said, outage = None, storage.is_outage(look)
            if said is not None:
                raise finalise.NothingWrittenError(said) from None
            raise JobFailedError(_failed(config, temp_dir, err, args.verbose,
                                         launch.local_engine, outage)) from err
        if not waits:
            _say_launched(config, result)
            return None
        # A finalise that found its temporary folder gone and a manifest in OUT took it for
        # its own, finished before: where another run took the claim over, that one's.
        if (lost := held.lost()) is not None:
            raise JobFailedError(str(lost))
    found = finalise.read_manifest(config.output)
    also = finalise.splits_gone(found, replaced)
    if stray := finalise.stray_files(config.output, found):
        also.append(f"{config.output} holds files that are not this dataset's where its "
                    f"readers look: {'; '.join(stray[:3])}. Move them out of it: until then "
                    "`tfrecord-pipe verify` fails on them.")  # fmt: skip
    if empty := sources.empty_label_folders(config, found.labels):
        also.append(f"label folders holding no file, so no labels of this dataset: "
                    f"{messages.some(empty, 10, ascii)}. Images put there later make labels "
                    "of them, and shift the indices of the labels after them.")  # fmt: skip
    print(finalise.summary_line(found, config.output, time.monotonic() - started, also),
          flush=True)  # fmt: skip
    return found


def _disk_full(output: str, err: Exception) -> str:
    """Which disk the local engine filled, and what to do: TMPDIR's where the output is
    remote (the sorts lie there) or `err` names a file there, else the output's."""
    temp, failed = tempfile.gettempdir(), messages.path_named(err)
    remote = paths.is_remote(output)
    in_temp = failed is not None and paths.is_inside(failed, temp) and (
        remote or not paths.is_inside(failed, output))  # fmt: skip
    kb = local_engine.SORTS_KB_AN_INPUT
    sorts = f"the job's sorts lie{{}} while it runs (some {kb} kB an input)"
    if remote or in_temp:
        what = sorts.format("") if remote else "the progress line's counts lie while it runs"
        return (f"A disk is full: {temp}, where {what}, has {messages.space_left(temp)} now. "
                "Set TMPDIR to a folder with room.")  # fmt: skip
    return (f"The disk of {output} is full: it has {messages.space_left(output)} now, and the "
            f"dataset takes about as much room as its inputs, where {sorts.format(' beside it')}. "
            "Make room, or convert into a folder on a larger disk.")  # fmt: skip


def _failed(config: ConvertConfig, temp_dir: str, err: Exception, verbose: bool,
            local_engine_ran: bool, outage: bool = False) -> str:  # fmt: skip
    """What a failed job left, and what to do (`local_engine_ran`: on this machine, with its
    sorts where `_disk_full` says; `outage`: the storage failed, and cannot be asked)."""
    what = f"The conversion job failed ({type(err).__name__}: {messages.one_line(err)})."
    if local_engine_ran and messages.disk_full(err):
        what += " " + _disk_full(config.output, err)
    if not verbose:
        what += " (--verbose shows the traceback.)"
    if outage:
        return (
            f"{what} The storage, or the network to it, failed. Run the same command again "
            f"once it answers: it removes what this run left and converts again (had this "
            f"run begun to finalise, {config.output} holds no dataset until then)."
        )
    try:
        written, began = finalise.written(temp_dir), finalise.began(temp_dir)
    except Exception:  # the storage that failed the job may fail this look too
        written = began = False
    if written:
        return (
            f"{what} The dataset was written ({config.output} has its manifest); only the "
            f"clean-up failed, and the next conversion into {config.output} removes what it left."
        )
    if began:
        return (
            f"{what} It failed while finalising: some of its files may be in {config.output} "
            "already, but there is no manifest, so that folder holds no dataset (not the new, "
            "and not one it replaced). Run the same command again: it removes what this run "
            "left and converts again."
        )
    return (
        f"{what} Nothing was finalised: {config.output} is as it was. Run it again; what this "
        "run left is removed then."
    )


def _run_locally(config: ConvertConfig, temp_dir: str, fixed_labels, claimed_by: str) -> None:
    """Runs the job on the local engine, with a progress line."""
    with work_folder.work_folder(PROGRESS_PREFIX) as progress_dir:
        with worker_progress.ProgressLine(progress_dir):
            local_engine.run(config, temp_dir, fixed_labels, progress_dir,
                             version=tfrecord_pipe.__version__, claimed_by=claimed_by)  # fmt: skip


def _run_pipeline(config, options, temp_dir, fixed_labels, local: bool, waits: bool,
                  run: str | None, claimed_by: str | None):  # fmt: skip
    """Builds and starts the pipeline, waiting for it if `waits`; locally with a progress line
    summed over workers. `run` is the claim's run, for the job to give it up (None: the
    launcher gives it up). Returns Beam's result. The wheel `options` ship is removed after."""
    import apache_beam as beam

    from beam_jobs import pipeline

    try:
        with work_folder.work_folder(PROGRESS_PREFIX) as progress_dir:
            job = beam.Pipeline(options=options)
            pipeline.build_pipeline(
                job, config, temp_dir, fixed_labels, progress_dir if local else None,
                flags.local_load_threads(options) if local else 1,
                version=tfrecord_pipe.__version__, run=run, launcher_waits=waits,
                claimed_by=claimed_by,
            )  # fmt: skip
            shown = worker_progress.ProgressLine(progress_dir) if local else None
            with shown or contextlib.nullcontext():
                result = job.run()
                if waits:
                    result.wait_until_finish()
            return result
    finally:
        flags.remove_wheel(options)  # staged by job.run()


def _say_launched(config, result) -> None:
    job_id = _job_id(result)
    print(f"Launched{f' job {job_id}' if job_id else ''}: it finalises {config.output} itself "
          "(manifest.json last) and then gives up the claim on it. Check it with "
          f"`tfrecord-pipe verify {config.source} {config.output}`.", flush=True)  # fmt: skip


def _job_id(result) -> str | None:
    """The launched job's id, where the runner knows one. In a Flex Template's launcher the
    DataflowRunner writes the job for the service to submit, and its result holds no job:
    asking its id raised AttributeError, and every Flex launch failed after its job was
    written, giving up the claim meant for the job (a helper's trial)."""
    try:
        return result.job_id()
    except Exception:  # noqa: BLE001 - no job (a template's), or a runner without ids
        return None


@contextlib.contextmanager
def _cloud_errors_said_plainly(what: str):
    """Google Cloud client errors before the job (no network, no access, retries given up) as
    one line: the client libraries' own tracebacks run to pages."""
    try:
        yield
    except Exception as err:
        # Only a client that imported them raises them: a local job does not import them (a
        # twentieth of a CPU-second, most of it gRPC).
        cloud = sys.modules.get("google.api_core.exceptions")
        if cloud is None or not isinstance(err, cloud.GoogleAPIError):
            raise
        said = messages.one_line(err)
        # A bucket that is not there, or not to these credentials: a 404 naming /b/NAME/o.
        if isinstance(err, cloud.NotFound) and (bucket := _BUCKET_IN_URL.search(said)):
            raise ConnectionError(
                f"Bucket gs://{bucket.group(1)} does not exist, or these credentials cannot "
                f"see it: check its name ({what}). ({said})"
            ) from err
        raise ConnectionError(f"Cannot reach {what}: {said}") from err


_BUCKET_IN_URL = re.compile(r"/b/([^/?\s]+)/o(?:[?\s:]|$)")  # a listing's, not an object's


class JobFailedError(RuntimeError):
    """The job itself failed (storage, workers): nothing was finalised."""


def _clear_under_claim(config: ConvertConfig, held: claim.Claim) -> manifest.Manifest | None:
    """Under the output's claim: checks it again, and removes what killed runs left; returns
    the manifest of the dataset there (that `--overwrite` replaces)."""
    if held.taken_over is not None:
        LOG.warning("Took over the claim on %s of %s, which had stopped renewing it.",
                    config.output, held.taken_over)  # fmt: skip
    there = finalise.check_output(config)  # what is there now, that no other run can change
    removed = finalise.clear_leftovers(config.output)
    if removed:
        LOG.warning("Removed %d temporary folder(s) left by runs that did not finish: %s",
                    len(removed), ", ".join(removed))  # fmt: skip
    return there


def main(argv: list[str] | None = None, prog: str = "python -m beam_jobs.convert") -> int:
    """Command-line entry: exit 0 on success, 2 with a one-line error for bad input, 1 with one
    for a job that failed (the storage, the workers), 130 when interrupted (Ctrl-C), 143 when
    terminated (SIGTERM: a scheduler, a preempted VM's shutdown)."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    with program_exit.signals_as_interrupts() as interrupted:
        try:
            run(argv, prog=prog)
        except (ValueError, FileNotFoundError, FileExistsError, ConnectionError) as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        except (JobFailedError, KeyboardInterrupt) as err:
            if not (interrupted or isinstance(err, KeyboardInterrupt)):
                print(f"error: {err}", file=sys.stderr)
                return 1
            # With --overwrite, a run stopped while it finalised has removed the old
            # dataset's manifest already (docs/conversion.md): say so, never "kept".
            replacing = _overwrites(argv)
            said, code = program_exit.stopped_by(interrupted)
            print(
                f"\nerror: {said} before the conversion finished. Run the same command again; "
                "what this run left is removed then."
                + (" The dataset it was replacing may be gone already: the run again writes "
                   "the new one." if replacing else ""),
                file=sys.stderr,
            )  # fmt: skip
            return code
    return 0


def _overwrites(argv: list[str] | None) -> bool:
    """Whether the command line asks for --overwrite, read as the job reads it."""
    try:
        return flags.parse(flags.make_parser(), argv)[0].overwrite
    except (ValueError, SystemExit):  # a command line the job refused: it replaced nothing
        return False


if __name__ == "__main__":
    program_exit.run(main)
