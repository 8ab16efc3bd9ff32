"""Conversion throughput against a ceiling measured in the same run, and peak memory vs N.

Ceiling: every input read and fully decoded once with Pillow, in one process per core.
Job: `python -m beam_jobs.convert SRC OUT` with its local defaults (one in-process worker
checking inputs on a thread per core).
On a shared machine one ceiling measurement alone can move by a quarter, so both are measured
several times, alternating (ceiling, job, ceiling, job, ..., ceiling), and the table shows the
median of each; every measurement is printed as well.
Peak RSS: the largest process of the job (ru_maxrss), the largest over the runs, at N and 4N.

Run: .venv/bin/python -m benchmarks.convert_bench [--images N] [--side PX] [--repeats R]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import pathlib
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
from PIL import Image

from benchmarks import command_line, photos
from tfrecord_pipe._core import progress


def make_photo_like(folder: pathlib.Path, count: int, side: int, seed: int = 0) -> None:
    """`count` photo-like side x side JPEGs in ten label folders."""
    rng = np.random.default_rng(seed)
    line = progress.StatusLine()
    for i in range(count):
        label = folder / f"class{i % 10}"
        label.mkdir(parents=True, exist_ok=True)
        (label / f"{i:06d}.jpg").write_bytes(photos.photo_like_jpeg(rng, side, side))
        line.update(f"  generating images: {i + 1}/{count}")
    line.finish(f"  generated {count} images")


def _decode(path: str) -> int:
    with open(path, "rb") as f:
        image = Image.open(f)
        image.load()
    return image.size[0]


def ceiling(files: list[str]) -> float:
    """Images/s for read + full Pillow decode over all cores."""
    started = time.perf_counter()
    with multiprocessing.Pool(os.cpu_count()) as pool:
        for _ in pool.imap_unordered(_decode, files, chunksize=32):
            pass
    return len(files) / (time.perf_counter() - started)


def run_job(src: pathlib.Path, out: pathlib.Path) -> tuple[float, float]:
    """(images/s, peak RSS MiB of the largest job process), in a fresh process."""
    command = [sys.executable, "-c", (
        "import resource, sys, time; from beam_jobs import convert; t = time.perf_counter();"
        f"convert.run([{str(src)!r}, {str(out)!r}], save_main_session=False);"
        "d = time.perf_counter() - t;"
        "r = max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,"
        " resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss);"
        "print('RESULT', d, r)")]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    result = subprocess.run(command, capture_output=True, text=True, env=env)
    if result.returncode:
        raise RuntimeError(f"the conversion job failed:\n{result.stderr[-4000:]}")
    line = next(li for li in result.stdout.splitlines() if li.startswith("RESULT"))
    _, seconds, max_rss_kib = line.split()
    peak_children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    count = sum(1 for _ in src.rglob("*.jpg"))
    return count / float(seconds), max(int(max_rss_kib), peak_children) / 1024


def measure(src: pathlib.Path, work: pathlib.Path, repeats: int) -> tuple[float, float, float]:
    """(median ceiling img/s, median job img/s, peak RSS MiB), alternating the two."""
    files = [str(p) for p in src.rglob("*.jpg")]
    ceilings, jobs, peaks = [ceiling(files)], [], []
    for run in range(repeats):
        print(f"  job run {run + 1}/{repeats}, then the ceiling again...", flush=True)
        rate, peak = run_job(src, work / f"out-{src.name}-{run}")
        jobs.append(rate)
        peaks.append(peak)
        ceilings.append(ceiling(files))
    print(f"  ceiling {', '.join(f'{c:.0f}' for c in ceilings)} img/s; "
          f"job {', '.join(f'{j:.0f}' for j in jobs)} img/s")
    return statistics.median(ceilings), statistics.median(jobs), max(peaks)


def cached_images(folder: pathlib.Path, count: int, side: int) -> pathlib.Path:
    """`count` photo-like images of `side` px in a folder of `folder` named after them, made
    unless a finished one is there (a marker beside it, written last: not an input)."""
    src = folder / f"photo-like-{count}x{side}px"
    done = folder / f"{src.name}.complete"
    if not done.exists():
        shutil.rmtree(src, ignore_errors=True)
        make_photo_like(src, count, side)
        done.write_text("")
    else:
        print(f"  reusing {src}")
    return src


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=1000, help="N (the memory run uses 4N)")
    parser.add_argument("--side", type=int, default=320, help="image side in pixels")
    parser.add_argument("--repeats", type=int, default=3, help="job runs per size")
    parser.add_argument("--cache", type=pathlib.Path,
                        help="keep the generated images in this folder and reuse them in "
                        "later runs (an A/B comparison then spends no time generating them)")
    args = parser.parse_args(argv)
    work = pathlib.Path(tempfile.mkdtemp(prefix="convert-bench-"))
    rows = []
    try:
        for n in (args.images, 4 * args.images):
            print(f"N={n}:")
            src = cached_images(args.cache or work, n, args.side)
            top, job, rss = measure(src, work, args.repeats)
            rows.append((n, top, job, rss))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"\n{command_line('benchmarks.convert_bench', argv)}   ({os.cpu_count()} cores, "
          f"{args.side}x{args.side} JPEGs)")
    print(f"medians of {args.repeats} job runs and {args.repeats + 1} ceiling runs, alternating")
    print("| images | ceiling img/s | job img/s | job / ceiling | peak RSS MiB |")
    print("|---|---|---|---|---|")
    for n, top, job, rss in rows:
        print(f"| {n} | {top:.0f} | {job:.0f} | {job / top:.2f}x | {rss:.0f} |")
    print(f"peak RSS at 4N / N: {rows[1][3] / rows[0][3]:.2f}x (target <= 1.2x); "
          f"job / ceiling target >= 0.5x")
    return rows


if __name__ == "__main__":
    main()
