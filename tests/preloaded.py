"""`python ARGS...` in a process forked from one that has already imported TensorFlow.

A new Python process pays about 6 CPU-seconds here to import TensorFlow, and the suite starts
dozens that train, resume or hang on purpose. `python(*args)` is a command line that does what
`python ARGS...` does, in a child forked from a server (one per test process and set of
variables read at start, started at the first call that needs it) that imported TensorFlow
(and with it Keras, JAX and some 3,000 modules): the child takes the command's arguments,
environment, working directory and standard streams;
the command ends as the child ends (its exit code, or the signal that killed it: a run that
kills itself with SIGKILL is seen so); signals sent to the command reach the child, and the
server kills the child when the command ends, SIGKILL included. What is not a fresh
process's: what a script sets before its imports (`os.environ["KERAS_BACKEND"] = "jax"`
comes too late: Keras is loaded), the hash seed, the parent, process group, umask, limits and
CPU affinity (the server's), and OpenBLAS's threads (one: numpy's import starts another, and
a process with threads cannot safely fork). And the interpreter's teardown is skipped (a
CPU-second a command: freeing what TensorFlow's import made writes to nearly every page the
child shares with the server): a command ends as Python ends it up to there (threads waited
for, exit hooks run, streams flushed), then exits at once.

A command runs in a new interpreter instead, as `python ARGS...`, when its environment differs
from the server's in a variable read as Python or TensorFlow starts (_READ_AT_START), when it
has interpreter options, or when there is no server. So a test of what a process prints or
does while it starts (the quiet start, the oneDNN choice) runs a new interpreter, as the
commands in the README do. A test whose commands all need other such variables (Keras on
JAX, the hosts of a two-host JAX run) names their environment (`python(..., env=...)`) and
gets a server of its own for it.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
from typing import NoReturn

# Prefixes of the variables read as Python, TensorFlow (its GCS filesystem's settings too),
# Keras, JAX, OpenBLAS or glibc start. Not the GCS endpoint's and credentials' (the `gcs`
# fixture's, for the whole session), which are read at a first request.
_READ_AT_START = ("PYTHON", "TF_", "TF2_", "KERAS", "JAX_", "XLA_", "CUDA", "OMP_", "OPENBLAS",
                  "MKL", "LD_", "MALLOC", "GLIBC", "ONEDNN", "DNNL", "GRPC", "TPU", "ABSL",
                  "LANG", "LC_", "HOME", "GCS_")  # fmt: skip
# Set for the server alone: its import starts no OpenBLAS thread.
_SERVER_ONLY = {"OPENBLAS_NUM_THREADS": "1"}
# Signals a command passes on to its child. SIGKILL cannot be caught: the server sees the
# command's connection close and kills the child.
_PASSED_ON = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1,
              signal.SIGUSR2)  # fmt: skip
# The environment the server starts with: this process's when the tests were collected, not
# one a test has patched since.
_ENVIRONMENT_AT_IMPORT = dict(os.environ)
# The servers started, by the variables read at start they were started with: each is
# [process, the name it listens at in Linux's abstract socket namespace (no file to remove),
# or None where it could not start or has ended].
_servers: dict[tuple, list] = {}


def python(*args, env=None) -> list[str]:
    """The command line of `python ARGS...`, run by a child of a server (started here at the
    first call that needs it).

    `env`: the environment the command will be started with, where it differs from this
    process's in what is read at start (KERAS_BACKEND=jax): a server started with it serves
    every command given the same such variables, so that they too share one import. Without
    it, a command whose environment differs so runs a new interpreter."""
    start = _ENVIRONMENT_AT_IMPORT if env is None else dict(env)
    key = tuple(sorted(_read_at_start(start).items()))
    if key not in _servers:
        _servers[key] = _start_server(start)
    server = _servers[key]
    if server[1] is not None and server[0].poll() is not None:
        server[1] = None
        _warn(f"the server ended ({server[0].returncode})")
    if server[1] is None:
        return [sys.executable, *map(str, args)]
    return [sys.executable, __file__, "--to", server[1], *map(str, args)]


def stop() -> None:
    """Ends the servers that started, and waits for them (so that their children's CPU time is
    counted in this process's)."""
    for process, _ in _servers.values():
        if process.poll() is None:
            process.stdin.close()
    for process, _ in _servers.values():
        process.wait(timeout=30)
        process.stdout.close()


def _warn(why) -> None:
    import warnings

    warnings.warn(f"no preloaded TensorFlow: each command starts a new Python ({why})")


def _start_server(environment) -> list:
    """[process, name] of a new server started with `environment`; name None where it failed."""
    import subprocess
    import tempfile

    name = f"tfrecord-pipe-tests-{os.getpid()}-{os.urandom(4).hex()}"
    log = tempfile.TemporaryFile()
    server = subprocess.Popen(
        [sys.executable, __file__, "--serve", name], stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, stderr=log, env={**environment, **_SERVER_ONLY},
    )  # fmt: skip
    with log:
        if server.stdout.readline() == b"ready\n":
            return [server, name]
        server.wait()
        log.seek(0)
        _warn(log.read().decode(errors="replace")[-2000:])
    return [server, None]


def _fresh(args) -> None:
    os.execv(sys.executable, [sys.executable, *args])


def _command(name, args) -> None:
    """This process is `python ARGS...`: it has a child of the server `name` run ARGS, and ends
    as the child ends."""
    if not args or args[0].startswith("-") and args[0] not in ("-c", "-m"):
        _fresh(args)
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        connection.connect("\0" + name)
    except OSError:  # the tests' process has ended, and its server with it
        _fresh(args)
    # Signals are passed on to the child from before it runs: it may print (to the test) before
    # this process has its number, and a SIGTERM sent then ended this process, not the child.
    child, held = [], []

    def pass_on(number, _frame):
        if child:
            os.kill(child[0], number)
        else:
            held.append(number)

    for number in _PASSED_ON:
        signal.signal(number, pass_on)
    request = {"args": args, "environment": dict(os.environ), "cwd": os.getcwd()}
    socket.send_fds(connection, [json.dumps(request).encode() + b"\n"], [0, 1, 2])
    replies = connection.makefile("rb")
    first = replies.readline().split()
    if first[:1] != [b"pid"]:  # the server says: a new interpreter
        connection.close()
        for number in _PASSED_ON:
            signal.signal(number, signal.SIG_DFL)
        for number in held:  # as it would have ended this process
            os.kill(os.getpid(), number)
        _fresh(args)
    child.append(int(first[1]))
    for number in held:
        os.kill(child[0], number)
    last = replies.readline().split()
    if last[:1] != [b"status"]:  # the server died (and killed its children)
        sys.exit("preloaded: the server ended before the command did")
    status = int(last[1])
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        if number not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(number, signal.SIG_DFL)
        os.kill(os.getpid(), number)
    os._exit(os.waitstatus_to_exitcode(status))


def _read_at_start(environment) -> dict:
    return {
        name: value for name, value in environment.items()
        if name.startswith(_READ_AT_START) and name != "PYTHONPATH" and name not in _SERVER_ONLY
    }  # fmt: skip


def _serve(name) -> dict:
    """Imports TensorFlow, then forks a child for each command. Returns only in a child: the
    command's request, to run."""
    import selectors

    before = dict(os.environ)
    import numpy  # noqa: F401
    import tensorflow  # noqa: F401

    after = {name: value for name, value in os.environ.items() if name not in _SERVER_ONLY}
    python_path = before.get("PYTHONPATH", "").split(os.pathsep)
    base_path = [entry for entry in sys.path[1:] if entry not in python_path]
    if len(os.listdir("/proc/self/task")) != 1:
        sys.exit("preloaded: a thread started with the imports; forking would not be safe")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind("\0" + name)
    listener.listen(64)
    woken, wake = socket.socketpair()
    woken.setblocking(False)
    wake.setblocking(False)
    signal.set_wakeup_fd(wake.fileno())
    signal.signal(signal.SIGCHLD, lambda *_: None)  # so that it writes to the wakeup socket
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    selector.register(woken, selectors.EVENT_READ)
    selector.register(sys.stdin.fileno(), selectors.EVENT_READ)
    waiting = {}  # child pid: its command's connection
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    while True:
        for key, _ in selector.select():
            if key.fileobj is listener:
                connection, _ = listener.accept()
                request = _received(connection, before, after)
                if request is None:
                    continue
                child = os.fork()
                if child == 0:
                    for open_ in (selector, listener, woken, wake, connection,
                                  *waiting.values()):  # fmt: skip
                        open_.close()
                    signal.set_wakeup_fd(-1)
                    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                    return _become(request, base_path)
                for fd in request["fds"]:
                    os.close(fd)
                waiting[child] = connection
                selector.register(connection, selectors.EVENT_READ, child)
                try:
                    connection.sendall(b"pid %d\n" % child)
                except OSError:  # the command is gone already: seen as closed, below
                    pass
            elif key.data is not None:  # a command's connection: it sends nothing, so it
                try:  # has ended (killed, perhaps busy in C code): its child ends too. Not
                    ended = not key.fileobj.recv(1)  # reaped yet, the pid is still its.
                except OSError:
                    ended = True
                if ended:
                    selector.unregister(key.fileobj)
                    os.kill(key.data, signal.SIGKILL)
            elif key.fileobj is woken:
                try:
                    while woken.recv(256):
                        pass
                except BlockingIOError:
                    pass
            elif not os.read(sys.stdin.fileno(), 1):  # the tests' process is done
                for child in waiting:
                    os.kill(child, signal.SIGKILL)
                for child in waiting:  # reaped, so that their CPU time is counted in ours
                    os.waitpid(child, 0)
                os._exit(0)  # TensorFlow's teardown takes a CPU-second, and holds nothing
        while waiting:
            child, status = os.waitpid(-1, os.WNOHANG)
            if not child:
                break
            connection = waiting.pop(child)
            if selector.get_map().get(connection.fileno()) is not None:
                selector.unregister(connection)
            try:
                connection.sendall(b"status %d\n" % status)
            except OSError:  # the command was killed
                pass
            connection.close()


def _received(connection, before, after) -> dict | None:
    """A command's request, with its standard streams and its environment as the imports
    would have left it; None where the command is to start a new interpreter (told so) or is
    gone. `before` and `after`: the server's environment before and after its imports."""
    fds = []
    try:
        connection.settimeout(30)
        data, fds, _, _ = socket.recv_fds(connection, 1 << 16, 3)
        more = data
        while more and not data.endswith(b"\n"):
            more = connection.recv(1 << 16)
            data += more
        request = json.loads(data)  # (a ValueError where the command died as it wrote)
        # What the imports set (TensorFlow sets TF2_BEHAVIOR), where the command had what the
        # server had.
        environment = request["environment"]
        for name, value in after.items():
            if environment.get(name) == before.get(name):
                environment[name] = value
        if len(fds) == 3 and _read_at_start(environment) == _read_at_start(after):
            connection.settimeout(None)
            return {**request, "fds": fds}
        connection.sendall(b"fresh\n")
    except (OSError, ValueError):  # killed as it asked
        pass
    for fd in fds:
        os.close(fd)
    connection.close()
    return None


def _become(request, base_path) -> dict:
    """This child takes the command's streams, environment, directory and path."""
    import tempfile

    import numpy

    for number, fd in enumerate(request["fds"]):
        os.dup2(fd, number)
        os.close(fd)
    os.environ.clear()
    os.environ.update(request["environment"])
    os.chdir(request["cwd"])
    tempfile.tempdir = None  # found again from TMPDIR
    numpy.random.seed()  # its own, as a new process's (random's is renewed at a fork)
    args = request["args"]
    python_path = [entry for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep) if entry]
    first = {"-c": "", "-m": os.getcwd()}.get(args[0], os.path.dirname(os.path.realpath(args[0])))
    sys.path[:] = [first, *python_path, *base_path]
    sys.orig_argv = [sys.executable, *args]
    sys.excepthook = _from_the_commands_frames

    if "multiprocessing.process" in sys.modules:  # where spawned processes find a script
        sys.modules["multiprocessing.process"].ORIGINAL_DIR = os.getcwd()
    return request


def _from_the_commands_frames(kind, error, traceback) -> None:
    """Python's report of an uncaught error, without this module's and runpy's frames."""
    while traceback is not None and traceback.tb_frame.f_code.co_filename in (
        __file__, "<frozen runpy>"
    ):
        traceback = traceback.tb_next
    sys.__excepthook__(kind, error.with_traceback(traceback), traceback)


def _run(args) -> None:
    """ARGS as `python ARGS...` runs them: `-c code`, `-m module` or a script."""
    import runpy

    if args[0] == "-c":
        sys.argv = ["-c", *args[2:]]
        if sys.version_info >= (3, 13):  # from 3.13 Python shows a command's lines in tracebacks
            import linecache

            lines = [line + "\n" for line in args[1].splitlines()]
            linecache.cache["<string>"] = (len(args[1]), None, lines, "<string>")
        _as_main(args[1], "<string>")
    elif args[0] == "-m":
        sys.argv = ["-m", *args[2:]]
        runpy.run_module(args[1], run_name="__main__", alter_sys=True)
    elif os.path.isfile(args[0]):  # as Python runs a script: __file__ absolute
        sys.argv = list(args)
        with open(args[0], "rb") as source:
            _as_main(source.read(), os.path.abspath(args[0]))
    else:  # a folder or zip with __main__.py, or a missing script (runpy says so)
        sys.argv = list(args)
        runpy.run_path(args[0], run_name="__main__")


def _run_and_exit(args) -> NoReturn:
    """Runs ARGS, then exits as Python would, without the teardown: Python's exit code, its
    report of an uncaught error, its wait for threads, its exit hooks and its flush."""
    import atexit
    import threading
    import traceback

    interrupted = False
    try:
        _run(args)
        code = 0
    except SystemExit as exit_:
        code = exit_.code
        if code is None:
            code = 0
        elif not isinstance(code, int):
            print(code, file=sys.stderr)
            code = 1
    except BaseException as error:  # KeyboardInterrupt too: Python then ends by SIGINT
        sys.excepthook(type(error), error, error.__traceback__)
        code, interrupted = 1, isinstance(error, KeyboardInterrupt)
    threading._shutdown()  # what Python's exit does first: waits for non-daemon threads
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None and not stream.closed:
                stream.flush()
        except Exception as error:  # as Python says it, and then it exits 120
            code = 120
            try:
                sys.stderr.write(f"Exception ignored in: {stream!r}\n"
                                 + "".join(traceback.format_exception_only(error)))  # fmt: skip
            except Exception:
                pass
    if interrupted:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(code)


def _as_main(source, filename: str) -> None:
    """`source` run as the module `__main__` (of file `filename`, unless "<string>")."""
    main = type(sys)("__main__")
    if filename != "<string>":
        main.__file__, main.__cached__ = filename, None
    sys.modules["__main__"] = main
    exec(compile(source, filename, "exec"), main.__dict__)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"]:
        _run_and_exit(_serve(sys.argv[2])["args"])
    else:  # --to NAME ARGS...
        _command(sys.argv[2], sys.argv[3:])
