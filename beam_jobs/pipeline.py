"""The conversion as a Beam pipeline: list → load and check → plan and write shards, plus
what finalising needs (the summary) and the rejected inputs → finalise.

Every output goes to a temporary folder inside the output folder; the last step
(`FinaliseDataset`) moves it into place once everything is written.

Its steps are here, but for the two large ones (`load_images`, `write_shards`): each wires
plain functions into Beam, the functions the local engine runs without Beam (`sources`,
`csv_lists`, `duplicates`, `finalise`, `load`, `shard_writer`). Only this module and those
two import Beam, so that a local conversion never does.
"""

from __future__ import annotations

import json
import logging

import apache_beam as beam
from apache_beam.metrics import Metrics

import beam_jobs
import tfrecord_pipe
from beam_jobs import csv_lists, finalise, storage, summary
from beam_jobs import duplicates as content
from beam_jobs.config import ConvertConfig
from beam_jobs.load import BATCH
from beam_jobs.load_images import LoadImages
from beam_jobs.source_file import rejection
from beam_jobs.sources import list_sources
from beam_jobs.write_shards import WriteShards
from tfrecord_pipe._core import naming, paths

LOG = logging.getLogger(__name__)


class CollectLabels(beam.PTransform):
    """The label list: from the labels file when given, else the sorted distinct labels of the
    inputs listed without a problem (a broken link in a folder of its own is no class).

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
            | "Labels"
            >> beam.FlatMap(lambda s: [s.class_label] if s.class_label is not None else [])
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
    """One `rejected/rejected-<split>.jsonl` per split with rejections, lines sorted by path.

    Sorted, so that re-runs write the same files. Rejections are few next to the inputs;
    one worker per split writes them (Beam's text sink would cost four more stages here).
    """

    def __init__(self, folder: str):
        """`folder`: where the files go (rejected/... below it): the job's temporary folder."""
        super().__init__()
        self._folder = folder

    def expand(self, rejected):
        folder = self._folder
        return (
            rejected
            | "BySplit"
            >> beam.Map(lambda row: (row.split, (row.path, row.to_json())))
            | "PerSplit" >> beam.GroupByKey()
            | "WriteJsonl"
            >> beam.MapTuple(
                lambda split, rows: _write_lines(
                    paths.join(folder, naming.rejected_name(split)),
                    [line for _, line in sorted(rows)],
                )
            )
        )


def _write_lines(path: str, lines: list[str]) -> None:
    text = "".join(line + "\n" for line in lines)
    storage.write_bytes(path, text.encode("utf-8"), mime_type="application/x-ndjson")


class WriteSummary(beam.PTransform):
    """Writes the job's small results (shard infos, counts, the label list, the duplicate
    totals, the labels each split's records hold) as one JSON file.

    A few hundred rows at most, so one worker writes them; one file instead of three text
    sinks also spares a dozen pipeline stages, each with a fixed start-up cost. The rows are
    gathered under one key rather than with `ToList`, whose empty-input branch costs two more
    stages; a "start" row makes the group even when nothing was listed, so that finalising
    runs and says so. Emits the file's path.
    """

    def __init__(self, path: str):
        super().__init__()
        self._path = path

    def expand(self, parts):
        shards, counts, labels, duplicate_totals, label_counts = parts
        path = self._path
        start = shards.pipeline | "Start" >> beam.Create([("start", None)])
        return (
            (
                start,
                shards | "TagShard" >> beam.Map(lambda row: ("shards", row)),
                counts | "TagCount" >> beam.Map(lambda row: ("counts", row)),
                labels | "TagLabels" >> beam.Map(lambda row: ("labels", row)),
                duplicate_totals | "TagDuplicates" >> beam.Map(lambda row: ("duplicates", row)),
                label_counts | "TagLabelCounts" >> beam.Map(lambda row: ("label_counts", row)),
            )
            | "Rows" >> beam.Flatten()
            | "OneKey" >> beam.Map(lambda row: (None, row))
            | "AllRows" >> beam.GroupByKey()
            | "WriteJson" >> beam.MapTuple(lambda _, rows: _write_summary(path, rows))
        )


def _write_summary(path: str, rows) -> str:
    parts = {"shards": [], "counts": [], "labels": [], "duplicates": [], "label_counts": []}
    for kind, row in rows:
        if kind != "start":  # nothing listed: an empty summary, and finalising says so
            parts[kind].append(row)
    (labels,) = parts["labels"] or [()]
    written = summary.Summary.of(parts["shards"], parts["counts"], labels, dict(parts["duplicates"]),
                                 parts["label_counts"])  # fmt: skip
    storage.write_bytes(path, written.to_json().encode("utf-8"), mime_type="application/json")
    return path


class ListSources(beam.PTransform):
    """The inputs of a resolved config, listed on a worker by `list_sources`, the function
    `verify` lists with: a folder walked (`listing.walk`), or a CSV's lines read in order.

    The listing comes out of one step that runners cannot split: spread it (`Spread`) before
    any per-image work, or one worker thread would load every image (on Dataflow too).
    """

    def __init__(self, config: ConvertConfig):
        super().__init__()
        self._config = config

    def expand(self, pbegin):
        config = self._config
        return (
            pbegin
            | "Start" >> beam.Create([config.source])
            | "Walk" >> beam.FlatMap(lambda _: list_sources(config))
        )

def _keep_one_per_file(identity_and_sources, labels: frozenset[str] | None):
    """The kept listing, and the others as rejections (DropDuplicatePaths.REJECTED)."""
    kept, duplicates = csv_lists.one_per_file(list(identity_and_sources[1]), labels=labels)
    yield kept
    for duplicate in duplicates:
        Metrics.counter(beam_jobs.METRICS_NAMESPACE, "inputs_duplicate").inc()
        yield beam.pvalue.TaggedOutput(
            DropDuplicatePaths.REJECTED, rejection(duplicate, *duplicate.problem)
        )


class DropDuplicatePaths(beam.PTransform):
    """Keeps one listing per file; the others go to the REJECTED output (reason "duplicate").

    CSV lists can name a file twice, sometimes with two labels or in two splits, or under two
    spellings of its path. Writing it twice would count it twice and could put the same image
    in train and validation.
    """

    REJECTED = "rejected"

    def __init__(self, fixed_labels: tuple[str, ...] | None):
        super().__init__()
        self._labels = None if fixed_labels is None else frozenset(fixed_labels)

    def expand(self, sources):
        return (
            sources
            | "KeyByFile" >> beam.Map(lambda source: (csv_lists.identity(source), source))
            | "GroupByFile" >> beam.GroupByKey()
            | "KeepOne" >> beam.FlatMap(_keep_one_per_file, self._labels).with_outputs(
                self.REJECTED, main="sources"
            )
        )

class FindDuplicateContent(beam.PTransform):
    """(split, Checked) records in; out: `records` (all of them, or with `dedupe` one per
    content), `groups` (a report row per group of more than one) and `rejected` (dedupe's)."""

    def __init__(self, dedupe: bool):
        super().__init__()
        self._dedupe = dedupe

    def expand(self, records):
        grouped = (
            records
            | "ByContent" >> beam.Map(lambda split_checked: (split_checked[1].sha256, split_checked))
            | "SameContent" >> beam.GroupByKey()
        )
        groups = grouped | "Groups" >> beam.FlatMap(_group_row)
        if not self._dedupe:
            return {"records": records, "groups": groups, "rejected": None}
        kept = grouped | "KeepFirst" >> beam.FlatMap(_keep_first).with_outputs(
            "rejected", main="records"
        )
        return {"records": kept.records, "groups": groups, "rejected": kept.rejected}

def _group_row(sha256_and_records):
    row = content.group_row(*sha256_and_records)
    if row is not None:
        Metrics.counter(beam_jobs.METRICS_NAMESPACE, "duplicate_content_groups").inc()
        yield row


def _keep_first(sha256_and_records):
    first, rejected = content.keep_first(sha256_and_records[1])
    yield first
    for row in rejected:
        yield beam.pvalue.TaggedOutput("rejected", row)

class WriteDuplicates(beam.PTransform):
    """Writes the groups, in `report_order`, to `duplicates.jsonl` in `folder` (nothing when
    there are none); one worker writes them, as they are few next to the inputs."""

    def __init__(self, folder: str):
        super().__init__()
        self._path = paths.join(folder, naming.DUPLICATES_NAME)

    def expand(self, groups):
        path = self._path
        return (
            groups
            | "OneKey" >> beam.Map(lambda row: (None, row))
            | "AllGroups" >> beam.GroupByKey()
            | "WriteJsonl" >> beam.MapTuple(lambda _, rows: _write_duplicates(path, rows))
        )


def _write_duplicates(path: str, rows) -> None:
    ordered = sorted(rows, key=content.report_order)
    lines = [json.dumps(row, sort_keys=True) + "\n" for row in ordered]
    storage.write_bytes(path, "".join(lines).encode("utf-8"), mime_type="application/x-ndjson")

class FinaliseDataset(beam.PTransform):
    """The job's last step: `finalise`, on one worker, once the summary, the rejections and
    the duplicate groups are written.

    Its input is the summary's path (one element); `written` are the PCollections of the
    other writes, taken as side inputs only so that this step waits for them.
    """

    def __init__(self, config: ConvertConfig, temp_dir: str, version: str, run: str | None,
                 written=(), says_warnings: bool = False,
                 claimed_by: str | None = None):  # fmt: skip
        """`says_warnings`: log the dataset's warnings (`Manifest.warnings`), for a job that
        nobody waits for; a waiting launcher prints them with its summary. `claimed_by`: the
        run whose claim on the output must still be held (`finalise.finalise`)."""
        super().__init__()
        self._finalise = _Finalise(config, temp_dir, version, run, says_warnings, claimed_by)
        self._written = written

    def expand(self, summary_path):
        waits = [beam.pvalue.AsList(done) for done in self._written]
        return summary_path | "Finalise" >> beam.ParDo(self._finalise, *waits)


class _Finalise(beam.DoFn):
    def __init__(self, config, temp_dir, version, run, says_warnings: bool, claimed_by):
        self._args = (config, temp_dir, version, run, claimed_by)
        self._says_warnings = says_warnings

    def process(self, summary_path, *written):
        result = finalise.finalise(*self._args)
        if self._says_warnings:
            for warning in result.warnings(self._args[0].output):
                LOG.warning("%s", warning)
        yield sum(info.num_examples for info in result.splits.values())


def build_pipeline(
    pipeline: beam.Pipeline,
    config: ConvertConfig,
    temp_dir: str,
    fixed_labels: tuple[str, ...] | None,
    progress_dir: str | None = None,
    load_threads: int = 1,
    version: str = tfrecord_pipe.__version__,
    run: str | None = None,
    launcher_waits: bool = False,
    claimed_by: str | None = None,
) -> None:
    """Adds the conversion's steps to `pipeline`: outputs land in `temp_dir`, and the last
    step finalises them into the output folder (`version`, this one's unless a test says
    otherwise, goes into the manifest, which readers judge by it; the claim
    of run `run` is given up at the end). Unless the `launcher_waits` for the job (to print
    its summary), that step logs the dataset's warnings. It changes nothing in the output if
    run `claimed_by` (None: no run claimed it, a template's job) has lost its claim.

    `progress_dir` and `load_threads` are for local runs: where LoadImages reports its counts
    for the progress line, and how many threads each LoadImages instance checks inputs on.
    """
    listed = pipeline | "List" >> ListSources(config)
    duplicates = ()
    if config.layout == "csv":
        # Grouping by path also spreads the lines over workers. Labels come from the lines
        # kept: a label only a dropped duplicate gives is no label of the dataset.
        deduplicated = listed | "DropDuplicatePaths" >> DropDuplicatePaths(fixed_labels)
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
        | "LoadImages"
        >> beam.ParDo(
            LoadImages(config.policy, config.label_offset, progress_dir, load_threads),
            labels=beam.pvalue.AsSingleton(labels, default_value=()),
        ).with_outputs(LoadImages.REJECTED, main="records")
    )
    same = loaded.records | "DuplicateContent" >> FindDuplicateContent(config.dedupe)
    shards = same["records"] | "WriteShards" >> WriteShards(config, temp_dir)
    deduped = (same["rejected"],) if same["rejected"] is not None else ()
    rejected = (
        *duplicates,
        loaded[LoadImages.REJECTED],
        *deduped,
    ) | "AllRejected" >> beam.Flatten()
    duplicates_written = same["groups"] | "WriteDuplicates" >> WriteDuplicates(temp_dir)
    duplicate_totals = (
        same["groups"]
        | "DuplicateTotals" >> beam.FlatMap(content.totals)
        | "SumTotals" >> beam.CombinePerKey(sum)
    )

    counts = (
        (
            listed | "ListedPerSplit" >> beam.Map(lambda s: ((s.split, None), 1)),
            rejected | "RejectedPerReason" >> beam.Map(lambda r: ((r.split, r.reason), 1)),
        )
        | "AllCounts" >> beam.Flatten()
        | "SumCounts" >> beam.CombinePerKey(sum)
        | "CountRows" >> beam.MapTuple(lambda key, n: summary.SplitCount(*key, n))
    )
    label_counts = (
        same["records"]
        | "RecordLabels" >> beam.MapTuple(lambda split, checked: ((split, checked.label_text), 1))
        | "SumLabels" >> beam.CombinePerKey(sum)
        | "LabelCountRows" >> beam.MapTuple(lambda key, n: (*key, n))
    )
    summary_path = (
        (shards, counts, labels, duplicate_totals, label_counts)
        | "Summary" >> WriteSummary(paths.join(temp_dir, finalise.SUMMARY_NAME))
    )
    rejected_written = rejected | "WriteRejected" >> WriteRejected(temp_dir)
    _ = summary_path | "FinaliseDataset" >> FinaliseDataset(
        config, temp_dir, version, run, written=(rejected_written, duplicates_written),
        says_warnings=not launcher_waits, claimed_by=claimed_by,
    )
