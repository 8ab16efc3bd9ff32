"""The same job on other engines gives the same dataset, byte for byte: Beam's local runner
in several worker processes (`--direct_running_mode=multi_processing`), against its
in-process run."""

import json

import pytest

from beam_jobs import convert

from helpers import IN_PROCESS, run_command, write_image_folder


def files_of(out) -> dict[str, bytes]:
    """Every file of a dataset folder, the manifest without the output path it records."""
    found = {}
    for path in sorted(out.rglob("*")):
        if path.is_file():
            data = path.read_bytes()
            if path.name == "manifest.json":
                manifest = json.loads(data)
                manifest["conversion"].pop("output")
                data = json.dumps(manifest, sort_keys=True).encode()
            found[str(path.relative_to(out))] = data
    return found


@pytest.mark.slow
def test_several_worker_processes_write_the_in_process_runs_bytes(tmp_path):
    src = write_image_folder(tmp_path / "src", per_label=12, odd=("truncated_jpeg.jpg",))
    (src / "red" / "copy.jpg").write_bytes((src / "green" / "000.jpg").read_bytes())
    options = ["--validation_fraction", "0.3", "--formats", "tfrecord,array_record"]
    convert.run([str(src), str(tmp_path / "alone"), *options, *IN_PROCESS])
    several = run_command("convert", src, tmp_path / "several", *options,
                          "--direct_running_mode=multi_processing", "--direct_num_workers=2")  # fmt: skip
    assert several.returncode == 0, several.stderr
    written = files_of(tmp_path / "several")
    assert written == files_of(tmp_path / "alone")
    assert any(name.endswith(".array_record") for name in written)
    assert "rejected/rejected-train.jsonl" in written or "rejected/rejected-validation.jsonl" in (
        written
    )
    assert "duplicates.jsonl" in written
    # What the command says (a test of its own until 0.5.0): the summary; one progress line
    # for the whole job, summed over its worker processes; no worker's start-up warning as
    # raw protobuf text.
    found = json.loads((tmp_path / "several" / "manifest.json").read_text())
    listed = sum(split["listed"] for split in found["splits"].values())
    rejected = sum(split["rejected"] for split in found["splits"].values())
    assert (listed, rejected) == (38, 1)  # 12 of each of 3 labels, a copy, a truncated file
    assert several.stdout.startswith(f"Converted into {tmp_path / 'several'} (")
    assert "; 1 rejected (truncated 1)." in several.stdout.splitlines()[0]
    finals = [line for line in several.stderr.splitlines() if line.startswith("converting: ")]
    assert finals and finals[-1].startswith("converting: 38 inputs loaded (1 rejected)")
    assert "semi_persistent_directory" not in several.stderr


@pytest.mark.parametrize("runner", ["DaskRunner", "apache_beam.runners.dask.dask_runner.DaskRunner"])
def test_the_dask_runner_is_refused_before_anything_runs_saying_why_and_what_instead(
    tmp_path, runner
):
    src = write_image_folder(tmp_path / "src", per_label=1)
    with pytest.raises(ValueError, match="several outputs.*--direct_running_mode=multi_processing"):
        convert.run([str(src), str(tmp_path / "out"), "--runner", runner])
    assert not (tmp_path / "out").exists()
