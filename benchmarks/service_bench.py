"""What the training host pays per image when tf.data service workers make its batches.

A dispatcher and one worker run in a child process, standing in for CPU machines beside the
accelerator host. This process times the training pipeline (`reader.build_dataset`) for each
output dtype, made here and made by the service (`ReaderConfig(data_service=...)`), in
alternating rounds, and reports images/s and this process's CPU time per image: the host's
share of the work. On one machine the worker competes with this process for the same cores,
so images/s say little; the host's CPU per image is the figure that carries over to a host
whose workers run elsewhere. "/ local" is that CPU time against making the batches here, in
the same round (median of the rounds, range in brackets).

Run: .venv/bin/python -m benchmarks.service_bench [--data SHARDS_FOLDER] [--seconds S]
                                                  [--repeats R]
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

_SERVER = """
import sys
import tensorflow as tf
api = tf.data.experimental.service
dispatcher = api.DispatchServer(api.DispatcherConfig(port=0))
address = dispatcher.target.replace("localhost", "127.0.0.1")
worker = api.WorkerServer(api.WorkerConfig(
    dispatcher_address=address.split("://")[1], worker_address="127.0.0.1:%port%", port=0))
print(address, flush=True)
sys.stdin.read()  # until the benchmark closes it
"""


def host_cost(config, seconds: float) -> tuple[float, float]:
    """(images/s, this process's CPU µs per image) of `config`'s training batches."""
    from tfrecord_pipe import reader
    from tfrecord_pipe._tools import bench

    iterator = iter(reader.build_dataset(config))
    for _ in range(bench.WARMUP_BATCHES):
        next(iterator)
    before, started, images = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter(), 0
    while time.perf_counter() - started < seconds:
        next(iterator)
        images += config.batch_size
    elapsed, after = time.perf_counter() - started, resource.getrusage(resource.RUSAGE_SELF)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return images / elapsed, 1e6 * cpu / images


def main(argv=None):
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--data", help="shards from the reader benchmark (default: write 3000)")
    parser.add_argument("--seconds", type=float, default=8.0, help="timed run per measurement")
    parser.add_argument("--repeats", type=int, default=2, help="rounds over all measurements")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--batch", type=int, default=128)
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    from benchmarks import reader_bench
    from tfrecord_pipe import preprocess, reader
    from tfrecord_pipe._core import progress

    data, created = args.data, None
    if data is None:
        data = created = tempfile.mkdtemp(prefix="service-bench-")
        reader_bench.write_shards(pathlib.Path(data), 3000, 16)
    server = subprocess.Popen(
        [sys.executable, "-c", _SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    dtypes = preprocess.DTYPES
    results = {(dtype, where): [] for dtype in dtypes for where in ("local", "service")}
    total, done, line = args.repeats * len(results), 0, progress.StatusLine(log_every_s=0)
    try:
        address = server.stdout.readline().strip()
        for _ in range(args.repeats):
            for dtype, where in results:
                config = reader.ReaderConfig(
                    data=data,
                    batch_size=args.batch,
                    image_size=args.image_size,
                    dtype=dtype,
                    data_service=address if where == "service" else None,
                )
                results[dtype, where].append(host_cost(config, args.seconds))
                done += 1
                line.update(f"  {progress.bar(done / total)} {done}/{total} {dtype} {where}")
    finally:
        server.stdin.close()
        server.wait()
        if created:
            shutil.rmtree(created, ignore_errors=True)
    line.finish(f"  {progress.bar(done / total)} {done}/{total} measured")

    print("\n" + command_line("benchmarks.service_bench", argv)
          + f"   ({os.cpu_count()} cores; one worker in a child process; "
          f"{args.image_size}x{args.image_size}, batch {args.batch}; medians of "
          f"{args.repeats} rounds)")  # fmt: skip
    print("| dtype | batches made | images/s | host CPU µs/image | / local (range) |")
    print("|---|---|---|---|---|")
    for (dtype, where), runs in results.items():
        rates, costs = zip(*runs)
        local = [cost for _, cost in results[dtype, "local"]]
        ratios = [cost / base for cost, base in zip(costs, local)]
        print(f"| {dtype} | {'here' if where == 'local' else 'by the service'} | "
              f"{statistics.median(rates):.0f} | {statistics.median(costs):.0f} | "
              f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f}) |")  # fmt: skip
    return results


if __name__ == "__main__":
    main()
