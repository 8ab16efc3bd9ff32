"""What the conversion's check of one input costs, step by step, against decoding it.

In one process, CPU time per file (`time.process_time`) over the same cached photo-like JPEGs
(`convert_bench.cached_images`), each step timed in turn for several rounds; the table gives
the median round of each, and its ratio to the full decode measured in the same run.

- full decode: Pillow opens and decodes every pixel (the conversion benchmark's ceiling).
- 1/8-scale decode: what proved a JPEG before the marker walk, and still proves one that is
  not plain (progressive, several scans).
- images.normalise: the whole check of a JPEG that is stored byte for byte.
- of it, the marker walk, and then the headers with a one-pixel frame
  (`jpeg_markers.Layout.headers_only`) judged: read by `jpeg_headers` and decoded by
  libjpeg, as the check does; and, as it did before, opened and decoded by Pillow.
- SHA-256: the digest the record keeps, taken beside the check.

Run: .venv/bin/python -m benchmarks.check_bench [--images N] [--side PX] [--repeats R]
                                                [--cache FOLDER]
"""

from __future__ import annotations

import argparse
import hashlib
import io
import pathlib
import statistics
import tempfile
import time

from PIL import Image

from benchmarks import command_line, convert_bench
from tfrecord_pipe._core import images, jpeg_headers, jpeg_markers


def _full_decode(data: bytes) -> None:
    Image.open(io.BytesIO(data)).load()


def _eighth_scale(data: bytes) -> None:
    image = Image.open(io.BytesIO(data))
    image.draft("RGB", (max(1, image.width // 8), max(1, image.height // 8)))
    image.decodermaxblock = max(len(data), image.decodermaxblock)
    image.load()


def _headers(data: bytes) -> None:
    layout = jpeg_markers.walk(data)
    headers = layout.headers_only(data)
    jpeg_headers.as_pillow_reads(headers)
    images._libjpeg_decodes(headers)  # the check's own step, timed apart


def _headers_through_pillow(data: bytes) -> None:
    Image.open(io.BytesIO(jpeg_markers.walk(data).headers_only(data))).load()


STEPS = {
    "full decode (Pillow)": _full_decode,
    "1/8-scale decode": _eighth_scale,
    "images.normalise": images.normalise,
    "  marker walk": jpeg_markers.walk,
    "  walk, then the headers read and decoded": _headers,
    "  walk, then the headers opened and decoded by Pillow": _headers_through_pillow,
    "SHA-256": lambda data: hashlib.sha256(data).digest(),
}


def _per_file(step, files: list[bytes]) -> float:
    started = time.process_time()
    for data in files:
        step(data)
    return (time.process_time() - started) / len(files)


def main(argv=None):
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--side", type=int, default=320, help="image side in pixels")
    parser.add_argument("--repeats", type=int, default=5, help="rounds over the steps")
    parser.add_argument("--cache", type=pathlib.Path, help="keep the generated images here")
    args = parser.parse_args(argv)
    cache = args.cache or pathlib.Path(tempfile.mkdtemp(prefix="check-bench-"))
    src = convert_bench.cached_images(cache, args.images, (args.side, args.side), 10)
    files = [path.read_bytes() for path in sorted(src.glob("*/*.jpg"))]
    plain = sum(jpeg_markers.walk(data).plain for data in files)
    rounds = {name: [] for name in STEPS}
    for _ in range(args.repeats):
        for name, step in STEPS.items():
            rounds[name].append(_per_file(step, files))
    ceiling = statistics.median(rounds["full decode (Pillow)"])
    size = sum(map(len, files)) / len(files)
    print(f"\n{command_line('benchmarks.check_bench', argv)}   ({len(files)} photo-like "
          f"{args.side} px JPEGs, {size / 1000:.0f} KB on average, {plain} plain; one process; "
          f"medians of {args.repeats} rounds)")  # fmt: skip
    print("| step | µs per file | / full decode |\n|---|---|---|")
    for name, times in rounds.items():
        median = statistics.median(times)
        print(f"| {name} | {median * 1e6:.1f} | {median / ceiling:.2f}x |")


if __name__ == "__main__":
    main()
