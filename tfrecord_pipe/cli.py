"""The `tfrecord-pipe` command.

Subcommands:
  convert SRC OUT [options] [Beam flags]   run the Beam conversion job (beam_jobs.convert)

More subcommands (inspect, verify, bench) arrive with their issues.
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(
        prog="tfrecord-pipe",
        description="Image folders to sharded TFRecords, and TPU-ready input pipelines.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.add_parser(
        "convert", add_help=False,
        help="convert an image folder or CSV list into TFRecord shards (see convert --help)",
    )
    if not argv or argv[0] in ("-h", "--help"):
        parser.print_help()
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command == "convert":
        from beam_jobs import convert

        return convert.main(rest, prog="tfrecord-pipe convert")
    parser.error(f"unknown command {command!r}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
