"""Conversion throughput against a ceiling measured in the same run, and peak memory vs N.

Ceiling: every input read and fully decoded once with Pillow, in one process per core.
Job: `python -m beam_jobs.convert SRC OUT` with its local defaults (the local engine, a worker
process per core).
On a shared machine one ceiling measurement alone can move by a quarter, so both are measured
several times, alternating (ceiling, job, ceiling, job, ..., ceiling), and the table shows the
median of each; every measurement is printed as well.
Peak RSS: the largest process of the job (VmHWM; its workers' ru_maxrss), the largest over the runs, at N and KN.

With --verify, `verify` runs on each job run's output too: its images/s and peak beside the
job's (the issue's targets: at least as fast, at most 1.5x the memory).

Run: .venv/bin/python -m benchmarks.convert_bench [--images N] [--larger K] [--side PX or A-B]
     [--labels L] [--repeats R] [--cache FOLDER] [--verify]
The issue's scale sets: --images 50000 --larger 10 --side 48-96 --labels 100.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
from PIL import Image

from benchmarks import command_line, compiled, photos
from tfrecord_pipe._core import progress


def make_photo_like(folder: pathlib.Path, count: int, sides: tuple[int, int], labels: int,
                    seed: int = 0) -> None:  # fmt: skip
    """`count` distinct photo-like square JPEGs, sides drawn from `sides` (least, most), in
    `labels` label folders; made on every core."""
    for label in range(labels):
        (folder / f"class{label}").mkdir(parents=True, exist_ok=True)
    line = progress.StatusLine()
    chunks = [(folder, start, min(start + 1000, count), sides, labels, seed)
              for start in range(0, count, 1000)]  # fmt: skip
    with multiprocessing.Pool(os.cpu_count()) as pool:
        for done, _ in enumerate(pool.imap_unordered(_make_chunk, chunks), start=1):
            line.update(f"  generating images: {min(done * 1000, count)}/{count}")
    line.finish(f"  generated {count} images")


def _make_chunk(args) -> None:
    folder, start, stop, (least, most), labels, seed = args
    rng = np.random.default_rng([seed, start])
    for i in range(start, stop):
        side = int(rng.integers(least, most + 1))
        path = folder / f"class{i % labels}" / f"{i:07d}.jpg"
        path.write_bytes(photos.photo_like_jpeg(rng, side, side))


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
    call = f"convert.run([{str(src)!r}, {str(out)!r}], save_main_session=False)"
    return _timed(src, f"{_SERVER_FIRST}; from beam_jobs import convert", call, "the conversion job")


def run_verify(src: pathlib.Path, out: pathlib.Path) -> tuple[float, float]:
    """`tfrecord-pipe verify SRC OUT`'s (images/s, peak RSS MiB of its largest process)."""
    call = (f"report = verify.verify({str(src)!r}, {str(out)!r});"
            "assert report.ok, report")  # fmt: skip
    # The modules verify imports as it starts (`verify_reading.source_config`), imported before
    # the timed part, as the job's are by `from beam_jobs import convert`.
    imports = f"{_SERVER_FIRST}; from tfrecord_pipe._tools import verify; from beam_jobs import flags"
    return _timed(src, imports, call, "verify")


# As the commands start (`python -m beam_jobs.convert`, the CLI): the workers' server imports
# the job's modules while the process imports its own, before the timed part.
_SERVER_FIRST = "from beam_jobs import worker_pool; worker_pool.start_server()"


def _timed(src: pathlib.Path, imports: str, call: str, what: str) -> tuple[float, float]:
    command = [sys.executable, "-c", (
        f"import resource, sys, time; {imports}; t = time.perf_counter(); {call};"
        "d = time.perf_counter() - t;"
        # Ended and waited for, so that its workers' peaks count as this process's children's.
        "from beam_jobs import fork_server; fork_server.stop();"
        # VmHWM, not ru_maxrss, for the job's own process: ru_maxrss survives exec, and
        # counted this process's memory before it (its list of 500,000 paths: +60 MiB).
        "hwm = next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmHWM'));"
        "r = max(hwm, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss);"
        "print('RESULT', d, r)")]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    result = subprocess.run(command, capture_output=True, text=True, env=env)
    if result.returncode:
        raise RuntimeError(f"{what} failed:\n{result.stderr[-4000:]}")
    line = next(li for li in result.stdout.splitlines() if li.startswith("RESULT"))
    _, seconds, max_rss_kib = line.split()
    # Only what the job's process says: this process's own children include the ceiling's
    # pool workers, which hold a copy of its list of every path.
    count = sum(1 for _ in src.rglob("*.jpg"))
    return count / float(seconds), int(max_rss_kib) / 1024


def measure(src: pathlib.Path, work: pathlib.Path, repeats: int, verify: bool = False) -> dict:
    """Medians of ceiling, job (and verify) images/s, and their peak RSS MiB: runs alternating
    ceiling, job (, verify of the job's output), ceiling, ..."""
    files = [str(p) for p in src.rglob("*.jpg")]
    ceilings, jobs, peaks, verifies, verify_peaks = [ceiling(files)], [], [], [], []
    for run in range(repeats):
        print(f"  job run {run + 1}/{repeats}{', verify' if verify else ''}, then the ceiling "
              "again...", flush=True)  # fmt: skip
        out = work / f"out-{src.name}-{run}"
        rate, peak = run_job(src, out)
        jobs.append(rate)
        peaks.append(peak)
        if verify:
            rate, peak = run_verify(src, out)
            verifies.append(rate)
            verify_peaks.append(peak)
        shutil.rmtree(out, ignore_errors=True)
        ceilings.append(ceiling(files))
    print(f"  ceiling {', '.join(f'{c:.0f}' for c in ceilings)} img/s; "
          f"job {', '.join(f'{j:.0f}' for j in jobs)} img/s"
          + (f"; verify {', '.join(f'{v:.0f}' for v in verifies)} img/s" if verify else ""))
    measured = {"ceiling": statistics.median(ceilings), "job": statistics.median(jobs),
                "rss": max(peaks)}  # fmt: skip
    if verify:
        measured.update(verify=statistics.median(verifies), verify_rss=max(verify_peaks))
    return measured


def cached_images(folder: pathlib.Path, count: int, sides: tuple[int, int],
                  labels: int) -> pathlib.Path:  # fmt: skip
    """`count` photo-like images in a folder of `folder` named after them, made unless a
    finished one is there (a marker beside it, written last: not an input)."""
    side = f"{sides[0]}" if sides[0] == sides[1] else f"{sides[0]}-{sides[1]}"
    src = folder / f"photo-like-{count}x{side}px-{labels}labels"
    done = folder / f"{src.name}.complete"
    if not done.exists():
        shutil.rmtree(src, ignore_errors=True)
        make_photo_like(src, count, sides, labels)
        done.write_text("")
    else:
        print(f"  reusing {src}")
    return src


def main(argv=None):
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--images", type=int, default=1000, help="N")
    parser.add_argument("--larger", type=int, default=4, help="K: the second run has KN images")
    parser.add_argument("--side", type=_sides, default=(320, 320),
                        help="image side in pixels, or a range A-B each image's is drawn from")
    parser.add_argument("--labels", type=int, default=10, help="label folders")
    parser.add_argument("--repeats", type=int, default=3, help="job runs per size")
    parser.add_argument("--cache", type=pathlib.Path,
                        help="keep the generated images in this folder and reuse them in "
                        "later runs (an A/B comparison then spends no time generating them)")
    parser.add_argument("--verify", action="store_true",
                        help="also run `verify` on each job run's output")
    args = parser.parse_args(argv)
    compiled.compile_project()  # as a user's install has it (compiled.py)
    work = pathlib.Path(tempfile.mkdtemp(prefix="convert-bench-"))
    rows = []
    try:
        for n in (args.images, args.larger * args.images):
            print(f"N={n}:")
            src = cached_images(args.cache or work, n, args.side, args.labels)
            rows.append((n, measure(src, work, args.repeats, args.verify)))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    side = "-".join(map(str, sorted(set(args.side))))
    print(f"\n{command_line('benchmarks.convert_bench', argv)}   ({os.cpu_count()} cores, "
          f"{side} px square JPEGs in {args.labels} folders)")
    print(f"medians of {args.repeats} job runs and {args.repeats + 1} ceiling runs, alternating")
    print("| images | ceiling img/s | job img/s | job / ceiling | peak RSS MiB |"
          + (" verify img/s | verify / job | verify peak RSS MiB | / job's |" if args.verify else ""))
    print("|---|---|---|---|---|" + ("---|---|---|---|" if args.verify else ""))
    for n, m in rows:
        line = (f"| {n} | {m['ceiling']:.0f} | {m['job']:.0f} | {m['job'] / m['ceiling']:.2f}x "
                f"| {m['rss']:.0f} |")  # fmt: skip
        if args.verify:
            line += (f" {m['verify']:.0f} | {m['verify'] / m['job']:.2f}x | {m['verify_rss']:.0f} "
                     f"| {m['verify_rss'] / m['rss']:.2f}x |")  # fmt: skip
        print(line)
    (n, small), (_, large) = rows
    print(f"peak RSS at {args.larger}N / N: {large['rss'] / small['rss']:.2f}x (target <= 1.2x); "
          f"throughput at {args.larger}N / N: {large['job'] / small['job']:.2f}x (target >= 0.95x)")
    if args.verify:
        print(f"verify: peak RSS at {args.larger}N / N {large['verify_rss'] / small['verify_rss']:.2f}x; "
              "target: verify / job >= 1.0x throughput, <= 1.5x peak RSS")
    return rows


def _sides(text: str) -> tuple[int, int]:
    least, _, most = text.partition("-")
    return int(least), int(most or least)


if __name__ == "__main__":
    main()
