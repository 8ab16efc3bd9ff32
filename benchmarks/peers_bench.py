"""The conversion beside what a user would pick instead, on the same folder of JPEGs.

Each tool runs in its own process, in turn, several rounds; the table gives medians of its
wall-clock images/s (the process's start included, as a user waits for it), its images per
CPU-second (user + system time of the process and its children: what "per core" means when
tools use different numbers of cores), and its peak RSS. Each round also runs each tool on
the first FEW images of the folder (hard links), for its start-up's CPU, and so its CPU per
further image: what the images per CPU-second tend to at scale, where the start-up no longer
counts (a TensorFlow import is some 3 CPU-seconds, most of a tool's CPU at a few thousand
images).

- tfrecord-pipe: `python -m beam_jobs.convert SRC OUT` with its local defaults.
- tfds builder: a TensorFlow Datasets `GeneratorBasedBuilder` over the folder, its image a
  `tfds.features.Image` given the file's path, written by `download_and_prepare` (the way a
  TFDS user makes a dataset of their own folder; TFDS writes TFRecord).
- imagenet_to_gcs: the Cloud TPU `tools/datasets/imagenet_to_gcs.py` way: one process, the
  shards one after another, each file read, decoded with TensorFlow to learn its size (and
  that it decodes), its bytes put in a `tf.train.Example`, written with a TFRecord writer.
- jpeg_to_tf_record: the Cloud TPU `tools/datasets/jpeg_to_tf_record.py` way: a Beam
  pipeline (Beam's local runner here, as that script runs without a cloud output) that does
  the same per image in a `FlatMap` and writes with `beam.io.WriteToTFRecord`.

The two Cloud TPU tools are written here after the published scripts' steps (they are
TensorFlow 1 code, with a session per decode, and cannot be fetched in a test run): the same
work per image in TensorFlow 2's eager ops, not their code.

Run: .venv/bin/python -m benchmarks.peers_bench [--images N] [--side PX] [--repeats R]
                                                [--cache DIR]
"""

from __future__ import annotations

import argparse
import os
import pathlib
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from benchmarks import command_line

TOOLS = ("tfrecord-pipe", "tfds builder", "imagenet_to_gcs", "jpeg_to_tf_record")
SHARDS = 16
FEW = 2  # images of each label folder in the start-up's run


def labelled_files(src: pathlib.Path) -> list[tuple[str, str]]:
    """(path, label) of every JPEG under src/label/, sorted."""
    return sorted((str(p), p.parent.name) for p in src.glob("*/*.jpg"))


def example(encoded: bytes, height: int, width: int, label: int, text: str, name: str):
    """The Cloud TPU scripts' record: image bytes, size, label, synset and file name."""
    import tensorflow as tf

    def b(value):
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))

    def i(value):
        return tf.train.Feature(int64_list=tf.train.Int64List(value=[value]))

    return tf.train.Example(features=tf.train.Features(feature={
        "image/encoded": b(encoded), "image/height": i(height), "image/width": i(width),
        "image/class/label": i(label), "image/class/synset": b(text.encode()),
        "image/filename": b(name.encode()), "image/format": b(b"JPEG"),
    }))  # fmt: skip


def _decoded_example(name: str, label: str, labels: list[str]) -> bytes:
    """One input as both Cloud TPU scripts make it: its bytes kept, decoded with TensorFlow
    for its size (which also proves it decodes)."""
    import tensorflow as tf

    encoded = tf.io.gfile.GFile(name, "rb").read()
    image = tf.io.decode_jpeg(encoded, channels=3)
    height, width = int(image.shape[0]), int(image.shape[1])
    return example(encoded, height, width, labels.index(label) + 1, label,
                   os.path.basename(name)).SerializeToString()  # fmt: skip


def run_imagenet_to_gcs(src: pathlib.Path, out: pathlib.Path) -> None:
    """The shards one after another in this process, each image decoded with TensorFlow."""
    import tensorflow as tf

    files = labelled_files(src)
    labels = sorted({label for _, label in files})
    out.mkdir(parents=True)
    per_shard = -(-len(files) // SHARDS)
    for index in range(SHARDS):
        path = out / f"train-{index:05d}-of-{SHARDS:05d}"
        with tf.io.TFRecordWriter(str(path)) as writer:
            for name, label in files[index * per_shard : (index + 1) * per_shard]:
                writer.write(_decoded_example(name, label, labels))


def run_jpeg_to_tf_record(src: pathlib.Path, out: pathlib.Path) -> None:
    """A Beam pipeline: the same per-image work in a FlatMap, WriteToTFRecord."""
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    files = labelled_files(src)
    labels = sorted({label for _, label in files})
    options = PipelineOptions(["--direct_num_workers=1", "--direct_running_mode=in_memory"])
    with beam.Pipeline(options=options) as pipeline:
        _ = (
            pipeline
            | beam.Create(files)
            | beam.FlatMap(lambda item: [_decoded_example(*item, labels)])
            | beam.io.WriteToTFRecord(str(out / "train"))
        )


def run_tfds(src: pathlib.Path, out: pathlib.Path) -> None:
    """A TFDS builder of the folder, prepared into `out`."""
    import tensorflow_datasets as tfds

    files = labelled_files(src)
    labels = sorted({label for _, label in files})

    class Folder(tfds.core.GeneratorBasedBuilder):
        VERSION = tfds.core.Version("1.0.0")

        def _info(self):
            return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict({
                "image": tfds.features.Image(encoding_format="jpeg"),
                "label": tfds.features.ClassLabel(names=labels),
            }))  # fmt: skip

        def _split_generators(self, dl_manager):
            return {"train": self._generate_examples()}

        def _generate_examples(self):
            for name, label in files:
                yield name, {"image": name, "label": label}

    Folder(data_dir=str(out)).download_and_prepare()


def run_ours(src: pathlib.Path, out: pathlib.Path) -> None:
    from beam_jobs import convert, fork_server

    convert.run([str(src), str(out), "--num_shards", str(SHARDS)])
    # Ended and waited for, as at exit, so that its workers' time and peaks count as this
    # process's children's in `_usage`.
    fork_server.stop()


RUNS = {"tfrecord-pipe": run_ours, "tfds builder": run_tfds,
        "imagenet_to_gcs": run_imagenet_to_gcs, "jpeg_to_tf_record": run_jpeg_to_tf_record}  # fmt: skip


def measure(tool: str, src: pathlib.Path, work: pathlib.Path, count: int) -> tuple[float, float, float]:
    """(images/s, images per CPU-second, peak RSS MiB) of one run of `tool`, in its own process."""
    out = work / f"out-{tool.replace(' ', '_')}"
    shutil.rmtree(out, ignore_errors=True)
    command = [sys.executable, "-m", "benchmarks.peers_bench", "--run", tool, "--src", str(src),
               "--out", str(out)]  # fmt: skip
    # Each tool's temporary files go with the benchmark's folder: Beam's job server left a
    # beam-temp* folder in /tmp at each run of jpeg_to_tf_record.
    temp = work / "tmp"
    temp.mkdir(exist_ok=True)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", TMPDIR=str(temp))
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - started
    line = next((li for li in done.stdout.splitlines() if li.startswith("USAGE ")), None)
    if done.returncode != 0 or line is None:
        raise RuntimeError(f"{tool} failed: {done.stderr[-2000:]}")
    cpu, peak_kb = (float(v) for v in line.split()[1:])
    shutil.rmtree(out, ignore_errors=True)
    return count / wall, count / cpu, peak_kb / 1024


def first_few(src: pathlib.Path, work: pathlib.Path) -> tuple[pathlib.Path, int]:
    """A folder of the first FEW images of each of src's label folders (hard links), and its
    image count."""
    few = work / "first-few"
    shutil.rmtree(few, ignore_errors=True)
    count = 0
    for label in sorted(path for path in src.iterdir() if path.is_dir()):
        (few / label.name).mkdir(parents=True)
        for image in sorted(label.glob("*.jpg"))[:FEW]:
            try:
                os.link(image, few / label.name / image.name)
            except OSError:  # a cache on another disk
                shutil.copyfile(image, few / label.name / image.name)
            count += 1
    return few, count


def _usage() -> str:
    """`USAGE cpu_seconds peak_rss_kb` of this process and its children (workers). Its own
    peak is VmHWM: ru_maxrss survives exec, and would begin at the benchmark's size."""
    mine, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(
        resource.RUSAGE_CHILDREN
    )
    cpu = mine.ru_utime + mine.ru_stime + children.ru_utime + children.ru_stime
    with open("/proc/self/status") as status:
        peak = next(int(line.split()[1]) for line in status if line.startswith("VmHWM"))
    return f"USAGE {cpu} {max(peak, children.ru_maxrss)}"


def main(argv=None):
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--side", type=int, default=320, help="image side in pixels")
    parser.add_argument("--repeats", type=int, default=3, help="rounds over the tools")
    parser.add_argument("--cache", type=pathlib.Path, help="keep the generated images here")
    parser.add_argument("--run", choices=TOOLS, help=argparse.SUPPRESS)
    parser.add_argument("--src", type=pathlib.Path, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=pathlib.Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.run:
        RUNS[args.run](args.src, args.out)
        print(_usage(), flush=True)
        return None

    from benchmarks import compiled, convert_bench

    compiled.compile_project()  # as a user's install has it (compiled.py)
    work = pathlib.Path(tempfile.mkdtemp(prefix="peers-bench-"))
    try:
        src = convert_bench.cached_images(args.cache or work, args.images, (args.side, args.side), 10)
        few, few_count = first_few(src, work)
        rounds = {tool: [] for tool in TOOLS}
        for round_index in range(args.repeats):
            for tool in TOOLS:
                started = time.perf_counter()
                _, few_rate, _ = measure(tool, few, work, few_count)
                rounds[tool].append((*measure(tool, src, work, args.images), few_count / few_rate))
                rate = rounds[tool][-1][0]
                print(f"  round {round_index + 1}/{args.repeats}: {tool:17s} {rate:6.0f} images/s "
                      f"({time.perf_counter() - started:.0f} s)", flush=True)  # fmt: skip
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("\n" + command_line("benchmarks.peers_bench", argv)
          + f"   ({os.cpu_count()} cores; {args.images} photo-like {args.side} px JPEGs; "
          f"medians of {args.repeats} rounds)")  # fmt: skip
    print("| tool | images/s | images per CPU-second | peak RSS MiB | ours / it, per CPU-second "
          "| start-up CPU-s | CPU ms per further image | ours / it, per further image |")
    print("|---|---|---|---|---|---|---|---|")
    further = args.images - few_count

    def per_image_ms(run) -> float:  # the run's CPU less its round's start-up, per image
        return (args.images / run[1] - run[3]) / further * 1000

    ours = statistics.median(r[1] for r in rounds["tfrecord-pipe"])
    ours_ms = statistics.median(per_image_ms(r) for r in rounds["tfrecord-pipe"])
    for tool, runs in rounds.items():
        rate = statistics.median(r[0] for r in runs)
        per_cpu = statistics.median(r[1] for r in runs)
        peak = max(r[2] for r in runs)
        start = statistics.median(r[3] for r in runs)
        ms = statistics.median(per_image_ms(r) for r in runs)
        print(f"| {tool} | {rate:.0f} | {per_cpu:.0f} | {peak:.0f} | {ours / per_cpu:.2f}x "
              f"| {start:.2f} | {ms:.3f} | {ms / ours_ms:.2f}x |")
    print("goal: tfrecord-pipe >= 2x the fastest other tool per CPU-second "
          f"(start-up: {few_count} images; further images: the other {further})")


if __name__ == "__main__":
    main()
