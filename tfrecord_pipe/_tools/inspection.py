"""What a dataset holds, for a person: a summary with histograms, a contact sheet, and a close
look at a few records.

Used by `tfrecord-pipe inspect`. Counts come from the manifest; label and image-size
histograms from reading records (a sample spread over all shards, or all of them; remote
ArrayRecord shards are read whole, one at a time, so there the sample is the first shards'); with
`check_counts` every shard is read and its record count compared with the manifest's.

Labels are shown one way everywhere: `daisy (0)`, the name and the 0-based index, when the
label offset is known (the manifest's, or given); `daisy (stored 1)` when it is not.
"""

from __future__ import annotations

import collections
import dataclasses
import io
import json
import math
import statistics

import tensorflow as tf
from PIL import Image, ImageDraw, PngImagePlugin, UnidentifiedImageError

from tfrecord_pipe._core import manifest as manifest_lib
from tfrecord_pipe._core import array_records, messages, naming, paths, schema
from tfrecord_pipe._reading import dataset as dataset_lib
from tfrecord_pipe._reading import records

DEFAULT_SAMPLE = 5000  # records read per split for the histograms the manifest cannot give
_BAR = 30  # width of the longest histogram bar, in characters


def label_text(stored: int, text: str, offset: int | None, names=None) -> str:
    """A record's label for a person: `name (index)`, or `text (stored N)` without an offset."""
    if offset is None:
        return f"{text} (stored {stored})"
    index = stored - offset
    name = names[index] if names and 0 <= index < len(names) else text
    return f"{name} ({index})"


def _offset(found: dataset_lib.Dataset, given: int | None) -> int | None:
    """The label offset when it is known, else None (shown as stored values)."""
    if found.manifest is None and given is None:
        return None
    return dataset_lib.label_offset(found, given)


@dataclasses.dataclass(frozen=True)
class Shard:
    """Attributes: path; num_bytes; listed: records per the manifest (None without one);
    counted: records actually read (None unless counts were checked)."""

    path: str
    num_bytes: int
    listed: int | None
    counted: int | None = None

    @property
    def miscounted(self) -> bool:
        """Read whole, it holds another count than the manifest lists."""
        return None not in (self.counted, self.listed) and self.counted != self.listed


@dataclasses.dataclass(frozen=True)
class SplitSummary:
    """Attributes: name; shards; records read for the histograms (read_all: every record);
    label (as `label_text` shows it) to count among them; image heights and widths;
    problems: missing shards, and shards that could not be read to their end; missing: how
    many shards the manifest lists that are not there; checked: every shard was counted."""

    name: str
    shards: tuple[Shard, ...]
    read: int
    read_all: bool
    labels: dict[str, int]
    heights: tuple[int, ...]
    widths: tuple[int, ...]
    problems: tuple[str, ...] = ()
    missing: int = 0
    checked: bool = False
    resized: int = 0  # shards not of the size the manifest lists
    replaced: int = 0  # shards holding other inputs than the manifest lists (read whole)

    @property
    def listed(self) -> int | None:
        counts = [shard.listed for shard in self.shards]
        return None if None in counts else sum(counts)


@dataclasses.dataclass(frozen=True)
class DatasetSummary:
    """Attributes: path; is_pattern (a file pattern, not a dataset folder); the manifest (the
    folder's, or the one beside a pattern's files; None without one); split summaries;
    rejected reason to count and a few rejected lines as written by the converter (a folder's
    only: a pattern may select some of its files)."""

    path: str
    is_pattern: bool
    manifest: manifest_lib.Manifest | None
    splits: tuple[SplitSummary, ...]
    rejected: dict[str, int]
    rejected_examples: tuple[dict, ...]
    file_format: str = naming.TFRECORD  # of the shards read
    missing_files: tuple[str, ...] = ()  # written with the manifest (labels.txt, TFDS's)

    @property
    def problems(self) -> list[str]:
        """Missing or unreadable shards, shards that hold another count than listed, and
        files written with the manifest that are missing."""
        return [f"{path}: missing (it is written with the manifest)"
                for path in self.missing_files] + [
            problem for split in self.splits for problem in split.problems] + [
            f"{shard.path}: manifest lists {shard.listed} records, the shard holds {shard.counted}"
            for split in self.splits
            for shard in split.shards
            if shard.miscounted
        ]


def _resolved(path: str, file_format: str | None) -> dataset_lib.Dataset:
    """What `path` holds, refused where this machine cannot read its shards (else each split
    "stopped after 0 records", or a traceback)."""
    found = dataset_lib.resolve(path, file_format)
    array_records.require((found.file_format,))
    return found


def summarize(
    path: str,
    sample: int | None = DEFAULT_SAMPLE,
    check_counts: bool = False,
    label_offset: int | None = None,
    file_format: str | None = None,
) -> DatasetSummary:
    """Reads what `path` (a dataset folder or a file pattern) holds.

    Args:
      path: dataset folder (with manifest.json) or a pattern of TFRecord files.
      sample: records read per split for the histograms, spread over all shards (but remote
        ArrayRecord ones: from the first); None: all.
      check_counts: read every shard fully and count its records.
      label_offset: for a pattern without a manifest beside it; labels are shown as stored
        values without it.
      file_format: the shards to read, of a dataset written in two formats (naming.FILE_FORMATS);
        None: TFRecord where there is any.

    Raises:
      ValueError: nothing to inspect at `path`; the message says what was expected.
    """
    found = _resolved(path, file_format)
    offset = _offset(found, label_offset)
    splits = tuple(
        _split_summary(split, found, sample, check_counts, offset)
        for split in found.splits.values()
    )
    rejected, examples, missing = {}, (), ()
    if not found.is_pattern:
        rejected = dict(found.manifest.rejected_reasons)
        examples = tuple(_rejected_lines(paths.folder(path), limit=5))
        described = [paths.join(paths.folder(path), name)
                     for name, _ in manifest_lib.files_beside(found.manifest)]  # fmt: skip
        missing = tuple(file for file in described if not tf.io.gfile.exists(file))
    return DatasetSummary(path, found.is_pattern, found.manifest, splits, rejected, examples,
                          found.file_format, missing)  # fmt: skip


def _split_summary(split, found, sample, check_counts, offset) -> SplitSummary:
    problems = [f"{path}: missing, or not a file (the manifest lists it)" for path in split.missing]
    present = split.without_missing()
    files = list(present.files)
    if not files:  # every input of the split was rejected, or every shard is missing
        return SplitSummary(split.name, (), 0, True, {}, (), (), tuple(problems),
                            len(split.missing), check_counts)  # fmt: skip
    resized = []
    if found.manifest is not None and not found.is_pattern:
        resized = found.manifest.splits[split.name].size_problems(
            paths.folder(found.path), found.file_format)  # fmt: skip
        problems += [f"{said}: cut short, or changed since the conversion" for said in resized]
    sizes = [tf.io.gfile.stat(path).length for path in files]
    counted, replaced = [None] * len(files), 0
    listed = present.record_counts or [None] * len(files)
    if check_counts:
        counted = [_count(path, found.compression, problems) for path in files]
        for index, path in enumerate(files):
            if counted[index] is None or listed[index] not in (None, counted[index]):
                continue  # unreadable, or miscounted: said so already, not "other inputs" too
            try:
                other = _holds_other_inputs(path, split.name, found)
            except tf.errors.OpError as err:  # read whole (an ArrayRecord count reads less)
                problems.append(f"{path}: cannot be read to its end: {messages.one_line(err)}")
                counted[index] = None
                continue
            if other:
                replaced += 1
                problems.append(f"{path}: holds other inputs than the manifest lists, or in "
                                "another order (another shard's copy, or swapped with one?); "
                                "verify names them")  # fmt: skip
    sampled = _Sample()
    try:
        sampled.read_from(files, found, sample)
    except tf.errors.OpError as err:
        culprit = None
        if isinstance(err, tf.errors.DataLossError) and found.file_format == naming.TFRECORD:
            per_file = -(-(sample if sample is not None else sampled.read + 1) // len(files)) + 1
            culprit = _first_unreadable(files, found, per_file)
        at = f", at {culprit}" if culprit else ""
        said = (f"split {split.name}: reading a sample stopped after {sampled.read} records{at}: "
                f"{messages.one_line(err)}")  # fmt: skip
        if culprit and len(files) > 1:  # the other shards' sample, for the histograms
            sampled = _Sample()
            try:
                sampled.read_from([f for f in files if f != culprit], found, sample)
                said += f" (the histograms are of the other {len(files) - 1} shard(s))"
            except tf.errors.OpError:  # another one damaged too: none drawn
                sampled = _Sample()
        problems.append(said)
    heights, widths, read = sampled.heights, sampled.widths, sampled.read
    labels, stored_labels = collections.Counter(), collections.Counter()
    for (stored, text), count in sampled.labels.items():
        labels[label_text(stored, text, offset, found.labels)] += count
        stored_labels[stored] += count
    if offset is not None:
        problems += _labels_out_of_range(split.name, stored_labels, offset, found)
    if not read and sum(sizes) and not problems:  # TensorFlow reads a few stray bytes as none
        problems.append(f"split {split.name}: its {len(files)} file(s) hold {sum(sizes)} bytes "
                        "but no record: are they TFRecord files? (--check reads them whole)")  # fmt: skip
    return SplitSummary(
        name=split.name,
        shards=tuple(
            Shard(path, size, count, checked)
            for path, size, count, checked in zip(files, sizes, listed, counted)
        ),
        read=read,
        read_all=sample is None or read < sample,
        labels=dict(labels),
        heights=tuple(heights),
        widths=tuple(widths),
        problems=tuple(problems),
        missing=len(split.missing),
        checked=check_counts,
        resized=len(resized),
        replaced=replaced,
    )


@dataclasses.dataclass
class _Sample:
    """What a sample of a split's records shows: (stored label, label text) counts, sizes."""

    labels: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    heights: list = dataclasses.field(default_factory=list)
    widths: list = dataclasses.field(default_factory=list)
    read: int = 0

    def read_from(self, files, found, sample) -> None:
        """Reads up to `sample` records (None: all) spread over `files`; raises OpError where
        one cannot be read (what was read so far is kept)."""
        spec = records.parse_spec(schema.LABEL, schema.SYNSET, schema.HEIGHT, schema.WIDTH)
        serialized = _spread(files, found)
        if sample is not None:
            serialized = serialized.take(sample)
        for batch in serialized.batch(1024).map(lambda r: tf.io.parse_example(r, spec)):
            self.read += len(batch[schema.LABEL])
            for stored, text in zip(batch[schema.LABEL].numpy(), batch[schema.SYNSET].numpy()):
                self.labels[int(stored), text.decode("utf-8", "replace")] += 1
            self.heights.extend(int(h) for h in batch[schema.HEIGHT].numpy())
            self.widths.extend(int(w) for w in batch[schema.WIDTH].numpy())


def _labels_out_of_range(split: str, stored: collections.Counter, offset: int,
                         found: dataset_lib.Dataset) -> list[str]:  # fmt: skip
    """What is wrong where stored labels less the offset fall outside 0..labels-1. Below 0,
    on a bare pattern, the offset given is the likelier fault than the records."""
    said = []
    if below := sum(count for label, count in stored.items() if label < offset):
        if found.manifest is None:
            usual = " (tfrecord-pipe's is 1)" if min(stored) >= 1 else ""
            said.append(f"split {split}: {below} record(s) read have a label below 0 with "
                        f"--label_offset {offset}: the smallest stored is {min(stored)}, so the "
                        f"offset they were written with is at most {min(stored)}{usual}")  # fmt: skip
        else:
            said.append(f"split {split}: {below} record(s) read have a stored label below the "
                        f"manifest's label_offset {offset}: verify names them")  # fmt: skip
    count = len(found.labels or ())
    if beyond := sum(n for label, n in stored.items() if count and label - offset >= count):
        said.append(f"split {split}: {beyond} record(s) read have a label beyond the "
                    f"manifest's {count} labels: verify names them")  # fmt: skip
    return said


def _first_unreadable(files: list[str], found, records_each: int) -> str | None:
    """The first of `files` whose first `records_each` records cannot be read: TensorFlow's
    error ("truncated record at 0") names no file, and the sample takes a few from each."""
    for path in files:
        try:
            for _ in records.shard_records(path, found.compression, found.file_format).take(
                records_each
            ):
                pass
        except tf.errors.OpError:
            return path
    return None


def _count(path: str, compression: str, problems: list[str]) -> int | None:
    """The records in a shard, read to its end; None (and a problem) if it cannot be."""
    try:
        return records.count(path, compression)
    except tf.errors.OpError as err:
        problems.append(f"{path}: cannot be read to its end: {messages.one_line(err)}")
        return None


_DIGEST_BATCH = 16  # records read at a time for a shard's digest: bounded memory, few steps


def _holds_other_inputs(path: str, split: str, found) -> bool:
    """Whether a shard read whole holds other inputs, in another order, than the manifest's
    digest of them says (`manifest.ShardPositions`): a shard replaced by another's copy of
    its size and count read as OK. False where the manifest keeps no digest, or a record
    does not parse (the reader then says so)."""
    info = found.manifest.splits.get(split) if found.manifest is not None else None
    name = paths.basename(path)
    if info is None or not info.shard_digests or name not in info.files_of(found.file_format):
        return False
    positions = manifest_lib.ShardPositions()
    offset = found.manifest.label_offset
    shard = records.shard_records(path, found.compression, found.file_format)
    for batch in shard.batch(_DIGEST_BATCH):  # not a record at a time: eager steps cost more
        for serialized in batch.numpy():
            try:
                record = (schema.decode_written(serialized, label_offset=offset)
                          or schema.decode_parsed(serialized, label_offset=offset))  # fmt: skip
            except ValueError:
                return False
            positions.add(record.filename, record.label_index, record.label_text)
    recorded = info.shard_digests[info.files_of(found.file_format).index(name)]
    return positions.hexdigest() != recorded


def _present(found: dataset_lib.Dataset) -> list[str]:
    """The shard files that are there (a missing one is a problem `summarize` reports), the
    splits' taken in turn (a first shard of each, then a second, ...): a sample of fewer
    records than shards, one from each, then shows every split."""
    splits = [split.without_missing().files for split in found.splits.values()]
    return [files[i] for i in range(max(map(len, splits), default=0))
            for files in splits if i < len(files)]  # fmt: skip


def _spread(files, found, with_path: bool = False) -> tf.data.Dataset:
    """The records of `files` (shards of `found`), one from each shard in turn: a sample
    spread over all of them (with `with_path`, (shard path, record) pairs)."""

    @tf.autograph.experimental.do_not_convert
    def records_of(path):
        dataset = records.shard_records(path, found.compression, found.file_format)
        return dataset.map(lambda record: (path, record)) if with_path else dataset

    cycle = max(1, len(files))
    if found.file_format == naming.ARRAY_RECORD and any(map(paths.is_remote, files)):
        # Each open remote ArrayRecord shard is a whole local copy: one at a time, so the
        # sample comes from the first shards (whose records are in hash order, mixed).
        cycle = 1
    return tf.data.Dataset.from_tensor_slices(list(files)).interleave(records_of, cycle_length=cycle)


def _rejected_lines(folder: str, limit: int):
    """The first `limit` lines of the rejection lists, as rows; a line that is no rejection
    (edited, damaged: `verify` says what is wrong) as a row that names it."""
    pattern = paths.join(folder, naming.rejected_name("*"))
    for path in sorted(tf.io.gfile.glob(pattern)):
        with tf.io.gfile.GFile(path, "rb") as lines:
            for number, line in enumerate(lines, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line.decode("utf-8"))
                except ValueError:  # (UnicodeDecodeError is one)
                    row = None
                if not isinstance(row, dict):
                    row = {"path": f"{path} line {number}", "reason": "not a rejection line",
                           "error": "`tfrecord-pipe verify` checks them"}  # fmt: skip
                yield row
                limit -= 1
                if limit == 0:
                    return


def _count_verdict(split: SplitSummary, listed: int | None) -> str:
    """OK, or MISMATCH with what differs; then the records read (of those listed)."""
    unreadable = sum(shard.counted is None for shard in split.shards)
    other = sum(shard.miscounted for shard in split.shards)
    faults = [f"{n} {what}" for n, what in ((split.missing, "missing"), (unreadable, "unreadable"),
              (other, "holding another count than listed"),
              (split.resized, "of another size than listed"),
              (split.replaced, "holding other inputs than listed")) if n]  # fmt: skip
    read = sum(shard.counted or 0 for shard in split.shards)
    of = f" of {listed} listed" if listed is not None else ""
    verdict = "MISMATCH: " + ", ".join(faults) if faults else "OK"
    return f"{verdict} ({messages.counted(read, 'record')} read{of})"


def render(summary: DatasetSummary) -> str:
    """The summary as text: splits and shards, label histogram, image sizes, rejections."""
    lines = [f"{summary.path}"]
    found = summary.manifest
    if found:
        lines.append(
            f"  {len(found.labels)} labels, label_offset {found.label_offset}, "
            f"{_compression(found, summary.file_format)}, written by tfrecord-pipe "
            f"{found.tool_version or '?'} (format {found.format_version})"
        )
        if len(found.file_formats) > 1:
            lines.append(
                f"  shards in {' and '.join(found.file_formats)}, the same records; "
                f"read here: {summary.file_format} (--format chooses)"
            )
        elif found.file_formats != (naming.TFRECORD,):
            lines.append(f"  shards in {found.file_formats[0]}")
    else:
        lines.append("  no manifest.json: a bare file pattern (counts read from the shards)")
    for split in summary.splits:
        lines.append("")
        if not split.shards and not split.missing:
            lines.append(f"{split.name}: 0 records (every input of it was rejected)")
            continue
        total_bytes = sum(shard.num_bytes for shard in split.shards)
        sizes = [shard.num_bytes for shard in split.shards] or [0]  # every shard missing
        listed = split.listed
        if found and not summary.is_pattern:  # the manifest's, missing shards' records too
            listed = found.splits[split.name].num_examples
        if listed is None and split.read_all:
            listed = split.read  # no manifest, but every record was read
        missing = f" ({split.missing} missing)" if split.missing else ""
        records = messages.counted(listed if listed is not None else split.read, "record")
        records = records if listed is not None else f"at least {records}"
        lines.append(
            f"{split.name}: {records} in "
            f"{messages.counted(len(split.shards) + split.missing, 'shard')}{missing}, "
            f"{_mb(total_bytes)} "
            f"(shards {_mb(min(sizes))}..{_mb(max(sizes))})"
        )
        if split.checked:
            lines.append(f"  counts checked against the shards: {_count_verdict(split, listed)}")
        counts = () if summary.is_pattern or not found else found.splits[split.name].label_counts
        if any(counts):  # every record's, without reading them
            lines.append("  labels (every record, as the manifest counts them):")
            offset = found.label_offset
            lines += _histogram(
                {label_text(index + offset, label, offset, found.labels): n
                 for index, (label, n) in enumerate(zip(found.labels, counts)) if n},
                most=MOST_LABELS_SHOWN,
            )  # fmt: skip
        elif split.read:
            sampled = "" if listed is None or split.read >= listed else f", a sample of {split.read}"
            lines.append(f"  labels (records read{sampled}):")
            lines += _histogram(split.labels, most=MOST_LABELS_SHOWN)
        if split.read:
            lines.append(
                f"  image height {_stats(split.heights)}; width {_stats(split.widths)}"
            )
            longest = [max(h, w) for h, w in zip(split.heights, split.widths)]
            lines.append("  longer side:")
            lines += _histogram(_size_buckets(longest), sort_by_count=False)
    if not summary.is_pattern:
        lines.append("")
        if summary.rejected:
            reasons = ", ".join(f"{reason} {n}" for reason, n in sorted(summary.rejected.items()))
            lines.append(f"rejected: {sum(summary.rejected.values())} ({reasons})")
            for row in summary.rejected_examples:
                path, error = (messages.printable(str(row.get(key))) for key in ("path", "error"))
                lines.append(f"  {path}: {row.get('reason')}: {error}")
            if (more := sum(summary.rejected.values()) - len(summary.rejected_examples)) > 0:
                where = paths.join(summary.path, naming.REJECTED_DIR)
                lines.append(f"  ... and {more} more, in {where}")
        else:
            lines.append("rejected: none")
        if found is not None:
            if not found.duplicates_found:  # else its first warning says them
                lines.append(f"duplicates: {found.duplicates_line()}")
            lines += [f"WARNING: {warning}" for warning in found.warnings(summary.path)]
    lines += [f"PROBLEM {problem}" for problem in summary.problems]
    return "\n".join(lines)


def _compression(found: manifest_lib.Manifest, file_format: str) -> str:
    """How the shards read are compressed, as the header says it."""
    if file_format == naming.ARRAY_RECORD:
        return "zstd chunks" if found.conversion.get("compress") else "uncompressed"
    return "GZIP" if found.compression else "uncompressed"


def _mb(num_bytes: int) -> str:
    """MiB, or KiB below a tenth of one (a small dataset's shards were all "0.0 MiB")."""
    if num_bytes < (1 << 20) // 10:
        return f"{num_bytes / 1024:.1f} KiB"
    return f"{num_bytes / (1 << 20):.1f} MiB"


def _stats(values) -> str:
    return f"{min(values)}..{max(values)} (median {statistics.median(values):g})"


MOST_LABELS_SHOWN = 40  # rows of a label histogram; the rest in one line (21,000 classes)


def _histogram(counts: dict, sort_by_count: bool = True, most: int | None = None) -> list[str]:
    """A bar per key; with `most`, the `most` largest and one line for the rest."""
    items = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])) if sort_by_count else list(counts.items())
    items, rest = (items, []) if most is None else (items[:most], items[most:])
    top = max(counts.values())
    keys = [messages.printable(str(key)) for key, _ in items]  # (a bare pattern's labels)
    width = max(map(len, keys))
    lines = [
        f"    {key:<{width}} {'█' * max(1, round(_BAR * n / top))} {n}"
        for key, (_, n) in zip(keys, items)
    ]
    if rest:
        low, high = min(n for _, n in rest), max(n for _, n in rest)
        each = f"{low}" if low == high else f"{low} to {high}"
        lines.append(f"    ... and {len(rest)} more, {each} each")
    return lines


def _size_buckets(sides) -> dict[str, int]:
    """Counts per power-of-two range of the longer side: '<64', '64-127', ..."""
    buckets = collections.Counter()
    for side in sides:
        low = 1 << max(6, int(math.log2(max(side, 1))))
        buckets[low if side >= 64 else 0] += 1
    return {("<64" if low == 0 else f"{low}-{2 * low - 1}"): buckets[low] for low in sorted(buckets)}


SHEET_SOFTWARE = "tfrecord-pipe inspect --grid"  # the PNG text that marks a contact sheet


def is_contact_sheet(path: str) -> bool:
    """Whether the PNG at `path` (local or gs://) is a contact sheet `contact_sheet` wrote:
    only such a file is written over, never an image of the user's of that name."""
    try:
        with tf.io.gfile.GFile(path, "rb") as f, Image.open(f) as image:
            return image.info.get("Software") == SHEET_SOFTWARE  # (read before the pixels)
    except (OSError, ValueError, tf.errors.OpError):  # not an image Pillow reads, or gone
        return False


def contact_sheet(
    path: str,
    output: str,
    count: int = 24,
    columns: int = 6,
    thumb: int = 128,
    label_offset: int | None = None,
    file_format: str | None = None,
) -> list[tuple[str, str]]:
    """Writes a PNG grid of `count` records (spread over the shards; from the first ones of
    remote ArrayRecord shards), under each its label, split and file name.

    Args:
      path: dataset folder or file pattern.
      output: PNG path, local or gs://.
      count: number of records shown.
      columns: thumbnails per row.
      thumb: thumbnail side, in pixels.
      label_offset: for a pattern without a manifest (see `summarize`).

    Returns:
      The captions drawn, a (label, "split file name") pair per record.
    """
    found = _resolved(path, file_format)
    offset = _offset(found, label_offset)
    tiles = []
    try:
        spread = _spread(_present(found), found, with_path=True)
        for shard, serialized in spread.take(count):
            encoded, stored, text, filename = _tile_fields(serialized.numpy())
            try:
                image = _thumbnail(Image.open(io.BytesIO(encoded)).convert("RGB"), thumb)
            except (OSError, ValueError, Image.DecompressionBombError) as err:
                shown = f" ({filename})" if filename else ""
                why = ("no image format Pillow knows" if isinstance(err, UnidentifiedImageError)
                       else err)  # (its own words name a BytesIO object)  # fmt: skip
                raise ValueError(f"Cannot draw {path}: an image of {shard.numpy().decode()}"
                                 f"{shown} does not decode: {why}") from err  # fmt: skip
            split = naming.split_of(shard.numpy().decode()) or "?"
            label = "no label" if stored is None else label_text(stored, text, offset,
                                                                  found.labels)  # fmt: skip
            tiles.append((image, (label, f"{split} {paths.basename(filename)}")))
    except tf.errors.OpError as err:
        raise ValueError(
            f"Cannot draw {path}: reading its shards stopped after {len(tiles)} records: "
            f"{messages.one_line(err)} (inspect --check names the shard)"
        ) from err
    if not tiles:
        raise ValueError(f"No records to draw in {path}")
    line_height = 13
    caption = 2 * line_height + 4
    rows = math.ceil(len(tiles) / columns)
    sheet = Image.new("RGB", (columns * (thumb + 4) + 4, rows * (thumb + caption + 4) + 4), "white")
    pen = ImageDraw.Draw(sheet)
    for i, (image, lines) in enumerate(tiles):
        x = 4 + (i % columns) * (thumb + 4)
        y = 4 + (i // columns) * (thumb + caption + 4)
        sheet.paste(image, (x, y))
        for n, (text, colour) in enumerate(zip(drawn_caption(lines, thumb), ("black", "dimgray"))):
            pen.text((x + 2, y + thumb + 3 + n * line_height), text, fill=colour)
    buffer = io.BytesIO()
    signed = PngImagePlugin.PngInfo()
    signed.add_text("Software", SHEET_SOFTWARE)  # so that another run may replace it
    sheet.save(buffer, format="PNG", pnginfo=signed)
    try:
        with tf.io.gfile.GFile(output, "wb") as f:
            f.write(buffer.getvalue())
    except tf.errors.OpError as err:
        raise ValueError(f"Cannot write the contact sheet {output}: {messages.one_line(err)}")
    return [caption for _, caption in tiles]


def _tile_fields(serialized: bytes) -> tuple[bytes, int | None, str, str]:
    """(image bytes, stored label or None, label text, file name) of a record: what a tile
    shows, from any record with an image (Cloud TPU's scripts' write no sha256 key, and a
    record without a label or name is drawn without them)."""
    features = schema.parse_features(serialized)

    def single(key, kind):
        found_kind, values = features.get(key, (None, []))
        return values[0] if found_kind == kind and len(values) == 1 else None

    encoded = single(schema.ENCODED, schema.BYTES)
    if encoded is None:
        raise ValueError(f"A record holds no single {schema.ENCODED} to draw (its keys: "
                         f"{sorted(features)}); is it an image record?")  # fmt: skip
    text, name = (bytes(single(key, schema.BYTES) or b"").decode("utf-8", "replace")
                  for key in (schema.SYNSET, schema.FILENAME))  # fmt: skip
    stored = single(schema.LABEL, schema.INT64)
    return bytes(encoded), None if stored is None else int(stored), text, name


def drawn_caption(caption: tuple[str, str], width: int) -> tuple[str, str]:
    """The two lines drawn under a thumbnail `width` px wide: the label, and the split then
    the file name, each cut to fit; the split is kept whole (what a reader checks first), the
    name keeps its end."""
    label, where = map(_drawable, caption)
    split = where.split(" ", 1)[0] + " "
    return _fit(label, width), split + _fit(where[len(split) :], width, split)


def _drawable(text: str) -> str:
    """`text` with what Pillow's default font cannot draw (it has printable ASCII) written as
    escapes (`caf\\xe9`): drawn, such letters were all the same box."""
    return "".join(char if " " <= char <= "~" else ascii(char)[1:-1] for char in text)


def _fit(text: str, width: int, after: str = "") -> str:
    """`text` cut to what fits under a thumbnail after `after` (Pillow's default font: about
    6 px a character), keeping its end, where file names differ."""
    most = max(width // 6 - len(after), 4)
    return text if len(text) <= most else "..." + text[-(most - 3) :]


def _thumbnail(image: Image.Image, side: int) -> Image.Image:
    """`image` shrunk to fit a side x side square, centred on grey; at least a pixel thin (a
    20000 x 10 panorama too)."""
    scale = side / max(image.size)
    size = tuple(max(1, round(length * scale)) for length in image.size)
    tile = Image.new("RGB", (side, side), (32, 32, 32))
    tile.paste(image.resize(size), ((side - size[0]) // 2, (side - size[1]) // 2))
    return tile


@dataclasses.dataclass(frozen=True)
class RecordReport:
    """What the first few records of a dataset hold.

    Attributes:
      files: the shard files found.
      records_read: how many records were looked at (from the first files).
      keys: feature keys and their kinds, over the records read.
      labels: label (as `label_text` shows it) to count, over the records read.
      heights: smallest and largest image height.
      widths: smallest and largest image width.
      problems: records that do not parse, or whose image does not decode to its stated shape.
    """

    files: tuple[str, ...]
    records_read: int
    keys: dict[str, str]
    labels: dict[str, int]
    heights: tuple[int, int] | None
    widths: tuple[int, int] | None
    problems: tuple[str, ...]

    def __str__(self):
        lines = [f"{len(self.files)} files; read {self.records_read} records"]
        lines += [f"  {key}: {kind}" for key, kind in sorted(self.keys.items())]
        if self.labels:
            lines.append(
                "labels: " + ", ".join(f"{label} x{n}" for label, n in sorted(self.labels.items()))
            )
        if self.heights and self.widths:
            lines.append(
                f"image height {self.heights[0]}..{self.heights[1]}, "
                f"width {self.widths[0]}..{self.widths[1]}"
            )
        lines += [f"PROBLEM {problem}" for problem in self.problems]
        return "\n".join(lines)


def sample_records(
    path: str, num_records: int = 32, label_offset: int | None = None
) -> RecordReport:
    """Reads the first `num_records` records of a dataset folder or file pattern, closely.

    Records are parsed with the record format (`schema.decode_example`) and their images
    decoded with `tf.io.decode_jpeg`, as the reader will; anything that fails is a problem in
    the report, not an exception.
    """
    found = dataset_lib.resolve(path)
    offset = _offset(found, label_offset)
    keys: dict[str, str] = {}
    labels: collections.Counter = collections.Counter()
    heights, widths, problems = [], [], []
    read = 0
    files = tf.constant(_present(found), tf.string, shape=[len(_present(found))])
    serialized = tf.data.Dataset.from_tensor_slices(files).flat_map(
        lambda path: records.shard_records(path, found.compression, found.file_format)
    )  # the shards one after another
    try:
        for element in serialized.take(num_records):
            read += 1
            raw = element.numpy()
            try:
                keys.update({key: kind for key, (kind, _) in schema.parse_features(raw).items()})
            except ValueError:
                pass  # decode_example says what is wrong with it
            try:
                record = schema.decode_example(raw, label_offset=0)  # stored labels
            except ValueError as err:
                problems.append(f"record {read}: {err}")
                continue
            labels[label_text(record.label_index, record.label_text, offset, found.labels)] += 1
            image = records.image_problem(record)
            if image is not None:
                problems.append(f"record {read} ({record.filename}): {image}")
                if image.startswith(records.DOES_NOT_DECODE):
                    continue
            heights.append(record.height)
            widths.append(record.width)
    except tf.errors.OpError as err:
        problems.append(f"reading stopped after {read} records: {err.message}")
    return RecordReport(
        files=found.files,
        records_read=read,
        keys=keys,
        labels=dict(labels),
        heights=(min(heights), max(heights)) if heights else None,
        widths=(min(widths), max(widths)) if widths else None,
        problems=tuple(problems),
    )
