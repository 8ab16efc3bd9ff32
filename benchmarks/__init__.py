"""Benchmarks: each prints its table under the command that made it (`command_line`)."""

import shlex
import sys


def command_line(module: str, argv=None) -> str:
    """"$ python -m MODULE ARGS" for the run with `argv` (default: this process's), quoted
    so that it runs again as shown (a pipeline named "grain, train" lost its quotes)."""
    args = sys.argv[1:] if argv is None else argv
    return f"$ python -m {module} {shlex.join(args)}".rstrip()
