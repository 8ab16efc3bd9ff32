"""All benchmarks behind one command: one table, printed and written to a file.

    python -m benchmarks [--images N] [--out benchmarks/RESULTS.md]

Runs the conversion benchmark (job vs Pillow-decode ceiling at N and 4N images, peak RSS) and
the reader benchmark (pipelines vs tf.data decode ceiling on 3N images, peak RSS), then prints
one table with the command, the date and the machine. In --out it replaces the block between
the BEGIN and END markers (the rest of RESULTS.md is kept by hand), or writes a new file.
"""

from __future__ import annotations

import argparse
import datetime
import os
import pathlib
import platform

from benchmarks import command_line, convert_bench, reader_bench


def machine() -> str:
    """CPU model, cores and memory: what the numbers were measured on."""
    model = platform.processor() or platform.machine()
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
        memory_kib = next(
            int(line.split()[1])
            for line in pathlib.Path("/proc/meminfo").read_text().splitlines()
            if line.startswith("MemTotal")
        )
        memory = f", {memory_kib / (1 << 20):.0f} GiB"
    except (OSError, StopIteration):
        memory = ""
    return f"{os.cpu_count()} cores ({model}){memory}, Python {platform.python_version()}"


def table(convert_rows, reader_results) -> list[str]:
    lines = [
        "| benchmark | images/s | ceiling images/s | / ceiling | target | peak RSS MiB |",
        "|---|---|---|---|---|---|",
    ]
    (n, small), (n4, large) = convert_rows
    growth = large["rss"] / small["rss"]
    for count, m, target, rss in (
        (n, small, "(RSS baseline N)", f"{small['rss']:.0f}"),
        (n4, large, ">= 0.5x; RSS 4N/N <= 1.2x", f"{large['rss']:.0f} ({growth:.2f}x of N)"),
    ):
        lines.append(f"| convert, {count} images | {m['job']:.0f} | {m['ceiling']:.0f} | "
                     f"{m['job'] / m['ceiling']:.2f}x | {target} | {rss} |")  # fmt: skip
    for count, m in ((n, small), (n4, large)):
        lines.append(
            f"| verify, {count} images | {m['verify']:.0f} | {m['ceiling']:.0f} | "
            f"{m['verify'] / m['ceiling']:.2f}x | >= 1.0x job (is {m['verify'] / m['job']:.2f}x); "
            f"RSS <= 1.5x job's | {m['verify_rss']:.0f} ({m['verify_rss'] / m['rss']:.2f}x job's) |"
        )
    ceiling = reader_results["ceiling"]["rate"]
    grain = reader_results.get("grain, train")
    targets = {
        "ceiling": "",
        "train": f">= 0.9x; >= 1.3x article (is {reader_results['train']['article']:.2f}x)",
        "train, seeded": f">= 0.9x train (is {reader_results['train, seeded']['train']:.2f}x)",
        "article": "(comparison)",
        "eval": ">= 0.9x (each pass from a new iterator)",
        "eval, one iterator": ">= 0.9x (passes from one iterator)",
        "grain, train": ">= 0.8x train" + (f" (is {grain['train']:.2f}x)" if grain else ""),
        "grain, eval": "(the Grain path's evaluation)",
    }
    for name, row in reader_results.items():
        low, high = row["ceiling_range"]
        lines.append(f"| reader {name} | {row['rate']:.0f} | {ceiling:.0f} | {row['ceiling']:.2f}x "
                     f"({low:.2f}-{high:.2f}) | {targets[name]} | {row['peak']:.0f} |")  # fmt: skip
    return lines


def main(argv=None):
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--images", type=int, default=1000, help="N of the conversion benchmark")
    parser.add_argument("--seconds", type=float, default=8.0, help="per reader pipeline run")
    parser.add_argument("--repeats", type=int, default=3, help="rounds of the reader benchmark")
    parser.add_argument("--out", default="benchmarks/RESULTS.md")
    args = parser.parse_args(argv)
    convert_rows = convert_bench.main(["--images", str(args.images), "--verify"])
    reader_results = reader_bench.main(
        ["--images", str(3 * args.images), "--seconds", str(args.seconds),
         "--repeats", str(args.repeats)]  # fmt: skip
    )
    lines = [
        command_line("benchmarks", argv),
        f"{datetime.date.today()}, {machine()}",
        "conversion and verify: photo-like 320x320 JPEGs; ceiling = read + full Pillow decode on "
        "all cores; medians of 3 job runs (each verified) and 4 ceiling runs, alternating",
        "reader: photo-like JPEGs 256..480 px, 224x224, batch 128; ceiling = the reader's "
        f"reading stages + parse + full tf.io.decode_jpeg; medians of {args.repeats} rounds, "
        "a ratio is the median of the per-round ratios (range in brackets)",
        "",
        *table(convert_rows, reader_results),
    ]
    text = "\n".join(lines) + "\n"
    print("\n" + text)
    write_block(pathlib.Path(args.out), text)
    print(f"written to {args.out}")


BEGIN, END = "<!-- BEGIN python -m benchmarks -->", "<!-- END python -m benchmarks -->"


def write_block(path: pathlib.Path, text: str) -> None:
    """Puts `text` between the markers in `path`, keeping the rest of the file."""
    block = f"{BEGIN}\n```\n{text}```\n{END}"
    old = path.read_text() if path.exists() else ""
    if BEGIN in old and END in old:
        before, rest = old.split(BEGIN, 1)
        path.write_text(before + block + rest.split(END, 1)[1])
    else:
        path.write_text(block + "\n" + old)


if __name__ == "__main__":
    main()
