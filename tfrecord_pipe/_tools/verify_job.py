"""`verify` as a Beam pipeline, for datasets one machine should not re-read: the same rules
(`verify`), run on workers, with the joins as GroupByKeys.

`tfrecord-pipe verify SRC OUT --runner DataflowRunner --project P --region R --temp_location
gs://bucket/tmp` reads the shards, the rejection files and the sources on Dataflow's workers.
The job writes a small report (totals, the first problems and how many there are) under
--temp_location (else a local temporary folder); this launcher waits for it, adds the checks
of the manifest's counts and small files, prints it and deletes it. Beam counters show
progress in Dataflow's console.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
import tempfile
import uuid

import apache_beam as beam
from apache_beam.metrics import Metrics
from apache_beam.options.pipeline_options import GoogleCloudOptions, PipelineOptions

from beam_jobs import csv_lists, finalise, flags, pipeline, storage, worker_wheel
from tfrecord_pipe._core import array_records, manifest, messages, paths
from tfrecord_pipe._tools import verify_reading as reading
from tfrecord_pipe._tools.verify import WORK_PREFIX
from tfrecord_pipe._tools import verify_rules as rules
from tfrecord_pipe._tools.verify_rules import (
    COUNT,
    FILES,
    INPUTS,
    LABEL_COUNT,
    PLANNED,
    PROBLEM,
    RECORD,
    REJECTED,
    REPORTED,
    SOURCE,
    SPAN,
)

log = logging.getLogger(__name__)

METRICS = "tfrecord_pipe_verify"  # Beam counters: records, rejection lines, sources, problems
REPORT_NAME = "report.json"
_CONTENT = "content"  # a stored source under its content hash (rules.content_row)


class JobFailedError(RuntimeError):
    """The verify job itself failed (storage, workers): nothing was proven either way."""


def run(source: str, dataset: str, beam_args: list[str], decode: bool = False,
        verbose: bool = False) -> rules.VerifyReport:  # fmt: skip
    """Verifies `dataset` against `source` with a Beam pipeline run with `beam_args`
    (`--runner`, `--project`, ...); waits for it. `decode`: as `verify.verify`'s (the
    workers then install TensorFlow too). `verbose`: Beam's INFO lines, and the traceback of
    a step that fails.

    Raises:
      FileNotFoundError, ValueError: as `verify.verify`; options Beam refuses; a remote runner
        without a gs:// --temp_location; --template_location.
      JobFailedError: the job failed.
    """
    found = reading.read_conversion(dataset, source)
    config = reading.source_config(source, dataset, found)
    given = PipelineOptions(beam_args)
    local = flags.runs_here(given)
    if local:  # (remote workers install what they need)
        array_records.require(found.file_formats)
    temp_location = _check_options(given, local)
    # Checks of the dataset's small files, here, before minutes of job.
    descriptions = reading.check_descriptions(dataset, found)
    descriptions += reading.check_rejection_files(dataset, found)
    descriptions += reading.check_rejection_reasons(dataset, found)
    descriptions += finalise.stray_files(dataset, found)
    descriptions += reading.check_shard_sizes(dataset, found)
    descriptions += reading.check_manifest(found)
    extras = worker_wheel.WORKER_EXTRAS + (("reader",) if decode else ())
    options = flags.pipeline_options(beam_args, False, worker_extras=extras)
    # The report's folder: under --temp_location when given (the local runner too), else in a
    # local temporary folder of its own.
    work = temp_location or tempfile.mkdtemp(prefix=WORK_PREFIX)
    folder = paths.join(work, f"{WORK_PREFIX}{uuid.uuid4().hex[:12]}")
    report_path = paths.join(folder, REPORT_NAME)
    launched = False
    try:
        try:
            job = beam.Pipeline(options=options)
        except ValueError as err:  # Beam's check of the options: a line each
            raise ValueError(" ".join(str(err).split())) from None
        _ = job | "Verify" >> VerifyDataset(dataset, found, config, report_path, decode)
        launched = True
        try:
            with flags.beam_logging(verbose):
                result = job.run()
                if not local:  # minutes of silence otherwise
                    job_id = getattr(result, "job_id", lambda: None)()
                    print(f"Verify job{f' {job_id}' if job_id else ''} launched; waiting for its "
                          f"report (its counters, under {METRICS}, show progress).",
                          file=sys.stderr, flush=True)  # fmt: skip
                result.wait_until_finish()
        except (ValueError, FileNotFoundError) as err:  # bad input found while listing
            kind = FileNotFoundError if isinstance(err, FileNotFoundError) else ValueError
            raise kind(messages.one_line(err)) from None
        except Exception as err:
            raise _failed(err) from err
        try:
            written = json.loads(storage.read_text(report_path))
        except Exception as err:
            raise _failed(err) from err
    finally:
        flags.remove_wheel(options)
        if launched or not temp_location:  # else nothing was written (and gs:// may hang)
            _remove(folder if temp_location else work)
    return dataclasses.replace(_report(found, source, written, descriptions), decoded=decode)


def _failed(err: Exception) -> JobFailedError:
    return JobFailedError(f"The verify job failed ({type(err).__name__}: "
                          f"{messages.one_line(err)}); nothing was proven either way.")  # fmt: skip


def _check_options(given: PipelineOptions, local: bool) -> str | None:
    """The options verify itself depends on; returns --temp_location."""
    cloud = given.view_as(GoogleCloudOptions)
    if cloud.template_location:
        raise ValueError(
            "verify waits for its job's report; --template_location would only write a "
            "template. Leave it out."
        )
    temp_location = cloud.temp_location
    if not local and not (temp_location and paths.is_remote(temp_location)):
        raise ValueError(
            "A remote runner needs --temp_location gs://BUCKET/FOLDER (a folder its workers and "
            "this machine can both reach): the job writes its report there."
        )
    if temp_location and not paths.is_remote(temp_location) and os.path.isfile(temp_location):
        raise ValueError(f"--temp_location {temp_location} is a file; give a folder.")
    return temp_location


def _report(found, source: str, written: dict, descriptions: list[str]) -> rules.VerifyReport:
    """The job's report, with what it counted checked against the manifest."""
    tally = written["tally"]
    listed = {split: n for (what, split), n in tally if what == SOURCE}
    totals = {what: n for (what, _), n in tally if what != SOURCE}
    here = (
        descriptions
        + rules.count_problems(found, source, listed)
        + rules.group_count_problems(found, totals)
    )
    ranked = [(FILES, text) for text in here] + [tuple(pair) for pair in written["problems"]]
    return rules.VerifyReport(
        sources=sum(listed.values()),
        records=totals.get("records", 0),
        rejected=totals.get("rejected", 0),
        problems=tuple(rules.first_problems(ranked)),
        num_problems=len(here) + written["num_problems"],
        converted_from=rules.converted_from(found, source),
    )


class VerifyDataset(beam.PTransform):
    """Joins what each source should have become with the shards' records and the rejection
    lines, by relative path, then the stored sources by content hash with duplicates.jsonl;
    writes the report (JSON: `problems`, the first MAX_PROBLEMS_KEPT [rank, text] pairs in
    order; `num_problems`; `tally`, [[what, split], n] pairs) to `report_path`. `config` is
    the conversion's, as `verify_reading.source_config` makes it."""

    def __init__(self, dataset: str, found: manifest.Manifest, config, report_path: str,
                 decode: bool = False):  # fmt: skip
        super().__init__()
        self._dataset, self._found = dataset, found
        self._config, self._report_path, self._decode = config, report_path, decode

    def expand(self, pbegin):
        dataset, found, config = self._dataset, self._found, self._config
        shards = (
            pbegin
            | "Shards" >> beam.Create(reading.shards_of(found))
            | "SpreadShards" >> beam.Reshuffle()
            | "ReadShards"
            >> beam.FlatMap(_read_shard, dataset, found, self._decode).with_outputs(*_KINDS)
        )
        rejected = (
            pbegin
            | "RejectionFiles" >> beam.Create(reading.rejection_files(found))
            | "ReadRejected"
            >> beam.FlatMapTuple(
                lambda split, n: _tagged(reading.read_rejected(dataset, split, n), "rejected")
            ).with_outputs(*_KINDS)
        )
        listed = pbegin | "List" >> pipeline.ListSources(config)
        if config.layout == "csv":  # a file listed twice is kept once, as the converter did
            if not csv_lists.names_outside_whole(found):
                listed = listed | "NamedBefore0_5" >> beam.Map(csv_lists.named_as_before_0_5)
            listed = (
                listed
                | "KeyByFile" >> beam.Map(lambda s: (csv_lists.identity(s), s))
                | "GroupByFile" >> beam.GroupByKey()
                # An argument, not a closure: this method rebinds its names (`first`).
                | "OnePerFile" >> beam.FlatMap(_one_per_file, csv_lists.labelled_first(found),
                                               csv_lists.labels_ranked_by(found, config))
            )
        else:
            listed = listed | "Spread" >> beam.Reshuffle()
        expected = listed | "Expect" >> beam.ParDo(_Expect(found, config.policy)).with_outputs(
            COUNT, main=SOURCE
        )
        checked = (
            {SOURCE: expected[SOURCE], RECORD: shards[RECORD], REJECTED: rejected[REJECTED]}
            | "JoinByPath" >> beam.CoGroupByKey()
            | "CheckPaths"
            >> beam.FlatMap(_check_path, bool(found.conversion.get("dedupe"))).with_outputs(
                _CONTENT, main=PROBLEM
            )
        )
        reported = (
            pbegin
            | "Start" >> beam.Create([None])
            | "ReadReported"
            >> beam.FlatMap(lambda _: _tagged(reading.read_reported(dataset, found))).with_outputs(
                *_KINDS
            )
        )
        contents = (
            {SOURCE: checked[_CONTENT], REPORTED: reported[REPORTED]}
            | "JoinByContent" >> beam.CoGroupByKey()
            | "CheckContents"
            >> beam.FlatMap(_check_content, found).with_outputs(COUNT, main=PROBLEM)
        )
        labels = (
            pbegin
            | "LabelsStart" >> beam.Create([None])
            | "CheckLabels" >> beam.FlatMap(
                lambda _, collected: [(FILES, problem) for problem in rules.label_problems(
                    found, config, collected[0] if collected else ())],
                collected=beam.pvalue.AsList(listed | "CollectLabels" >> pipeline.CollectLabels(None)),
            )
        )  # fmt: skip
        across = (
            shards[SPAN]
            | "ShardSpans" >> beam.combiners.ToList()
            | "OrderAcrossShards" >> beam.FlatMap(_span_problems, found)
        )
        per_label = (
            shards[LABEL_COUNT]
            | "RecordsPerLabel" >> beam.MapTuple(lambda split, label, n: ((split, label), n))
            | "SumPerLabel" >> beam.CombinePerKey(sum)
            | "LabelTotals" >> beam.combiners.ToList()
            | "CheckLabelCounts" >> beam.FlatMap(
                lambda totals: [(FILES, problem)
                                for problem in rules.label_count_problems(found, dict(totals))])
        )  # fmt: skip
        shard_counts = (
            shards[PLANNED]
            | "PlannedBytes" >> beam.CombinePerKey(sum)
            | "PlannedTotals" >> beam.combiners.ToList()
            | "CheckShardCounts" >> beam.FlatMap(
                lambda totals: [(FILES, problem)
                                for problem in rules.shard_count_problems(found, config, dict(totals))])
        )  # fmt: skip
        problems = (
            shards[PROBLEM], rejected[PROBLEM], checked[PROBLEM], reported[PROBLEM],
            contents[PROBLEM], across, labels, per_label, shard_counts,
        ) | "Problems" >> beam.Flatten()  # fmt: skip
        tally = (
            (shards[COUNT], rejected[COUNT], expected[COUNT], contents[COUNT])
            | "Tallies" >> beam.Flatten()
            | "SumTallies" >> beam.CombinePerKey(sum)
        )
        first = problems | "FirstProblems" >> beam.combiners.Top.Smallest(rules.MAX_PROBLEMS_KEPT)
        counted = problems | "CountProblems" >> beam.combiners.Count.Globally()
        return (
            pbegin
            | "ReportStart" >> beam.Create([self._report_path])
            | "WriteReport"
            >> beam.Map(
                _write_report,
                first=beam.pvalue.AsSingleton(first),
                counted=beam.pvalue.AsSingleton(counted),
                tally=beam.pvalue.AsList(tally),
            )
        )


_KINDS = (SOURCE, RECORD, REJECTED, REPORTED, PROBLEM, COUNT, SPAN, LABEL_COUNT, PLANNED)


def _tagged(read, total: str | None = None):
    """verify's (kind, value) pairs as Beam's tagged outputs; a COUNT as a tally of `total`."""
    for kind, value in read:
        if kind == PROBLEM:
            Metrics.counter(METRICS, "problems").inc()
            value = (FILES, value)
        elif kind == COUNT:
            Metrics.counter(METRICS, total).inc(value)
            value = ((total, None), value)
        yield beam.pvalue.TaggedOutput(kind, value)


def _read_shard(shard, dataset: str, found: manifest.Manifest, decode: bool):
    """A shard read whole (verify_reading.read_shard)."""
    return _tagged(reading.read_shard(dataset, found, shard, decode), "records")


class _Expect(beam.DoFn):
    """What each source should have become (verify_rules.Expect), keyed by relative path."""

    def __init__(self, found: manifest.Manifest, policy):
        self._found, self._policy = found, policy

    def setup(self):
        self._expect = rules.Expect(self._found, self._policy)

    def process(self, listed):
        Metrics.counter(METRICS, "sources").inc()
        yield listed.relpath, self._expect(listed)
        yield beam.pvalue.TaggedOutput(COUNT, ((SOURCE, listed.split), 1))


def _one_per_file(identity_and_group, labelled_first: bool, labels: frozenset[str] | None):
    kept, duplicates = csv_lists.one_per_file(list(identity_and_group[1]), labelled_first, labels)
    return [kept, *duplicates]


def _check_path(joined, dedupe: bool):
    relpath, grouped = joined
    rows = {kind: list(grouped[kind]) for kind in (SOURCE, RECORD, REJECTED)}
    for problem in rules.check_path(relpath, rows, dedupe):
        Metrics.counter(METRICS, "problems").inc()
        yield INPUTS, problem
    same = rules.content_row(relpath, rows)
    if same is not None:
        yield beam.pvalue.TaggedOutput(_CONTENT, same)


def _check_content(joined, found):
    _, grouped = joined
    found_problems, added = rules.check_content(grouped[SOURCE], list(grouped[REPORTED]), found)
    for problem in found_problems:
        Metrics.counter(METRICS, "problems").inc()
        yield INPUTS, problem
    for name, n in added.items():
        yield beam.pvalue.TaggedOutput(COUNT, ((name, None), n))


def _span_problems(spans, found: manifest.Manifest):
    for problem in rules.span_problems(found, spans):
        Metrics.counter(METRICS, "problems").inc()
        yield FILES, problem


def _write_report(path: str, first, counted: int, tally) -> None:
    report = {"problems": list(first), "num_problems": counted, "tally": list(tally)}
    storage.write_bytes(path, json.dumps(report).encode("utf-8"), mime_type="application/json")


def _remove(folder: str) -> None:
    """The job's own folder. What cannot be removed is left, and said: the report is read."""
    try:
        storage.delete_folder(folder)
    except Exception as err:  # noqa: BLE001 - a leftover report harms nothing
        log.warning("Could not remove %s: %s", folder, err)
