"""What many tests share: the odd-image files, images made on the spot, label colours, and
running the `tfrecord-pipe` command."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import pathlib
import subprocess
import sys

import numpy as np
from PIL import Image

from preloaded import python as preloaded_python

# Real odd image files from Pillow's and libjpeg-turbo's test suites (licences beside them).
ODD_IMAGES = pathlib.Path(__file__).resolve().parent / "data" / "odd-images"

# One colour per label, far apart, so that a centre crop still shows which label it is.
COLOURS = {
    "red": (220, 30, 30),
    "green": (30, 200, 30),
    "blue": (30, 30, 220),
    "yellow": (220, 220, 40),
    "magenta": (200, 40, 200),
}
RGB = ("red", "green", "blue")

# Beam's flags for one in-process worker, for runs on Beam's local runner (verify's pipeline,
# `--runner DirectRunner`). They are Beam's defaults: a conversion given only them runs on the
# local engine (beam_jobs/local_engine.py), as one given no flag does.
IN_PROCESS = ["--direct_num_workers=1", "--direct_running_mode=in_memory"]

COMMAND = str(pathlib.Path(sys.executable).parent / "tfrecord-pipe")


def open_under(folder) -> int:
    """Files under `folder` this process holds open (other threads of a test worker open and
    close files of their own meanwhile)."""
    held = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            held += os.readlink(f"/proc/self/fd/{fd}").startswith(f"{folder}{os.sep}")
        except OSError:  # closed meanwhile
            pass
    return held


def set_up_then(setup: str, command: list[str]) -> list[str]:
    """A command line that runs `setup` (Python, with os, resource and signal imported) in a
    fresh Python process, which then becomes `command` (exec): what `preexec_fn` does, without
    running Python in a child forked from the test process. Once TensorFlow or Beam has
    loaded there, gRPC's fork handlers run in such a child: one aborted (SIGABRT, "epoll_wait
    error: Bad file descriptor") before its command started."""
    run = f"import os, resource, signal, sys; {setup}; os.execv(sys.argv[1], sys.argv[1:])"
    return [sys.executable, "-c", run, *map(str, command)]


def encode(image: Image.Image | np.ndarray, fmt: str = "JPEG", **options) -> bytes:
    """`image` (or an array of pixels) as the bytes of an image file of format `fmt`."""
    if isinstance(image, np.ndarray):
        image = Image.fromarray(image)
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **options)
    return buffer.getvalue()


def with_scans(progressive: bytes, scans: int) -> bytes:
    """A progressive JPEG with its last scan repeated until it holds `scans` scans: valid,
    and each scan makes the decoder pass over the whole image again (a file crafted to hold
    a decoder)."""
    assert progressive.endswith(b"\xff\xd9")
    last = progressive[progressive.rindex(b"\xff\xda") : -2]  # no 0xFF 0xDA in scan data
    more = scans - progressive.count(b"\xff\xda")
    return progressive[:-2] + last * more + b"\xff\xd9"


def jpeg_bytes(width: int = 8, height: int = 8, colour=(200, 30, 30), quality: int = 90) -> bytes:
    """A baseline RGB JPEG of one colour."""
    return encode(Image.new("RGB", (width, height), colour), quality=quality)


def png_bytes(width: int, height: int, colour) -> bytes:
    """An RGB PNG of one colour."""
    return encode(Image.new("RGB", (width, height), colour), "PNG")


def write_image_folder(root: pathlib.Path, per_label: int, labels=RGB, odd=()) -> pathlib.Path:
    """`root/<label>/000.jpg ...`: `per_label` small JPEGs of each label's colour (COLOURS, or
    one by its position), of growing widths, plus copies of the `odd` files
    (tests/data/odd-images) under the first label."""
    palette = list(COLOURS.values())
    for number, label in enumerate(labels):
        colour = COLOURS.get(label, palette[number % len(palette)])
        (root / label).mkdir(parents=True, exist_ok=True)
        for i in range(per_label):
            (root / label / f"{i:03d}.jpg").write_bytes(jpeg_bytes(8 + i, 8, colour))
    for name in odd:
        (root / labels[0] / name).write_bytes((ODD_IMAGES / name).read_bytes())
    return root


@dataclasses.dataclass(frozen=True)
class Ran:
    """What a command did: its exit code and what it printed."""

    returncode: int
    stdout: str
    stderr: str

    @property
    def errors(self) -> list[str]:
        """The `error:` lines on stderr."""
        return [line for line in self.stderr.splitlines() if line.startswith("error:")]


def run_cli(*args) -> Ran:
    """`tfrecord-pipe ARGS...` in this process: what the command does, without paying for a
    new process and TensorFlow's start-up each time."""
    from tfrecord_pipe._tools import cli

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main([str(arg) for arg in args])
    return Ran(code, out.getvalue(), err.getvalue())


def run_command(*args, env=None, timeout: float = 300, preloaded: bool = False) -> Ran:
    """The installed `tfrecord-pipe` command in a new process, as a user runs it.

    `preloaded`: the command's module run in a process forked with TensorFlow imported
    (tests/preloaded.py), 3 CPU-s less: for what the command does, not how it starts.
    """
    done = subprocess.run(
        command_line(*args, preloaded=preloaded), capture_output=True, text=True,
        timeout=timeout, env=dict(os.environ, **(env or {})),
    )  # fmt: skip
    return Ran(done.returncode, done.stdout, done.stderr)


def command_line(*args, preloaded: bool = False) -> list[str]:
    """`tfrecord-pipe ARGS...` as a command line (see `run_command` for `preloaded`)."""
    if preloaded:
        return preloaded_python("-m", "tfrecord_pipe._tools.cli", *args)
    return [COMMAND, *map(str, args)]


def run_python(code: str, timeout: float = 120, env=None, preloaded: bool = False) -> Ran:
    """`code` in a new Python process: for what could hang, which a test must not do itself,
    or what needs an environment of its own (`env` is added to this one's). `preloaded`: in
    one forked with TensorFlow imported (tests/preloaded.py), for code that imports it."""
    command = preloaded_python("-c", code) if preloaded else [sys.executable, "-c", code]
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=timeout,
            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", **(env or {})),
        )  # fmt: skip
    except subprocess.TimeoutExpired as err:
        raise AssertionError(f"still running after {timeout} s (it hangs): {code}") from err
    return Ran(done.returncode, done.stdout, done.stderr)


def without(folder: pathlib.Path, *packages: str) -> dict:
    """The environment of a Python process, and of every Python it starts (the workers' fork
    server too), in which `packages` (and their modules) fail to import as they do where they
    are not installed (ModuleNotFoundError naming the package): an install without an extra,
    in this environment. A `sitecustomize` module in `folder` does it."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(f"""
import importlib.abc, sys
class _Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in {set(packages)!r}:
            raise ModuleNotFoundError(f"No module named {{name.split('.')[0]!r}}",
                                      name=name.split(".")[0])
sys.meta_path.insert(0, _Absent())
""")
    return {"PYTHONPATH": os.pathsep.join(filter(None, [str(folder), os.environ.get("PYTHONPATH")]))}


def verified_both_ways(source, dataset, *beam_args):
    """`verify`'s report on this machine, once the Beam pipeline's (`verify_job`, on the local
    runner, with `beam_args` too) is shown to say the same: the same totals and problems; and
    the same here whether sources are checked beside their records or apart."""
    from tfrecord_pipe._tools import verify, verify_job

    here = verify.verify(str(source), str(dataset), beside=True)
    assert verify.verify(str(source), str(dataset), beside=False) == here
    local_runner = ["--runner", "DirectRunner", *IN_PROCESS, *beam_args]
    beam = verify_job.run(str(source), str(dataset), local_runner)
    totals = ("sources", "records", "rejected", "num_problems")
    assert [getattr(beam, name) for name in totals] == [getattr(here, name) for name in totals]
    assert beam.problems == here.problems  # the same ones kept, in the same order
    return here


def with_label_added(found, label: str):
    """A manifest edited as a careful hand would: a label appended, each split's count of
    its records 0 (a manifest whose counts do not fit its labels is refused as edited)."""
    splits = {name: dataclasses.replace(info, label_counts=(*info.label_counts, 0))
              for name, info in found.splits.items()}  # fmt: skip
    return dataclasses.replace(found, labels=(*found.labels, label), splits=splits)


def length_delimited(field: int, payload: bytes) -> bytes:
    """One protobuf length-delimited field: for crafting malformed records by hand."""
    size, varint = len(payload), b""
    while True:
        varint += bytes([(size & 0x7F) | (0x80 if size > 0x7F else 0)])
        size >>= 7
        if not size:
            return bytes([field << 3 | 2]) + varint + payload
