"""Ship this project to remote Beam workers (Dataflow) without the user building anything.

The job's DoFns live in `beam_jobs` and `tfrecord_pipe`, so remote workers need both packages.
We write a pure-Python wheel of them from the files this interpreter imports (works for both
regular and editable installs, no network, no source tree needed), and hand it to Beam as an
`--extra_package`; workers pip-install it with its declared dependencies, except TensorFlow for
the conversion: its worker code never imports it (tested), and installing it on every worker
would cost minutes of start-up and gigabytes of disk. `verify`'s workers decode records as the
reader does, with TensorFlow: their wheel declares the reader's extra too.
"""

from __future__ import annotations

import base64
import hashlib
import pathlib
import re

import beam_jobs
import tfrecord_pipe

DISTRIBUTION = "tfrecord-pipe"
PACKAGES = (tfrecord_pipe, beam_jobs)

# The extras whose requirements workers install with the core's: not TensorFlow (the reader's
# extra), which the workers of the conversion and of verify never import.
WORKER_EXTRAS = ("beam",)

# Flags with which the user already tells Beam how workers get our code.
USER_PACKAGING_FLAGS = (
    "--setup_file",
    "--extra_package",
    "--extra_packages",
    "--sdk_container_image",
    "--worker_harness_container_image",
)


def _record_hash(data: bytes) -> str:
    digest = hashlib.sha256(data).digest()
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def _metadata(version: str, extras: tuple[str, ...]) -> str:
    # Imported here, as zipfile is below: only a job for remote workers builds a wheel, and
    # every local command imports this module (through `flags`): 25 ms of its start.
    import importlib.metadata

    lines = ["Metadata-Version: 2.1", f"Name: {DISTRIBUTION}", f"Version: {version}"]
    try:
        requires = importlib.metadata.requires(DISTRIBUTION) or []
    except importlib.metadata.PackageNotFoundError:
        requires = []
    lines += [f"Requires-Dist: {_without_marker(r)}" for r in requires if _for_workers(r, extras)]
    return "\n".join(lines) + "\n"


def _for_workers(requirement: str, extras: tuple[str, ...]) -> bool:
    """The core's requirements, and those of `extras`."""
    marker = requirement.partition(";")[2]
    wanted = "|".join(map(re.escape, extras))
    return "extra" not in marker or re.search(rf"extra\s*==\s*['\"]({wanted})['\"]", marker)


def _without_marker(requirement: str) -> str:
    return requirement.partition(";")[0].strip()


def build_wheel(
    folder: str | pathlib.Path, extras: tuple[str, ...] = WORKER_EXTRAS
) -> pathlib.Path:
    """Writes `tfrecord_pipe-<version>-py3-none-any.whl` into `folder`, requiring the core's
    and `extras`' dependencies; returns its path."""
    import zipfile

    version = tfrecord_pipe.__version__
    dist_info = f"tfrecord_pipe-{version}.dist-info"
    files: dict[str, bytes] = {}
    for package in PACKAGES:
        root = pathlib.Path(package.__file__).parent
        for path in sorted(root.rglob("*.py")):
            files[f"{package.__name__}/{path.relative_to(root).as_posix()}"] = path.read_bytes()
    files[f"{dist_info}/METADATA"] = _metadata(version, extras).encode()
    files[f"{dist_info}/WHEEL"] = (
        "Wheel-Version: 1.0\nGenerator: tfrecord-pipe\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    ).encode()
    record = "".join(f"{name},{_record_hash(data)},{len(data)}\n" for name, data in files.items())
    files[f"{dist_info}/RECORD"] = (record + f"{dist_info}/RECORD,,\n").encode()

    wheel = pathlib.Path(folder) / f"tfrecord_pipe-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in files.items():
            archive.writestr(zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0)), data)
    return wheel


def user_packaged(beam_args: list[str]) -> bool:
    """True when the Beam flags already say how workers get our code."""
    return any(arg.split("=", 1)[0] in USER_PACKAGING_FLAGS for arg in beam_args)
