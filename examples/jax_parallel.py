"""Data parallelism for the JAX examples: one mesh over every device of every host, each host's
batch put in as its part of the global batch, the parameters replicated. A jitted step over
such arrays averages the gradients over all of them (XLA adds the collectives), so every host
ends with the same parameters.

On several hosts, `start` joins them first (`jax.distributed.initialize`), before anything
else touches JAX: on Cloud TPU, GKE or SLURM with no arguments, elsewhere with
`--coordinator`, `--num_processes` and `--process_id`.
"""

from __future__ import annotations

import argparse
import hashlib
import sys

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec


def add_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--distributed", action="store_true",
                        help="join the other hosts first (jax.distributed.initialize)")
    parser.add_argument("--coordinator", help="host:port of process 0, where JAX cannot find it")
    parser.add_argument("--num_processes", type=int, help="hosts in all, with --coordinator")
    parser.add_argument("--process_id", type=int, help="this host's index, with --coordinator")


def start(args: argparse.Namespace) -> None:
    """Joins the hosts when asked to; says where this process is."""
    if args.distributed or args.coordinator:
        try:
            jax.distributed.initialize(
                coordinator_address=args.coordinator, num_processes=args.num_processes,
                process_id=args.process_id,
            )  # fmt: skip
        except ValueError as err:  # JAX's "coordinator_address should be defined."
            how = ("--coordinator needs --num_processes N and --process_id I beside it"
                   if args.coordinator else
                   "--distributed joins hosts JAX finds by itself (Cloud TPU, Slurm); elsewhere "
                   "give --coordinator HOST:PORT --num_processes N --process_id I, or leave "
                   "--distributed out to train on this host alone")  # fmt: skip
            raise ValueError(f"{err} {how}.") from None
    say(f"JAX on {jax.device_count()} device(s), host {jax.process_index()} of "
        f"{jax.process_count()}")  # fmt: skip


def say(line: str) -> None:
    """Prints a line in one write. Gloo (JAX's collectives on CPU) writes its own lines to this
    stdout from C++ a few bytes at a time, and under `python -u` print writes a line and its
    newline apart: a Gloo "0" between them once made "resumed at step 5" read "...step 50".
    """
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


class DataParallel:
    """The mesh of every device, and how arrays go onto it."""

    def __init__(self):
        mesh = Mesh(np.asarray(jax.devices()), ("data",))
        self.batch = NamedSharding(mesh, PartitionSpec("data"))  # split along the batch
        self.replicated = NamedSharding(mesh, PartitionSpec())

    @staticmethod
    def check_host_batch(batch: int, what: str) -> None:
        """This host's batch is split over its devices: it must divide evenly."""
        devices = jax.local_device_count()
        if batch % devices:
            raise ValueError(
                f"{what} gives this host batches of {batch}, which do not divide among its "
                f"{devices} devices: use a multiple of {devices}."
            )

    def global_batch(self, *local_arrays) -> tuple[jax.Array, ...]:
        """This host's arrays as its part of arrays over every host's devices."""
        return tuple(jax.make_array_from_process_local_data(self.batch, a) for a in local_arrays)

    def replicate(self, params: dict) -> dict:
        return jax.device_put(params, self.replicated)


def host_copy(params: dict) -> dict:
    """This host's copy of replicated parameters, as numpy arrays (to save or digest)."""
    for name, value in params.items():
        if not value.is_fully_replicated:  # (jit chose another layout: a copy is a part)
            raise ValueError(f"parameter {name} is not replicated: {value.sharding}")
    return {name: np.asarray(value.addressable_data(0)) for name, value in params.items()}


def digest(params: dict) -> str:
    """A short digest of the parameters: equal on every host, and between two runs that
    trained alike."""
    copy = host_copy(params)
    return hashlib.sha256(b"".join(copy[name].tobytes() for name in sorted(copy))).hexdigest()[:16]
