"""The project's modules compiled to bytecode beside their sources, as `pip install` compiles
an installed package's: an editable install (`make install`) is never compiled, and where
PYTHONDONTWRITEBYTECODE is set (as on some machines) every process the job starts compiled
each module of ours again, 0.15 CPU-seconds a conversion (benchmarks/RESULTS.md). Python
checks each file against its source, so an edited module is compiled anew, never stale.

Run: .venv/bin/python -m benchmarks.compiled   (`make install` runs it)
"""

from __future__ import annotations

import compileall
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGES = ("beam_jobs", "tfrecord_pipe")


def compile_project() -> bool:
    """Compiles the modules of PACKAGES that have no up-to-date bytecode; whether all did."""
    return all(compileall.compile_dir(ROOT / package, quiet=1) for package in PACKAGES)


if __name__ == "__main__":
    raise SystemExit(0 if compile_project() else 1)
