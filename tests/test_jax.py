"""JAX and Keras 3 on JAX: hosts read disjoint shares, real training steps learn from the
reader's batches, export works, TensorFlow stays off the accelerators.

JAX runs in subprocesses only: importing it here would make every later test in this process
a "JAX program" to the reader (`hosts.jax_in_use`).
"""

import io
import json
import os
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from tfrecord_pipe import reader
from tfrecord_pipe._reading import hosts

from dataset_factory import write_dataset
from local_gcs import free_port
from preloaded import python as preloaded_python

ROOT = pathlib.Path(__file__).resolve().parents[1]


def environment(**changed) -> dict:
    """The environment of a test's process, made when it starts: with the TMPDIR the
    session set (`conftest`) after this module was imported."""
    return dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{ROOT / 'tests'}",
                TF_CPP_MIN_LOG_LEVEL="2", **changed)  # fmt: skip


LABELS = tuple(f"item{i:02d}" for i in range(13))  # one label per record: a record's identity
SHARDS = [[0, 1, 2], [3, 4], [5, 6, 7], [8, 9], [10, 11, 12]]


@pytest.fixture(scope="module")
def numbered(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("jax") / "numbered")
    write_dataset(folder, {"train": SHARDS, "validation": SHARDS}, labels=LABELS, size=(16, 16))
    return folder


def result_of(done: subprocess.CompletedProcess) -> dict:
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    # Decoded where it starts, to its own end: Gloo may write into the same line (below).
    start = done.stdout.index("RESULT ") + len("RESULT ")
    return json.JSONDecoder().raw_decode(done.stdout, start)[0]


def read_labels(input_fn) -> tuple[list[int], int]:
    labels, steps = [], 0
    for _, batch_labels, weights in input_fn():
        steps += 1
        labels += batch_labels.numpy()[weights.numpy() > 0].tolist()
    return labels, steps


@pytest.mark.slow  # over a second of CPU: out of the fast subset
def test_a_host_position_deals_files_as_an_input_context_does(numbered):
    options = {"is_training": False, "image_size": 16, "batch_size": 4}
    shares, steps = [], set()
    for index in range(2):
        by_host = reader.make_input_fn(numbered, host_index=index, host_count=2, **options)
        by_context = reader.make_input_fn(numbered, **options)
        labels, host_steps = read_labels(by_host)
        context = tf.distribute.InputContext(2, index, 2)
        context_labels, _ = read_labels(lambda: by_context(context))  # noqa: B023
        assert labels == context_labels
        shares.append(labels)
        steps.add(host_steps)
    assert not set(shares[0]) & set(shares[1])
    assert sorted(shares[0] + shares[1]) == list(range(13))
    assert len(steps) == 1, "every host must run the same number of evaluation batches"


@pytest.mark.parametrize(
    "index, count, said",
    [(0, None, "both host_index and host_count"), (2, 2, r"in \[0, host_count\)"),
     (-1, 3, r"in \[0, host_count\)"), (0, 0, "host_count >= 1"),
     (True, 2, "host_index must be an int or None, got True"),  # was taken as host 1
     (0.0, 2.0, "host_index must be an int or None, got 0.0")],  # failed deep in TensorFlow
)  # fmt: skip
def test_a_wrong_host_position_is_refused_when_the_input_fn_is_made(numbered, index, count, said):
    with pytest.raises(ValueError, match=said):
        reader.make_input_fn(numbered, is_training=False, host_index=index, host_count=count)


def test_a_numpy_host_position_makes_a_state_that_is_json(numbered):
    input_fn = reader.make_input_fn(numbered, is_training=True, batch_size=4, seed=1,
                                    host_index=np.int64(1), host_count=np.int64(2))  # fmt: skip
    batches = input_fn.numpy_batches()
    next(batches)
    assert json.loads(json.dumps(batches.get_state()))["host"] == [1, 2]


def test_dropping_the_evaluation_remainder_on_several_hosts_is_refused(numbered):
    input_fn = reader.make_input_fn(
        numbered, is_training=False, batch_size=4, eval_remainder="drop", host_index=0,
        host_count=2,
    )  # fmt: skip
    with pytest.raises(ValueError, match="eval_remainder='pad'"):
        input_fn()


def test_a_host_position_and_an_input_context_together_are_refused(numbered):
    input_fn = reader.make_input_fn(
        numbered, is_training=False, batch_size=2, host_index=0, host_count=2
    )
    with pytest.raises(ValueError, match="Use one of the two"):
        input_fn(tf.distribute.InputContext(2, 0, 2))


def test_tensorflow_is_asked_to_leave_gpus_and_tpus_to_jax(monkeypatch):
    # No accelerator here: TensorFlow's device list is faked, the call to hide them is real.
    hidden = []
    monkeypatch.setattr(tf.config, "get_visible_devices", lambda kind: [f"{kind}:0"])
    monkeypatch.setattr(tf.config, "set_visible_devices", lambda devices, kind: hidden.append(kind))
    hosts.keep_tensorflow_off_accelerators()
    assert hidden == ["GPU", "TPU"]


def test_tensorflow_already_on_the_accelerators_is_a_warning_that_says_what_to_do(
    monkeypatch, caplog
):
    def too_late(devices, kind):
        raise RuntimeError("Visible devices cannot be modified after being initialized")

    monkeypatch.setattr(tf.config, "get_visible_devices", lambda kind: [f"{kind}:0"])
    monkeypatch.setattr(tf.config, "set_visible_devices", too_late)
    hosts.keep_tensorflow_off_accelerators()
    assert "before any TensorFlow op runs" in caplog.text


def test_the_multi_host_examples_write_each_line_whole(monkeypatch):
    # Gloo writes "[Gloo] Rank ", "0", ... to the same stdout from C++. Under `python -u` a
    # print is two writes, and a "0" between them made one host's "resumed at step 5" read
    # "resumed at step 50" (a CI run).
    from examples import jax_parallel

    class Writes(io.RawIOBase):
        def __init__(self):
            self.calls = []

        def writable(self):
            return True

        def write(self, data):
            self.calls.append(bytes(data))
            return len(data)

    raw = Writes()
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(raw, write_through=True))  # as `-u`
    jax_parallel.say("resumed at step 5")
    assert raw.calls == [b"resumed at step 5\n"]


@pytest.mark.slow  # a process of its own: JAX started here would stay started
def test_a_tensorflow_program_is_not_taken_for_a_jax_one_because_tensorflow_imports_jax():
    # Joined hosts are JAX's before its backend starts: hosts that asked for batches before
    # their first JAX op each read the whole split, and a state resumed elsewhere (a helper's
    # trial, two processes).
    code = (
        "import sys, tensorflow as tf\n"
        "from tfrecord_pipe._reading import hosts\n"
        "print('imported', 'jax' in sys.modules, hosts.jax_in_use())\n"
        "import jax\n"
        f"jax.distributed.initialize('127.0.0.1:{free_port()}', num_processes=1, process_id=0)\n"
        "from jax._src import xla_bridge\n"
        "print('joined', xla_bridge.backends_are_initialized(), hosts.jax_in_use(),\n"
        "      hosts.position(None, None))\n"
        "jax.devices()\n"
        "print('started', hosts.jax_in_use())\n"
    )
    env = environment()
    done = subprocess.run(preloaded_python("-c", code, env=env), capture_output=True, text=True,
                          env=env, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "imported True False" in done.stdout  # TensorFlow imported jax: still not JAX's
    assert "joined False True (0, 1)" in done.stdout
    assert "started True" in done.stdout


@pytest.mark.slow
def test_two_jax_hosts_read_disjoint_files_that_cover_the_split(numbered):
    address = f"127.0.0.1:{free_port()}"
    runs = [
        subprocess.Popen(
            preloaded_python(ROOT / "tests" / "jax_host.py", numbered, address, i, 2,
                             env=environment()),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=environment(),
        )  # fmt: skip
        for i in range(2)
    ]
    results = []
    for run in runs:
        stdout, stderr = run.communicate(timeout=300)
        results.append(
            result_of(subprocess.CompletedProcess(run.args, run.returncode, stdout, stderr))
        )
    assert [(r["host"], r["hosts"]) for r in results] == [(0, 2), (1, 2)]
    first, second = (set(r["labels"]) for r in results)
    assert not first & second, "a record was read by both hosts"
    assert sorted(results[0]["labels"] + results[1]["labels"]) == list(range(13))
    assert results[0]["steps"] == results[1]["steps"]
    # The global batch of 4 is split between the two hosts; numpy batches for JAX.
    assert all(r["train_shapes"] == [[2, 16, 16, 3]] * 2 for r in results)
    assert {r["image_type"] for r in results} == {"uint8"}


@pytest.mark.slow
def test_keras_on_jax_and_plain_jax_learn_from_the_reader_and_export(tmp_path):
    colours = str(tmp_path / "colours")
    write_dataset(colours, {"train": [[0, 1, 2] * 5] * 4, "validation": [[0, 1, 2, 0, 1], [2, 1]]})
    env = environment(KERAS_BACKEND="jax")
    done = subprocess.run(
        preloaded_python(ROOT / "tests" / "jax_run.py", colours, tmp_path / "work", env=env),
        capture_output=True, text=True, env=env, timeout=600,
    )  # fmt: skip
    result = result_of(done)
    example, keras_run, jax_run = result["example"], result["keras"], result["jax"]
    # examples/train.py under Keras on JAX: no strategy, every validation image counted once.
    assert example["strategy"] == "None" and example["images"] == 7
    assert example["accuracy"] == 1.0  # three solid colours
    assert example["predicted"] == ["red", "green", "blue"]  # the first three records' labels
    assert keras_run["backend"] == "jax"
    assert keras_run["normalize_difference"] < 1e-5  # Normalize on JAX = the TensorFlow op
    assert keras_run["served"] == 3 and keras_run["served_difference"] < 1e-5
    # examples/jax_loop.py: plain JAX on numpy batches.
    assert sum(jax_run["losses"][-10:]) < sum(jax_run["losses"][:10]) / 4
    assert jax_run["accuracy"] == 1.0 and jax_run["images"] == 7
    assert result["tensorflow_devices"] == ["CPU"]


@pytest.mark.slow  # two JAX processes joined, twice
def test_the_grain_example_on_two_hosts_trains_one_model_and_resumes_together(tmp_path):
    # They ran on several hosts but averaged nothing across them: each host trained a model of
    # its own (parameters a11abd... and 333266..., a reviewer), and the Grain example's hosts
    # wrote one checkpoint over each other's; then hosts killed between their saves resumed
    # at different steps (a second reviewer).
    # (jax_loop shares examples/jax_parallel.py; its hosts' shares are tested above.)
    # Unbuffered, as under `python -u` (and on CI, whose environment sets it): print's line and
    # its newline then go out apart, and Gloo's bytes once landed between them.
    env = environment(XLA_FLAGS="--xla_force_host_platform_device_count=2", PYTHONUNBUFFERED="1")
    work = tmp_path / "work"
    grain_args = [str(tmp_path / "grain"), str(work), "--batch_size", "4", "--save_every", "5"]
    from beam_jobs import convert  # the Grain example reads ArrayRecord shards
    from helpers import IN_PROCESS, write_image_folder

    src = write_image_folder(tmp_path / "src", per_label=6)
    convert.run([str(src), str(tmp_path / "grain"), "--formats", "tfrecord,array_record",
                 "--validation_fraction", "0.3", *IN_PROCESS])  # fmt: skip

    def on_two_hosts(example, args):
        address = f"127.0.0.1:{free_port()}"
        runs = [subprocess.Popen(
            [sys.executable, "-m", f"examples.{example}", *args, "--steps", "10",
             "--coordinator", address, "--num_processes", "2", "--process_id", str(host)],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        ) for host in range(2)]  # fmt: skip
        said = []
        for run in runs:
            stdout, stderr = run.communicate(timeout=300)
            assert run.returncode == 0, (stdout + stderr)[-3000:]
            # Found, not split into lines: Gloo (JAX's CPU collectives) writes to the same
            # stdout from C++, a few bytes at a time, and may split its own lines around ours.
            said.append(re.findall(r"resumed at step \d+|validation accuracy [\d.]+ on all \d+ "
                                   r"images|parameters [0-9a-f]+", stdout))
        assert said[0] == said[1] and said[0], (example, said)  # one model, one score
        return said[0]

    first = on_two_hosts("grain_loop", grain_args)
    assert sorted(p.name for p in work.glob("checkpoint*.npz")) == [
        f"checkpoint.host-0000{host}-of-00002.step-{step:09d}.npz"
        for host in (0, 1) for step in (5, 10)]  # fmt: skip
    # Killed after host 0 saved step 10 and before host 1 did: both go on from step 5, and
    # end where the run never stopped did.
    (work / "checkpoint.host-00001-of-00002.step-000000010.npz").unlink()
    assert on_two_hosts("grain_loop", grain_args) == ["resumed at step 5", *first]
    # A host's batch its two devices cannot share: one line, exit 2, as the example's other
    # refusals (it exited 1).
    odd = subprocess.run([sys.executable, "-m", "examples.grain_loop", *grain_args[:2],
                          "--batch_size", "3"], cwd=ROOT, capture_output=True, text=True, env=env,
                         timeout=300)  # fmt: skip
    assert odd.returncode == 2 and odd.stderr.splitlines()[-1] == (
        "error: --batch_size gives this host batches of 3, which do not divide among its 2 "
        "devices: use a multiple of 2."), odd.stderr[-2000:]  # fmt: skip
