"""`make demo` stays true: the end-to-end example runs and learns, as a user would run it."""

import os
import pathlib
import re
import subprocess
import sys
import time

import pytest

from preloaded import python as preloaded_python
from tfrecord_pipe._reading import tensorflow_start

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_demo_converts_trains_evaluates_exports_and_predicts_and_survives_a_kill(tmp_path):
    args = ("-m", "examples.demo", "--out", str(tmp_path / "demo"))
    # Preempted: killed with SIGKILL once training has backed itself up. (Forked with
    # TensorFlow imported: only the run that finishes is checked for how it starts.)
    backed_up = tmp_path / "demo" / "backup" / "training_metadata.json"
    with open(tmp_path / "first.log", "w") as log:
        first = subprocess.Popen(preloaded_python(*args), cwd=ROOT, stdout=log,
                                 stderr=subprocess.STDOUT)  # fmt: skip
        deadline = time.monotonic() + 300
        while not backed_up.exists() and first.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        first.kill()
        first.wait()
    assert backed_up.exists(), (tmp_path / "first.log").read_text()[-4000:]

    env = {name: value for name, value in os.environ.items() if name != "TF_CPP_MIN_LOG_LEVEL"}
    done = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True,
                          env=env, timeout=600)  # fmt: skip
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    out = done.stdout
    assert re.search(r"resumed from \S+ after step [1-9]\d* \(epoch \d+, step \d+ of 12\)", out), out
    assert "1 rejected ({'truncated': 1}), none lost" in out
    assert "[5/5] predictions of the loaded SavedModel:" in out
    assert "demo: OK" in out
    # A new user's first run: none of TensorFlow's start-up lines ("failed call to cuInit"
    # reads as a failure), whatever the CPU.
    start_up = tensorflow_start._START_UP_NOISE
    noise = [line for line in done.stderr.splitlines() if start_up.match(line)]
    assert not noise, done.stderr
    assert (tmp_path / "demo" / "export" / "saved_model.pb").exists()
    assert not (tmp_path / "demo" / "backup").exists(), "a finished run leaves no backup"


@pytest.mark.slow  # processes that load TensorFlow or JAX
@pytest.mark.parametrize("example", ["custom_loop", "grain_loop"])  # (jax_loop: below)
def test_an_example_given_a_folder_that_is_no_dataset_says_so_in_one_line(example, tmp_path):
    # A user's mistake (a changed --batch_size on resume, the images' folder for the
    # dataset) ended in a traceback above the library's one-line refusal (a helper's trial).
    work = [str(tmp_path / "work")] if example == "grain_loop" else []
    done = subprocess.run(preloaded_python("-m", f"examples.{example}", str(tmp_path), *work),
                          cwd=ROOT, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 2, done.stderr[-2000:]
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
    assert done.stderr.splitlines()[-1].startswith(f"error: {tmp_path}"), done.stderr[-2000:]


@pytest.mark.slow  # a process that loads JAX
def test_the_jax_example_names_its_own_flag_for_a_split_the_dataset_lacks(converted):
    # It said "pass split=", the reader's argument, where the example's is --eval_split (a
    # new user's trial); in one line, as the examples above end on a mistake.
    _, out = converted
    done = subprocess.run(preloaded_python("-m", "examples.jax_loop", str(out), "--eval_split",
                                           "tests"), cwd=ROOT, capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert done.returncode == 2, done.stderr[-2000:]
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
    assert done.stderr.splitlines()[-1].startswith(f"error: {out} has no split 'tests'")
    assert "pass --eval_split one of those" in done.stderr.splitlines()[-1]
