"""TensorFlow loaded without its start-up noise: the commands that read with it (inspect,
bench), `verify --decode`'s workers, and any program that calls `start` before it imports
TensorFlow (`make demo`)."""

from __future__ import annotations

import os
import re
import sys
import tempfile

# TensorFlow's start-up lines on a machine without a GPU: nothing a user needs to act on. The
# oneDNN note comes on CPUs where TensorFlow turns oneDNN on by default (AVX-512 ones), twice.
_START_UP_NOISE = re.compile(
    r"WARNING: All log messages before absl::InitializeLog|"
    r"[IWE]\d{4} [\d:. ]+\d+ (cudart_stub|cuda_platform|cuda_executor|cuda_dnn|cuda_fft|"
    r"cuda_blas|cpu_feature_guard)\.cc|"
    r"To enable the following instructions:|This TensorFlow binary is optimized|"
    r"[IWE]\d{4} [\d:. ]+\d+ port\.cc:\d+\] oneDNN custom operations are on"
)


def start(verbose: bool = False) -> None:
    """Loads TensorFlow and lets it find its devices with its stderr held back, unless
    `verbose`: on a machine without a GPU it prints CUDA failures, CPU feature notes and
    absl's pre-init warning on every command, none of which is news. What it printed besides
    those is passed on; all of it, if loading fails. (A crash that kills the process, as a
    CPU without AVX does, loses it: --verbose shows it then.)
    """
    if verbose:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "0")
        import tensorflow  # noqa: F401

        return
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # later INFO lines too ("rendezvous")
    sys.stderr.flush()
    kept = os.dup(2)
    failed = True
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            import tensorflow as tf

            tf.config.list_physical_devices()  # where the CUDA probing prints
            tf.get_logger().setLevel("ERROR")
            failed = False
        except KeyboardInterrupt:  # Ctrl-C as it loads: the command ends, and nothing failed
            failed = False
            raise
        finally:
            os.dup2(kept, 2)
            os.close(kept)
            held.seek(0)
            lines = held.read().decode("utf-8", "replace").splitlines(keepends=True)
            shown = [line for line in lines if failed or not _START_UP_NOISE.match(line)]
            sys.stderr.write("".join(shown))
