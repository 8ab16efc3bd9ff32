"""The preloaded command (tests/preloaded.py) does what `python ARGS...` does, so that the
tests that run their training, resuming and hanging processes through it test what a new
Python process would do."""

import json
import os
import signal
import socket
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


BUFFERED = ("import io, sys; "
            "sys.stdout = io.TextIOWrapper(io.BufferedWriter(io.FileIO(1, 'w', closefd=False)))")
# How a command ends, each as Python ends it. The server's child skips Python's teardown (a
# CPU-second each) and does the rest of its exit itself.
ENDINGS = {
    "a message": "import sys; sys.exit('no room left')",
    "Ctrl-C": "raise KeyboardInterrupt",
    "a thread": "import threading, time\n"
                "threading.Thread(target=lambda: (time.sleep(0.3), print('late'))).start()",
    "exit hooks": "import atexit; atexit.register(print, 'at exit'); print('first', end='')",
    # (Not left to the environment: PYTHONUNBUFFERED may be set, as it is on our CI.)
    "a buffered stdout": f"{BUFFERED}; print('flushed at exit')",
    "a closed stdout": f"{BUFFERED}; print('lost'); import os; os.close(1); exit(3)",
    "a large code": "raise SystemExit(257)",
}  # fmt: skip


@pytest.mark.slow  # the server imports TensorFlow
@pytest.mark.parametrize("ending", ENDINGS.values(), ids=ENDINGS.keys())
def test_a_preloaded_command_ends_as_python_does(ending):
    fresh, preloaded = ran([sys.executable, "-c", ending]), ran(preloaded_python("-c", ending))
    assert fresh == preloaded


@pytest.mark.slow  # the server imports TensorFlow
def test_a_command_needing_another_start_runs_a_new_python():
    # Keras reads its backend as TensorFlow imports it: the server's would be the wrong one.
    code = "import sys; print('tensorflow' in sys.modules)"
    env = dict(os.environ, KERAS_BACKEND="jax")
    assert ran(preloaded_python("-c", code), env=env)[:2] == (0, "False\n")
    assert ran(preloaded_python("-c", code))[:2] == (0, "True\n")
    assert ran(preloaded_python("-X", "utf8", "-c", code))[:2] == (0, "False\n")


@pytest.mark.slow  # a second server imports TensorFlow, with Keras on JAX
def test_commands_given_their_environment_share_a_server_started_with_it():
    code = "import sys, keras; print(keras.backend.backend(), 'tensorflow' in sys.modules)"
    env = dict(os.environ, KERAS_BACKEND="jax")
    first, again = (preloaded_python("-c", code, env=env) for _ in range(2))
    assert first == again and first != preloaded_python("-c", code)  # one server for both
    assert ran(first, env=env)[:2] == (0, "jax True\n")  # Keras on JAX, TensorFlow preloaded


def gone(pid) -> bool:
    """Whether process `pid` has ended (waiting a minute at most)."""
    deadline = time.monotonic() + 60
    while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
        time.sleep(0.05)
    return not os.path.exists(f"/proc/{pid}")


@pytest.mark.slow  # the server imports TensorFlow
def test_a_preloaded_command_ends_by_its_signal_and_takes_its_child_with_it():
    # A run that kills itself (as resume_run.py does to be preempted) is seen killed.
    suicide = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
    assert ran(preloaded_python("-c", suicide))[0] == -signal.SIGKILL
    # A signal reaches the child: one it handles ends it as it chooses. (Short sleeps: a signal
    # that came just before a long one began had its handler wait for its end, 1 run in 20.)
    handles = ("import os, signal, sys, time\n"
               "signal.signal(signal.SIGTERM, lambda *_: sys.exit(print('TERM handled')))\n"
               "print(os.getpid(), flush=True)\n"
               "while True:\n"
               "    time.sleep(0.05)\n")  # fmt: skip
    command = subprocess.Popen(preloaded_python("-c", handles), stdout=subprocess.PIPE,
                               text=True)  # fmt: skip
    child = int(command.stdout.readline())
    command.terminate()
    assert command.wait(timeout=60) == 0 and command.stdout.read() == "TERM handled\n"
    # (Not SIGINT: a Python started by a process that ignores it, as pytest-xdist's workers
    # do, ignores it too.) The last: a child busy in C code, holding Python's lock.
    waits = "import os, time; print(os.getpid(), flush=True); time.sleep(300)"
    busy = "import os, re; print(os.getpid(), flush=True); re.match(r'(a+)+$', 'a' * 64 + 'b')"
    for code, sent in ((waits, signal.SIGTERM), (waits, signal.SIGKILL), (busy, signal.SIGKILL)):
        command = subprocess.Popen(preloaded_python("-c", code), stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True)  # fmt: skip
        child = int(command.stdout.readline())
        command.send_signal(sent)
        assert command.wait(timeout=60) == -sent
        assert gone(child)  # the child, though not the command's own


@pytest.mark.slow  # the server imports TensorFlow
def test_a_command_killed_as_it_starts_leaves_the_others_running(tmp_path):
    # Killed before the server had told it its child: the server died, and took the commands
    # running then with it (found by a reviewer). Here the command's side of the exchange,
    # ended as soon as it has asked.
    long = subprocess.Popen(preloaded_python("-c", "import time; time.sleep(3); print('done')"),
                            stdout=subprocess.PIPE, text=True)  # fmt: skip
    name = long.args[long.args.index("--to") + 1]
    request = {"args": ["-c", "import time; time.sleep(300)"], "environment": dict(os.environ),
               "cwd": str(tmp_path)}  # fmt: skip
    with open(os.devnull, "r+") as nothing:
        for _ in range(3):
            asked = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            asked.connect("\0" + name)
            socket.send_fds(asked, [json.dumps(request).encode() + b"\n"], [nothing.fileno()] * 3)
            asked.close()
    assert long.communicate(timeout=60) == ("done\n", None) and long.returncode == 0
    assert ran(preloaded_python("-c", "import sys; print('tensorflow' in sys.modules)"))[:2] == (
        0, "True\n")


@pytest.mark.slow  # the server imports TensorFlow
def test_a_script_by_a_relative_path_can_spawn_processes(tmp_path):
    # Spawned processes run the main script again, from the directory Python started in: the
    # server's was taken, and the pool restarted its failing workers for ever.
    (tmp_path / "pool.py").write_text(
        "import multiprocessing\n"
        "if __name__ == '__main__':\n"
        "    with multiprocessing.get_context('spawn').Pool(2) as pool:\n"
        "        print(pool.map(abs, [-1, -2]))\n"
    )  # fmt: skip
    assert ran(preloaded_python("pool.py"), cwd=tmp_path)[:2] == (0, "[1, 2]\n")
