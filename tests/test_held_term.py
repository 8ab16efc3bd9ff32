"""held_term: SIGTERM held until the step in flight ends, never for ever, and its default
again afterwards. Each case in a process of its own: SIGTERM's handling is the process's."""

import signal

from helpers import run_python

_SETUP = """
import os, signal, sys, threading
from tfrecord_pipe._reading import held_term
"""


def test_held_then_let_go_it_leaves_sigterm_and_the_wakeup_pipe_as_it_found_them():
    ran = run_python(_SETUP + """
held = held_term.HeldTerm(lambda frame: True)
assert held.install() is None
os.kill(os.getpid(), signal.SIGTERM)  # noted, not the end
assert held.asked
assert held.uninstall()  # it came: the caller ends the process
assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL and signal.set_wakeup_fd(-1) == -1
# One left installed by a loop that ended by an error is replaced, not taken for the program's.
held_term.HeldTerm(lambda frame: True).install()
again = held_term.HeldTerm(lambda frame: True)
assert again.install() is None
assert not again.uninstall()
assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
# A handler of the program's own, an event loop's wakeup pipe, another thread: left alone.
own = lambda signum, frame: None
signal.signal(signal.SIGTERM, own)
print(held_term.HeldTerm(lambda frame: True).install())
assert signal.getsignal(signal.SIGTERM) is own
signal.signal(signal.SIGTERM, signal.SIG_DFL)
read, write = os.pipe()
os.set_blocking(write, False)
signal.set_wakeup_fd(write)
print(held_term.HeldTerm(lambda frame: True).install())
assert signal.set_wakeup_fd(-1) == write and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
said = []
thread = threading.Thread(target=lambda: said.append(held_term.HeldTerm(lambda f: True).install()))
thread.start(), thread.join()
print(said[0])
print("threads", threading.active_count())
""")
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert ran.stdout.splitlines() == [
        "the program handles (or ignores) SIGTERM itself",
        "another part of the program (an event loop) listens for signals",
        "training runs outside the main thread, where no signal handler can be set",
        "threads 1",  # every watcher ended
    ]


def test_a_step_that_never_ends_does_not_hold_sigterm_for_ever():
    # The handler runs only once the main thread is back in Python; blocked in a call that
    # never returns (here a read of a pipe nobody writes), the watcher ends the process.
    ran = run_python(_SETUP + """
held = held_term.HeldTerm(lambda frame: True, wait_s=1.0)
held.install()
os.kill(os.getpid(), signal.SIGTERM)
os.read(os.pipe()[0], 1)
""", timeout=60)  # fmt: skip
    assert ran.returncode == 128 + signal.SIGTERM, ran.stderr[-3000:]
    assert "SIGTERM: training reached no step's end within 1 s (a hung step" in ran.stderr


def test_sigterm_once_nothing_would_save_ends_the_process_at_once_as_by_default():
    ran = run_python(_SETUP + """
held = held_term.HeldTerm(lambda frame: False)
held.install()
os.kill(os.getpid(), signal.SIGTERM)
print("went on")
""")  # fmt: skip
    assert ran.returncode == -signal.SIGTERM and "went on" not in ran.stdout, ran.stderr[-3000:]
    # And where something saves: ended by SIGTERM, as by default, once asked to.
    ran = run_python(_SETUP + """
held = held_term.HeldTerm(lambda frame: True)
held.install()
os.kill(os.getpid(), signal.SIGTERM)
print("saved", held.asked, flush=True)
held.saving()
held.end()
print("went on")
""")  # fmt: skip
    assert ran.returncode == -signal.SIGTERM, ran.stderr[-3000:]
    assert ran.stdout.splitlines() == ["saved True"]


def test_a_process_forked_while_it_is_held_ends_by_sigterm_and_wakes_no_watcher():
    # A child forked during training (Keras's data workers) kept the handler and wrote to
    # the parent's wakeup pipe: it outlived SIGTERM, and the parent's watcher, woken by the
    # child's signal, ended the parent a minute later.
    ran = run_python(_SETUP + """
import time
held = held_term.HeldTerm(lambda frame: True, wait_s=1.0)
held.install()
child = os.fork()
if child == 0:
    time.sleep(30)
    os._exit(0)
os.kill(child, signal.SIGTERM)
_, status = os.waitpid(child, 0)
print("child ended by SIGTERM", os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGTERM)
time.sleep(2)  # past the watcher's wait
print("parent asked", held.asked, "heard", held.uninstall())
""", timeout=60)  # fmt: skip
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert ran.stdout.splitlines() == ["child ended by SIGTERM True", "parent asked False heard False"]


def test_a_hold_left_by_a_loop_that_failed_neither_loses_sigterm_nor_takes_the_program_s():
    # SIGTERM came, then the loop failed (no callback tells a hold so): the next hold, a
    # retried fit's, let it go and trained on. It now ends the process.
    ran = run_python(_SETUP + """
left = held_term.HeldTerm(lambda frame: True)
left.install()
os.kill(os.getpid(), signal.SIGTERM)
print("asked", left.asked, flush=True)
held_term.HeldTerm(lambda frame: True).install()
print("went on")
""")  # fmt: skip
    assert ran.returncode == -signal.SIGTERM, ran.stderr[-3000:]
    assert ran.stdout.splitlines() == ["asked True"]
    # A handler the program sets after such a hold gets its SIGTERM; the hold's watcher, which
    # still hears it, ended the process a minute later.
    ran = run_python(_SETUP + """
import time
held_term.HeldTerm(lambda frame: True, wait_s=1.0).install()
got = []
signal.signal(signal.SIGTERM, lambda signum, frame: got.append(signum))
os.kill(os.getpid(), signal.SIGTERM)
time.sleep(2)  # past the watcher's wait
print("handled", got == [signal.SIGTERM])
""")  # fmt: skip
    assert ran.returncode == 0 and ran.stdout.splitlines() == ["handled True"], ran.stderr[-3000:]
