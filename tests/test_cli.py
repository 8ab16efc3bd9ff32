"""The installed `tfrecord-pipe` command, run as a user runs it."""

import json

import pytest

from helpers import jpeg_bytes, run_cli, run_command


@pytest.mark.slow
def test_convert_writes_a_dataset_and_prints_the_summary(tmp_path):
    for label in ("cat", "dog"):
        (tmp_path / "src" / label).mkdir(parents=True)
        for i in range(3):
            (tmp_path / "src" / label / f"{i}.jpg").write_bytes(jpeg_bytes(8, 8))
    result = run_command("convert", tmp_path / "src", tmp_path / "out",
                         "--direct_num_workers=2", "--direct_running_mode=multi_processing")
    assert result.returncode == 0, result.stderr
    assert "train: 6 in 1 shards; 0 rejected" in result.stdout
    # One progress line for the whole job, summed over its worker processes.
    finals = [line for line in result.stderr.splitlines() if line.startswith("converting: ")]
    assert finals and finals[-1].startswith("converting: 6 inputs loaded (0 rejected)")
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["labels"] == ["cat", "dog"]


def test_convert_on_a_missing_folder_exits_2_with_one_clear_line(tmp_path):
    result = run_cli("convert", tmp_path / "missing", tmp_path / "out")
    assert result.returncode == 2
    assert len(result.errors) == 1 and "No files found under" in result.errors[0]
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_help_lists_the_commands():
    result = run_command("--help")
    assert result.returncode == 0
    for command in ("convert", "inspect", "verify", "bench"):
        assert command in result.stdout


def test_no_command_is_bad_input():
    assert run_cli().returncode == 2
