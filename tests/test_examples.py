"""`make demo` stays true: the end-to-end example runs and learns, as a user would run it."""

import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_demo_converts_trains_evaluates_exports_and_predicts(tmp_path):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    done = subprocess.run(
        [sys.executable, "-m", "examples.demo", "--out", str(tmp_path / "demo")],
        cwd=ROOT, capture_output=True, text=True, env=env, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    out = done.stdout
    assert "1 rejected ({'truncated': 1}), none lost" in out
    assert "[5/5] predictions of the loaded SavedModel:" in out
    assert "demo: OK" in out
    assert (tmp_path / "demo" / "export" / "saved_model.pb").exists()
