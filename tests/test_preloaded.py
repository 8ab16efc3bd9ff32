"""The preloaded command (tests/preloaded.py) does what `python ARGS...` does, so that the
tests that run their training, resuming and hanging processes through it test what a new
Python process would do."""

import os
import signal
import subprocess
import sys
import time

import pytest

from preloaded import python as preloaded_python

# Prints what a process knows of itself, reads its input, and ends as told.
SELF_PORTRAIT = """
import os, sys
print("TENSORFLOW AT START", "tensorflow" in sys.modules)
print("ARGV", sys.argv[1:], "PATH", sys.path[:2], "CWD", os.getcwd(), "SAID", os.environ["SAID"])
print("INPUT", sys.stdin.read())
print("TO STDERR", file=sys.stderr)
sys.exit(int(sys.argv[1]))
"""


def ran(command, **options):
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, input="fed in",
                          **options)  # fmt: skip
    return done.returncode, done.stdout, done.stderr


@pytest.mark.slow  # the server imports TensorFlow
def test_a_preloaded_command_does_what_python_does_with_tensorflow_imported_before(
    tmp_path, gcs
):
    # From a test process with the test GCS's variables set for the session, that imported
    # TensorFlow (which sets TF2_BEHAVIOR).
    env = dict(os.environ, SAID="hello", PYTHONPATH=str(tmp_path / "lib"), TF2_BEHAVIOR="1")
    options = dict(cwd=tmp_path, env=env)
    fresh = ran([sys.executable, "-c", SELF_PORTRAIT, "3", "more"], **options)
    preloaded = ran(preloaded_python("-c", SELF_PORTRAIT, "3", "more"), **options)
    assert fresh[0] == preloaded[0] == 3
    assert fresh[1].replace("AT START False", "AT START True") == preloaded[1]
    assert "TO STDERR" in preloaded[2]
    assert "INPUT fed in" in preloaded[1] and "'', '" + str(tmp_path / "lib") in preloaded[1]
    # A script and a module: their folder (or the working one) first on the path.
    (tmp_path / "script.py").write_text(SELF_PORTRAIT)
    for args in (["script.py"], ["-m", "script"]):
        fresh = ran([sys.executable, *args, "0"], **options)
        preloaded = ran(preloaded_python(*args, "0"), **options)
        assert fresh[0] == preloaded[0] == 0
        assert fresh[1].replace("AT START False", "AT START True") == preloaded[1]
    # An uncaught error is reported from the command's own frames, as Python reports it.
    raising = "def fails():\n    raise ValueError('no')\nfails()\n"
    fresh, preloaded = ran([sys.executable, "-c", raising]), ran(preloaded_python("-c", raising))
    assert fresh[0] == preloaded[0] == 1
    assert fresh[2] == preloaded[2]


@pytest.mark.slow  # the server imports TensorFlow
def test_a_command_needing_another_start_runs_a_new_python():
    # Keras reads its backend as TensorFlow imports it: the server's would be the wrong one.
    code = "import sys; print('tensorflow' in sys.modules)"
    env = dict(os.environ, KERAS_BACKEND="jax")
    assert ran(preloaded_python("-c", code), env=env)[:2] == (0, "False\n")
    assert ran(preloaded_python("-c", code))[:2] == (0, "True\n")
    assert ran(preloaded_python("-X", "utf8", "-c", code))[:2] == (0, "False\n")


@pytest.mark.slow  # the server imports TensorFlow
def test_a_preloaded_command_ends_by_its_signal_and_takes_its_child_with_it():
    # A run that kills itself (as resume_run.py does to be preempted) is seen killed.
    suicide = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
    assert ran(preloaded_python("-c", suicide))[0] == -signal.SIGKILL
    waits = "import os, time; print(os.getpid(), flush=True); time.sleep(300)"
    # (Not SIGINT: a Python started by a process that ignores it, as pytest-xdist's workers
    # do, ignores it too.)
    for sent in (signal.SIGTERM, signal.SIGKILL):
        command = subprocess.Popen(preloaded_python("-c", waits), stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True)  # fmt: skip
        child = int(command.stdout.readline())
        command.send_signal(sent)
        assert command.wait(timeout=60) == -sent
        # The child, not the command's own child, is gone too (SIGKILL: once it sees its
        # command's end).
        deadline = time.monotonic() + 60
        while os.path.exists(f"/proc/{child}") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not os.path.exists(f"/proc/{child}")
