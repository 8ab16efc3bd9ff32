"""What a dataset holds, for a person: a summary with histograms, and a contact sheet.

Used by `tfrecord-pipe inspect`. Counts come from the manifest; label and image-size
histograms from reading records (a sample spread over all shards, or all of them); with
`check_counts` every shard is read and its record count compared with the manifest's.
"""

from __future__ import annotations

import collections
import dataclasses
import io
import json
import math
import posixpath
import statistics

import tensorflow as tf
from PIL import Image, ImageDraw, ImageOps

from tfrecord_pipe import manifest as manifest_lib
from tfrecord_pipe import schema, validate

DEFAULT_SAMPLE = 5000  # records read per split for the histograms
_BAR = 30  # width of the longest histogram bar, in characters


@dataclasses.dataclass(frozen=True)
class Shard:
    """Attributes: path; num_bytes; listed: records per the manifest (None without one);
    counted: records actually read (None unless counts were checked)."""

    path: str
    num_bytes: int
    listed: int | None
    counted: int | None = None


@dataclasses.dataclass(frozen=True)
class SplitSummary:
    """Attributes: name; shards; records read for the histograms (read_all: every record);
    label text to count among them; image heights and widths among them."""

    name: str
    shards: tuple[Shard, ...]
    read: int
    read_all: bool
    labels: dict[str, int]
    heights: tuple[int, ...]
    widths: tuple[int, ...]

    @property
    def listed(self) -> int | None:
        counts = [shard.listed for shard in self.shards]
        return None if None in counts else sum(counts)


@dataclasses.dataclass(frozen=True)
class DatasetSummary:
    """Attributes: path; the manifest (None for a bare file pattern); split summaries;
    rejected reason to count; a few rejected lines as written by the converter."""

    path: str
    manifest: manifest_lib.Manifest | None
    splits: tuple[SplitSummary, ...]
    rejected: dict[str, int]
    rejected_examples: tuple[dict, ...]

    @property
    def count_problems(self) -> list[str]:
        return [
            f"{shard.path}: manifest lists {shard.listed} records, the shard holds {shard.counted}"
            for split in self.splits
            for shard in split.shards
            if shard.counted is not None and shard.listed is not None and shard.counted != shard.listed
        ]


def summarize(path: str, sample: int | None = DEFAULT_SAMPLE, check_counts: bool = False):
    """Reads what `path` (a dataset folder or a file pattern) holds.

    Args:
      path: dataset folder (with manifest.json) or a pattern of TFRecord files.
      sample: records read per split for the histograms, spread over all shards; None: all.
      check_counts: read every shard fully and count its records.

    Raises:
      ValueError: nothing to inspect at `path`; the message says what was expected.
    """
    folder = path.rstrip("/") or path
    files, compression, found = validate.shard_files(path)
    if found is not None:
        groups = {
            name: [
                (posixpath.join(folder, file), length)
                for file, length in zip(info.files, info.shard_lengths)
            ]
            for name, info in found.splits.items()
        }
    else:
        groups = collections.defaultdict(list)
        for file in files:
            groups[posixpath.basename(file).split("-")[0]].append((file, None))
    offset = found.label_offset if found else 0
    names = found.labels if found else None
    splits = tuple(
        _split_summary(name, shards, compression, sample, check_counts, offset, names)
        for name, shards in groups.items()
    )
    rejected, examples = {}, ()
    if found is not None:
        rejected = dict(found.rejected_reasons)
        examples = tuple(_rejected_lines(folder, limit=5))
    return DatasetSummary(path, found, splits, rejected, examples)


def _split_summary(name, shards, compression, sample, check_counts, offset, label_names):
    paths = [path for path, _ in shards]
    sizes = [tf.io.gfile.stat(path).length for path in paths]
    counted = [None] * len(paths)
    if check_counts:
        counted = [_count(path, compression) for path in paths]
    spec = {key: schema.parse_spec()[key] for key in (schema.LABEL, schema.SYNSET, schema.HEIGHT, schema.WIDTH)}
    records = (
        tf.data.Dataset.from_tensor_slices(paths)
        .interleave(
            lambda p: tf.data.TFRecordDataset(p, compression_type=compression),
            cycle_length=max(1, len(paths)),  # one record from each shard in turn: a spread sample
        )
    )
    if sample is not None:
        records = records.take(sample)
    labels, heights, widths, read = collections.Counter(), [], [], 0
    for batch in records.batch(1024).map(lambda r: tf.io.parse_example(r, spec)):
        read += len(batch[schema.LABEL])
        for label, text in zip(batch[schema.LABEL].numpy(), batch[schema.SYNSET].numpy()):
            index = int(label) - offset
            known = label_names is not None and 0 <= index < len(label_names)
            labels[label_names[index] if known else text.decode("utf-8", "replace")] += 1
        heights.extend(int(h) for h in batch[schema.HEIGHT].numpy())
        widths.extend(int(w) for w in batch[schema.WIDTH].numpy())
    return SplitSummary(
        name=name,
        shards=tuple(
            Shard(path, size, listed, count)
            for (path, listed), size, count in zip(shards, sizes, counted)
        ),
        read=read,
        read_all=sample is None or read < sample,
        labels=dict(labels),
        heights=tuple(heights),
        widths=tuple(widths),
    )


def _count(path: str, compression: str) -> int:
    dataset = tf.data.TFRecordDataset(path, compression_type=compression)
    return int(dataset.reduce(tf.constant(0, tf.int64), lambda n, _: n + 1))


def _rejected_lines(folder: str, limit: int):
    pattern = posixpath.join(folder, manifest_lib.REJECTED_DIR, "*.jsonl")
    for path in sorted(tf.io.gfile.glob(pattern)):
        with tf.io.gfile.GFile(path) as lines:
            for line in lines:
                if line.strip():
                    yield json.loads(line)
                    limit -= 1
                    if limit == 0:
                        return


def render(summary: DatasetSummary) -> str:
    """The summary as text: splits and shards, label histogram, image sizes, rejections."""
    lines = [f"{summary.path}"]
    found = summary.manifest
    if found:
        lines.append(
            f"  {len(found.labels)} labels, label_offset {found.label_offset}, "
            f"{'GZIP' if found.compression else 'uncompressed'}, written by tfrecord-pipe "
            f"{found.tool_version or '?'} (format {found.format_version})"
        )
    else:
        lines.append("  no manifest.json: a bare file pattern (counts read from the shards)")
    for split in summary.splits:
        total_bytes = sum(shard.num_bytes for shard in split.shards)
        sizes = [shard.num_bytes for shard in split.shards]
        listed = split.listed
        if listed is None and split.read_all:
            listed = split.read  # no manifest, but every record was read
        lines.append("")
        lines.append(
            f"{split.name}: {listed if listed is not None else f'at least {split.read}'} records in "
            f"{len(split.shards)} shards, {_mb(total_bytes)} "
            f"(shards {_mb(min(sizes))}..{_mb(max(sizes))})"
        )
        checked = [shard for shard in split.shards if shard.counted is not None]
        if checked:
            bad = [s for s in checked if s.listed is not None and s.counted != s.listed]
            lines.append(
                f"  counts checked against the shards: {'OK' if not bad else f'{len(bad)} differ'}"
                f" ({sum(s.counted for s in checked)} records read)"
            )
        if split.read:
            sampled = "" if listed is None or split.read >= listed else f", a sample of {split.read}"
            lines.append(f"  labels (records read{sampled}):")
            lines += _histogram(split.labels)
            lines.append(
                f"  image height {_stats(split.heights)}; width {_stats(split.widths)}"
            )
            longest = [max(h, w) for h, w in zip(split.heights, split.widths)]
            lines.append("  longer side:")
            lines += _histogram(_size_buckets(longest), sort_by_count=False)
    if found:
        lines.append("")
        if summary.rejected:
            reasons = ", ".join(f"{reason} {n}" for reason, n in sorted(summary.rejected.items()))
            lines.append(f"rejected: {sum(summary.rejected.values())} ({reasons})")
            for row in summary.rejected_examples:
                lines.append(f"  {row.get('path')}: {row.get('reason')}: {row.get('error')}")
        else:
            lines.append("rejected: none")
    lines += [f"PROBLEM {problem}" for problem in summary.count_problems]
    return "\n".join(lines)


def _mb(num_bytes: int) -> str:
    return f"{num_bytes / (1 << 20):.1f} MiB"


def _stats(values) -> str:
    return f"{min(values)}..{max(values)} (median {statistics.median(values):g})"


def _histogram(counts: dict, sort_by_count: bool = True) -> list[str]:
    items = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])) if sort_by_count else list(counts.items())
    top = max(counts.values())
    width = max(len(str(key)) for key, _ in items)
    return [
        f"    {str(key):<{width}} {'█' * max(1, round(_BAR * n / top))} {n}" for key, n in items
    ]


def _size_buckets(sides) -> dict[str, int]:
    """Counts per power-of-two range of the longer side: '<64', '64-127', ..."""
    buckets = collections.Counter()
    for side in sides:
        low = 1 << max(6, int(math.log2(max(side, 1))))
        buckets[low if side >= 64 else 0] += 1
    return {("<64" if low == 0 else f"{low}-{2 * low - 1}"): buckets[low] for low in sorted(buckets)}


def contact_sheet(path: str, output: str, count: int = 24, columns: int = 6, thumb: int = 128):
    """Writes a PNG grid of `count` records (spread over the shards) with the label under each.

    Args:
      path: dataset folder or file pattern.
      output: PNG path, local or gs://.
      count: number of records shown.
      columns: thumbnails per row.
      thumb: thumbnail side, in pixels.

    Returns:
      The number of records drawn.
    """
    files, compression, found = validate.shard_files(path)
    offset, names = (found.label_offset, found.labels) if found else (0, None)
    records = tf.data.Dataset.from_tensor_slices(list(files)).interleave(
        lambda p: tf.data.TFRecordDataset(p, compression_type=compression),
        cycle_length=len(files),
    )
    tiles = []
    for serialized in records.take(count):
        record = schema.decode_example(serialized.numpy(), label_offset=offset)
        image = Image.open(io.BytesIO(record.encoded)).convert("RGB")
        image = ImageOps.pad(image, (thumb, thumb), color=(32, 32, 32))
        text = names[record.label_index] if names and 0 <= record.label_index < len(names) else record.label_text
        tiles.append((image, f"{text} ({record.label_index})"))
    if not tiles:
        raise ValueError(f"No records to draw in {path}")
    caption = 18
    rows = math.ceil(len(tiles) / columns)
    sheet = Image.new("RGB", (columns * (thumb + 4) + 4, rows * (thumb + caption + 4) + 4), "white")
    pen = ImageDraw.Draw(sheet)
    for i, (image, text) in enumerate(tiles):
        x = 4 + (i % columns) * (thumb + 4)
        y = 4 + (i // columns) * (thumb + caption + 4)
        sheet.paste(image, (x, y))
        pen.text((x + 2, y + thumb + 3), text[: thumb // 7], fill="black")
    buffer = io.BytesIO()
    sheet.save(buffer, format="PNG")
    with tf.io.gfile.GFile(output, "wb") as f:
        f.write(buffer.getvalue())
    return len(tiles)
