"""What serving's preprocessing holds in memory for one large request image, by kind.

    python -m benchmarks.serving_memory [--side 6000]

Each kind runs in a fresh process: the signature's preprocessing is traced and run once on a
small image of the kind, then, with the process's peak RSS set back (Linux's clear_refs), on
one of side x 3/4 side pixels. The figure is the peak's growth over the RSS before that run;
the ceiling is the image's own decoded bytes (3 a pixel), so the ratio says how many copies
of it serving held at once.
"""

from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys

KINDS = {  # name: (format, EXIF orientation, with alpha)
    "JPEG, upright (stored as it is)": ("JPEG", 1, False),
    "JPEG, EXIF-turned": ("JPEG", 6, False),
    "PNG, upright": ("PNG", 1, False),
    "PNG, EXIF-turned": ("PNG", 6, False),
    "PNG with alpha, upright": ("PNG", 1, True),
    "PNG with alpha, EXIF-turned": ("PNG", 6, True),
}


def measure(side: int, fmt: str, turn: int, alpha: bool) -> dict:
    """In this process: the peak growth, in bytes, of serving one image of this kind."""
    import numpy as np
    import tensorflow as tf
    from PIL import Image

    from tfrecord_pipe._reading import serving

    rng = np.random.default_rng(0)
    exif = Image.Exif()
    exif[0x0112] = turn

    def encoded(width, height):
        pixels = rng.integers(0, 256, (height, width, 4 if alpha else 3), dtype=np.uint8)
        buffer = io.BytesIO()
        Image.fromarray(pixels).save(buffer, fmt, exif=exif.tobytes(), quality=90)
        return buffer.getvalue()

    config = serving.ServingConfig(labels=("a", "b"), image_size=224, max_pixels=10**9)
    spec = tf.TensorSpec([None], tf.string)
    serve = tf.function(lambda files: serving.model_inputs(files, config), input_signature=[spec])
    serve(tf.constant([encoded(64, 48)]))
    request = tf.constant([encoded(side, side * 3 // 4)])
    with open("/proc/self/clear_refs", "w") as f:  # Linux: the peak starts again from here
        f.write("5")
    before = _status_bytes("VmRSS")
    serve(request).numpy()
    return {"grew": _status_bytes("VmHWM") - before, "pixels": side * (side * 3 // 4)}


def _status_bytes(field: str) -> int:
    with open("/proc/self/status") as f:
        line = next(line for line in f if line.startswith(field + ":"))
    return int(line.split()[1]) * 1024  # kB


def main(argv=None) -> list[str]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--side", type=int, default=6000, help="the image's width, in pixels")
    args = parser.parse_args(argv)
    from benchmarks import command_line

    lines = [
        command_line("benchmarks.serving_memory", argv),
        "| request image | megapixels | peak growth MiB | / its decoded bytes |",
        "|---|---|---|---|",
    ]
    for name, (fmt, turn, alpha) in KINDS.items():
        code = ("import json, sys; from benchmarks import serving_memory as m; "
                f"print('RESULT', json.dumps(m.measure({args.side}, {fmt!r}, {turn}, {alpha})))")
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              check=True)  # fmt: skip
        result = json.loads(done.stdout.split("RESULT", 1)[1])
        decoded = result["pixels"] * 3
        lines.append(f"| {name} | {result['pixels'] / 1e6:.1f} | {result['grew'] / 2**20:.0f} | "
                     f"{result['grew'] / decoded:.1f}x |")  # fmt: skip
    print("\n".join(lines))
    return lines


if __name__ == "__main__":
    main()
