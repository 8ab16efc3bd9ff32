"""What reading a CSV list before the job costs: `sources.resolve_layout` (every line parsed
and checked: columns, quoting, joined files, URLs, split names) against a ceiling measured in
the same run, Python's `csv.reader` over the same file and nothing else.

    python -m benchmarks.csv_list_bench --lines 500000 --repeats 5

The list is made once per size in --cache (`path,label,split` lines, a thousand labels); no
image is read. Best of --repeats each, alternating.
"""

from __future__ import annotations

import argparse
import csv
import os
import tempfile
import time

from beam_jobs import sources
from beam_jobs.config import ConvertConfig
from benchmarks import command_line


def made_list(folder: str, lines: int) -> str:
    path = os.path.join(folder, f"list-{lines}.csv")
    if not os.path.exists(path):
        with open(path + ".part", "w", encoding="utf-8") as f:
            f.write("path,label,split\n")
            for i in range(lines):
                split = "validation" if i % 10 == 0 else "train"
                f.write(f"images/class{i % 1000}/img_{i:08d}.jpg,class{i % 1000},{split}\n")
        os.replace(path + ".part", path)
    return path


def ceiling(path: str) -> None:
    with open(path, encoding="utf-8", newline="") as f:
        for _ in csv.reader(f):
            pass


def checked(path: str) -> None:
    sources.resolve_layout(ConvertConfig(source=path, output=path + "-unused"))


def best(run, path: str) -> float:
    start = time.perf_counter()
    run(path)
    return time.perf_counter() - start


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--lines", type=int, default=500_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--cache", default=os.path.join(tempfile.gettempdir(), "csv_list_bench"))
    args = parser.parse_args(argv)
    os.makedirs(args.cache, exist_ok=True)
    path = made_list(args.cache, args.lines)
    times = {"csv.reader (ceiling)": [], "resolve_layout": []}
    for _ in range(args.repeats):
        times["csv.reader (ceiling)"].append(best(ceiling, path))
        times["resolve_layout"].append(best(checked, path))
    floor = min(times["csv.reader (ceiling)"])
    print(command_line("benchmarks.csv_list_bench", argv), f"  ({os.cpu_count()} cores)")
    print("| step | best s | us a line | / ceiling |")
    print("|---|---|---|---|")
    for name, runs in times.items():
        print(f"| {name} | {min(runs):.2f} | {min(runs) / args.lines * 1e6:.2f} | "
              f"{min(runs) / floor:.2f}x |")  # fmt: skip


if __name__ == "__main__":
    main()
