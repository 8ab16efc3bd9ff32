"""docs/dataflow.md's table of the job at 1M, 10M and 100M images is what
`benchmarks.at_scale` computes now, from the job's own shard plan and elements; and the
command a benchmark prints above its table runs it again."""

import contextlib
import io
import pathlib
import shlex

from benchmarks import at_scale, command_line

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_the_docs_table_at_scale_is_the_scripts():
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        at_scale.main([])
    rows = [line for line in printed.getvalue().splitlines() if line.startswith("|")]
    assert len(rows) == 2 + len(at_scale.SIZES)  # the header, its rule, a row per size
    docs = (ROOT / "docs" / "dataflow.md").read_text()
    missing = [row for row in rows if row not in docs]
    assert not missing, "run python -m benchmarks.at_scale and update docs/dataflow.md"


def test_a_benchmark_prints_a_command_that_runs_again_as_shown():
    # reader_bench printed `--pipelines train grain, train`: run again, three pipelines.
    argv = ["--pipelines", "train", "grain, train", "--data", "/tmp/a b"]
    shown = command_line("benchmarks.reader_bench", argv)
    assert shlex.split(shown.removeprefix("$ ")) == ["python", "-m", "benchmarks.reader_bench", *argv]
    assert command_line("benchmarks", []) == "$ python -m benchmarks"
