"""Large freed buffers go back to the system, so a worker's memory does not creep up per image."""

import os
import subprocess
import sys

import pytest

# Image-sized buffers freed between small objects that stay alive, as a worker does per input;
# prints how much of the freed memory the process still holds.
SCRIPT = """
import sys
from beam_jobs import malloc
if sys.argv[1] == "fixed":
    assert malloc.keep_large_buffers_in_mmap()
first = b"\\x01" * (8 << 20)
del first  # glibc now serves blocks below 8 MiB from the heap, unless the threshold is fixed

def rss_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 >> 20

start = rss_mib()
kept, buffers = [], []
for _ in range(200):
    buffers.append(b"\\x01" * (1 << 20))  # a decoded image, written
    kept.append(b"\\x02" * 20000)  # something the runner keeps per input
del buffers
print(rss_mib() - start)
"""


def held_mib(mode: str) -> int:
    # glibc's defaults: a machine's own tuning (MALLOC_MMAP_THRESHOLD_=...) would hold "default"
    # to other thresholds.
    env = {name: value for name, value in os.environ.items()
           if not name.startswith(("MALLOC_", "GLIBC_TUNABLES"))}  # fmt: skip
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, check=True, env=env
    )
    return int(result.stdout.strip())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc only")
def test_freed_image_buffers_are_returned_to_the_system():
    assert held_mib("default") > 100  # what happens without it: 200 MiB freed, kept
    assert held_mib("fixed") < 32


def test_a_conversion_leaves_its_callers_garbage_to_the_collector(tmp_path):
    # The launcher freezes the objects that exist as the job starts (so that its collections
    # skip the modules'); a long-lived caller's garbage from before must still go after.
    import gc
    import weakref

    from beam_jobs import convert

    from helpers import write_image_folder

    class Node:
        pass

    node = Node()
    node.me = node  # a cycle: only the collector frees it
    gone = weakref.ref(node)
    del node
    source = write_image_folder(tmp_path / "src", per_label=2)
    before = gc.get_freeze_count()  # 0, but Python 3.12's own (malloc.objects_so_far_frozen)
    convert.run([str(source), str(tmp_path / "out")])
    assert gc.get_freeze_count() == before
    gc.collect()
    assert gone() is None
    # A caller's own freeze (before it forks, say) is left as it was.
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        convert.run([str(source), str(tmp_path / "again")])
        assert gc.get_freeze_count() > frozen // 2  # (frozen objects freed leave it)
    finally:
        gc.unfreeze()
