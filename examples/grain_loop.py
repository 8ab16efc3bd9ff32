"""Plain JAX on the Grain path: ArrayRecord shards through Grain, a jitted step, a checkpoint
that holds the model and the input's position, so a preempted run goes on where it stopped.

    python -m examples.grain_loop DATASET_DIR WORK_DIR [--steps 200] [--batch_size 32]
                                  [--distributed]

The dataset must have ArrayRecord shards (`tfrecord-pipe convert ... --formats
tfrecord,array_record`). Every `--save_every` steps the parameters and the iterator's
`get_state()` go to WORK_DIR together, in one file put in place at once (one a host: each
keeps its own input's position); a run started again (after a kill, a preemption) loads them
and takes the next batch, so its final parameters are those of a run that was never stopped.
One run a host uses WORK_DIR at a time: a second one started there (launched twice, a
scheduler's retry) is refused while the first runs, as their saves would mix.
Each host's batch goes in as its part of one global batch over every device
(`examples/jax_parallel.py`), so every host keeps the same parameters. The model is
examples/mlp.py's small MLP.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import glob
import json
import os
import sys
import zipfile

import jax
import numpy as np
from jax.experimental import multihost_utils

from examples import command, jax_parallel, mlp
from tfrecord_pipe import grain


def checkpoint_names(step: int | None = None) -> tuple[str, str, str]:
    """(this host's checkpoint file at `step`, a glob of this host's, a glob of every host's
    of this run). One host keeps one file; hosts sharing WORK_DIR keep files of their own,
    named with the step: a kill between two hosts' saves leaves them at different steps, and
    they resume at one they all have."""
    if jax.process_count() == 1:
        return "checkpoint.npz", "checkpoint.npz", "checkpoint.npz"
    count = f"of-{jax.process_count():05d}"
    host = f"checkpoint.host-{jax.process_index():05d}-{count}"
    return f"{host}.step-{step or 0:09d}.npz", f"{host}.step-*.npz", f"checkpoint.host-*-{count}.*"


def found(work_dir: str, pattern: str) -> list[str]:
    """The files of WORK_DIR that `pattern` matches, sorted. The folder's name is taken as
    written: `run [1]` or `exp[12]` as a pattern matched other folders' checkpoints (a run
    resumed another's) or none (a preempted run started again from step 0)."""
    return sorted(glob.glob(os.path.join(glob.escape(work_dir), pattern)))


def hold(work_dir: str):
    """This host's hold on WORK_DIR for the run: an open lock file, which the system lets go
    of when the process ends (killed too); refused where another run holds it. Where the
    folder takes no lock (read-only, for a run that only evaluates; a file system without
    locks), a warning and a run without one, as before there was a lock."""
    name = "run.lock" if jax.process_count() == 1 else f"run.host-{jax.process_index():05d}.lock"
    try:
        lock = open(os.path.join(work_dir, name), "a")
    except OSError as err:
        return _unheld(work_dir, err)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        raise ValueError(
            f"another run is training in {work_dir} (it holds {name}): their saves "
            "would mix. Wait for it to end, or give another WORK_DIR."
        ) from None
    except OSError as err:  # ENOLCK, EOPNOTSUPP: no locks there
        lock.close()
        return _unheld(work_dir, err)
    return lock


def _unheld(work_dir: str, err: OSError) -> contextlib.nullcontext:
    print(f"warning: no lock on {work_dir} ({err.strerror}): a second run started there "
          "would not be refused.", file=sys.stderr)  # fmt: skip
    return contextlib.nullcontext()


def save(work_dir: str, step: int, params: dict, state: dict) -> None:
    """The step, parameters and input position in one file, put in place whole; on several
    hosts, this host's one before it is kept (the one all hosts may have)."""
    name, pattern, _ = checkpoint_names(step)
    path = os.path.join(work_dir, name)
    with open(path + ".part", "wb") as file:
        np.savez(file, step=step, input=json.dumps(state), **jax_parallel.host_copy(params))
        file.flush()
        os.fsync(file.fileno())
    os.replace(path + ".part", path)
    for old in found(work_dir, pattern)[:-2]:
        os.remove(old)


def restore(work_dir: str):
    """(step, params, input state) of the last checkpoint every host has, or None."""
    _, pattern, this_run = checkpoint_names()
    mine = found(work_dir, pattern)
    run = set(found(work_dir, this_run))
    others = {path for path in found(work_dir, "checkpoint*.npz") if path not in run}
    if others and not run:
        raise ValueError(
            f"{work_dir} holds checkpoints of a run on another number of hosts "
            f"({os.path.basename(min(others))}): its input positions mean nothing here. "
            "Resume on as many hosts, or give another WORK_DIR."
        )
    if jax.process_count() > 1:  # the newest step every host has (a save may have missed one)
        steps = [int(path.rsplit("step-", 1)[1][:-4]) for path in mine][-2:]
        every = multihost_utils.process_allgather(np.asarray(([-1] * 2 + steps)[-2:]))
        common = set.intersection(*({int(s) for s in row if s >= 0} for row in every))
        if not common:
            if any(int(s) >= 0 for s in np.ravel(every)):
                raise ValueError(
                    f"the hosts' checkpoints in {work_dir} have no step in common: "
                    "give another WORK_DIR to train from the start."
                )
            return None
        mine = [os.path.join(work_dir, checkpoint_names(max(common))[0])]
    if not mine:
        return None
    try:
        with np.load(mine[-1]) as saved:
            params = {name: saved[name] for name in saved.files if name not in ("step", "input")}
            return int(saved["step"]), params, json.loads(str(saved["input"]))
    except (OSError, EOFError, KeyError, ValueError, zipfile.BadZipFile) as err:
        then = ("the run then starts from step 0" if jax.process_count() == 1 else
                "the hosts then go on from a step they all still have, or say there is none")
        raise ValueError(
            f"the checkpoint {mine[-1]} cannot be read ({type(err).__name__}: {err}), "
            f"damaged since it was saved whole. Delete it ({then}), or give another WORK_DIR."
        ) from None


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, got {value}")
    return value


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("dataset_dir")
    parser.add_argument("work_dir")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch_size", type=int, default=32, help="this host's batch")
    parser.add_argument("--save_every", type=positive, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=0, help="Grain worker processes")
    parser.add_argument("--eval_split", default="validation", help="the split to evaluate on")
    jax_parallel.add_flags(parser)
    args = parser.parse_args(argv)
    jax_parallel.start(args)  # before make_dataset, which asks JAX for this host's place
    parallel = jax_parallel.DataParallel()
    parallel.check_host_batch(args.batch_size, "--batch_size")
    if os.path.exists(args.work_dir) and not os.path.isdir(args.work_dir):
        raise ValueError(f"WORK_DIR {args.work_dir} is a file: give a folder (it is made "
                         "where missing).")  # fmt: skip
    try:
        os.makedirs(args.work_dir, exist_ok=True)
    except OSError as err:
        raise ValueError(f"WORK_DIR {args.work_dir} cannot be made ({err.strerror}): give a "
                         "folder that can be written.") from None  # fmt: skip
    options = dict(image_size=mlp.IMAGE_SIZE, dtype="uint8", batch_size=args.batch_size)
    train = grain.make_dataset(args.dataset_dir, is_training=True, seed=args.seed,
                               worker_count=args.workers, **options)  # fmt: skip
    # Built before training: a dataset without a validation split says so now.
    with command.argument_as_flag("split=", "--eval_split"):
        evaluation = grain.make_dataset(args.dataset_dir, split=args.eval_split,
                                        is_training=False, **options)  # fmt: skip
    classes = grain.find_split(args.dataset_dir, "train").num_classes
    batches = iter(train)
    step, params = 0, mlp.init(jax.random.PRNGKey(args.seed), classes)
    with hold(args.work_dir):
        saved = restore(args.work_dir)
        if saved is not None:
            step, params, state = saved
            try:
                batches.set_state(state)
            except ValueError as err:  # in the library's terms: say the example's
                flags = ("Run with the flags that saved it (--batch_size, --seed, --workers), "
                         "or give" if isinstance(state, dict) and "settings" in state else "Give")
                raise ValueError(f"{err} (The checkpoint in {args.work_dir}.) {flags} another "
                                 "WORK_DIR to train from the start.") from None  # fmt: skip
            jax_parallel.say(f"resumed at step {step}")
        params = parallel.replicate(params)
        while step < args.steps:
            params, value = mlp.train_step(params, *parallel.global_batch(*next(batches)))
            step += 1
            if step % args.save_every == 0 or step == args.steps:
                save(args.work_dir, step, params, batches.get_state())
                jax_parallel.say(f"step {step:4d}: loss {float(value):.3f} (saved)")

    right = seen = 0
    for batch in evaluation:
        batch_right, batch_seen = mlp.correct(params, *parallel.global_batch(*batch))
        right, seen = right + int(batch_right), seen + int(batch_seen)
    digest = jax_parallel.digest(params)
    jax_parallel.say(f"validation accuracy {right / seen:.3f} on all {seen} images")
    jax_parallel.say(f"parameters {digest}")
    return {"accuracy": right / seen, "images": seen, "parameters": digest}


if __name__ == "__main__":
    command.run(main)
