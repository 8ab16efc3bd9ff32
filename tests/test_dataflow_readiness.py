"""Ready for Dataflow, checked offline: a Flex Template's launch stages our own package and the
real steps.

`--template_location`, as the Flex Template's launcher gives it, makes the DataflowRunner do
everything but submit: check options, stage files to `--staging_location` (on the test GCS)
and write the job's JSON for the service to submit.
"""

import argparse
import json
import pathlib
import re
import subprocess
import sys
import tempfile
import tomllib

import pytest
from apache_beam.portability.api import beam_runner_api_pb2
from google.cloud import storage

import tfrecord_pipe
from beam_jobs import claim, convert, flags, worker_wheel

from helpers import IN_PROCESS, jpeg_bytes

ROOT = pathlib.Path(__file__).resolve().parents[1]
WHEEL = f"tfrecord_pipe-{tfrecord_pipe.__version__}-py3-none-any.whl"


@pytest.mark.slow
def test_a_flex_template_launch_stages_our_wheel_and_the_steps_and_hands_the_job_the_claim(
    gcs, tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))  # Beam leaves mkdtemp folders behind
    monkeypatch.setattr(tempfile, "tempdir", None)
    (tmp_path / "tmp").mkdir()
    bucket = storage.Client().bucket(gcs.bucket)
    bucket.blob("df-src/daisy/1.jpg").upload_from_string(jpeg_bytes())
    dataflow = ["--runner=DataflowRunner", "--project=test-project", "--region=us-central1",
                f"--temp_location={gcs.url('df-tmp')}",
                f"--staging_location={gcs.url('df-staging')}"]  # fmt: skip
    # A classic template froze the run's temporary folder: its runs shared one, and a run
    # after a failed one mixed both runs' shards, or kept the old dataset; its jobs held no
    # claim (a helper's trials). Refused, pointing at the Flex Template.
    with pytest.raises(ValueError, match="a classic template freezes .* Build the Flex Template"):
        convert.run([gcs.url("df-src"), gcs.url("df-out"), *dataflow,
                     f"--template_location={tmp_path / 'classic.json'}"])  # fmt: skip

    # A Flex Template's launcher: the runner writes the job for the service to submit, and the
    # launch hands the output's claim to the job. Every launch failed once the job was
    # written (its result has no job id to say: a helper's trial), giving the claim up.
    monkeypatch.setenv(convert.FLEX_LAUNCHER, "/template/src/beam_jobs/convert.py")
    flex_job = tmp_path / "flex-job.json"
    capsys.readouterr()
    assert convert.run([
        f"--source={gcs.url('df-src')}", f"--output={gcs.url('df-out')}", "--overwrite=false",
        "--validation_fraction=0.1", *dataflow, f"--template_location={flex_job}",
    ]) is None  # fmt: skip
    assert capsys.readouterr().out.startswith(f"Launched: it finalises {gcs.url('df-out')} itself")
    held = json.loads(bucket.blob(f"df-out/{claim.CLAIM_NAME}").download_as_bytes())
    assert held["host"] == claim.JOB_HOST  # the job's, for it to give up as it finishes

    staged = json.loads(flex_job.read_text())["environment"]["workerPools"][0]["packages"]
    names = {p["name"] for p in staged}
    assert WHEEL in names
    blobs = {b.name.rsplit("/", 1)[-1]: b for b in bucket.list_blobs(prefix="df-staging/")}

    pipeline = beam_runner_api_pb2.Pipeline()
    pipeline.ParseFromString(blobs["pipeline.pb"].download_as_bytes())
    labels = {t.unique_name for t in pipeline.components.transforms.values()}
    for step in (
        "List/Walk",
        "LoadImages",
        "WriteShards/PlanShards",
        "WriteShards/WriteShard",
        "WriteRejected",
        "FinaliseDataset/Finalise",
    ):
        assert any(label == step or label.startswith(step + "/") for label in labels), step

    # A worker pip-installs the staged wheel: do the same, then import the job's DoFns from it.
    wheel = tmp_path / WHEEL
    blobs[wheel.name].download_to_filename(wheel)
    target = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--target",
            str(target),
            str(wheel),
        ],
        check=True,
    )
    probe = (
        "import beam_jobs.load, tfrecord_pipe._core.schema, importlib.metadata as m;"
        "print(beam_jobs.load.__file__); print(m.requires('tfrecord-pipe'))"
    )
    # PYTHONPATH comes before site-packages: the import must resolve to the installed wheel.
    out = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin"},
    )
    assert out.returncode == 0, out.stderr
    assert str(target) in out.stdout
    assert re.search(r"apache-beam\[gcp\]\S*>=2\.60", out.stdout) and "google-crc32c" in out.stdout
    # Workers never import TensorFlow: the wheel does not make them install it.
    assert "tensorflow" not in out.stdout


def test_no_wheel_is_built_when_the_user_says_how_to_package():
    assert worker_wheel.user_packaged(["--setup_file=./setup.py"])
    assert worker_wheel.user_packaged(["--extra_package", "x.whl"])
    assert not worker_wheel.user_packaged(["--runner", "DataflowRunner"])


def flex_parameters() -> list[dict]:
    return json.loads((ROOT / "dataflow" / "metadata.json").read_text())["parameters"]


def test_every_flex_template_parameter_is_a_converter_flag_and_switches_take_true_or_false():
    parser = flags.make_parser()
    options = {
        max(a.option_strings, key=len).lstrip("-"): a for a in parser._actions if a.option_strings
    }
    parameters = flex_parameters()
    for parameter in parameters:
        assert parameter["name"] in options, parameter["name"]
        switch = isinstance(options[parameter["name"]], argparse._StoreTrueAction)
        assert (parameter.get("regexes") == ["^(true|false)$"]) == switch, parameter["name"]
        # A number's parameter is checked by Dataflow as the run is asked for: "abc" reached
        # the launcher, whose error pointed at a --help a template's user cannot run.
        flag = options[parameter["name"]]
        if flag.type in (int, float):
            (regex,) = parameter["regexes"]
            given = "1" if flag.default is None else str(flag.default)
            assert re.fullmatch(regex, given), parameter["name"]
            assert not any(re.fullmatch(regex, wrong) for wrong in ("abc", "-1", "")), regex
    required = {p["name"] for p in parameters if not p.get("isOptional")}
    assert required == {"source", "output"}
    # Every option of ours that a run would want is offered (not the launcher's own).
    offered = {p["name"] for p in parameters}
    assert set(options) - offered == {"help", "no_wait", "verbose"}


def test_a_local_run_in_the_flex_launchers_image_converts_and_waits(tmp_path, monkeypatch):
    # The launcher's variable made a local run (`docker run` of the image, to try it) a
    # launch: "Launched", no summary, and a 48-hour claim that refused the next run (a
    # helper's trial).
    monkeypatch.setenv(convert.FLEX_LAUNCHER, "/template/src/beam_jobs/convert.py")
    (tmp_path / "src" / "daisy").mkdir(parents=True)
    (tmp_path / "src" / "daisy" / "1.jpg").write_bytes(jpeg_bytes())
    found = convert.run([str(tmp_path / "src"), str(tmp_path / "out"), *IN_PROCESS])
    assert found is not None and found.splits["train"].num_examples == 1
    assert not (tmp_path / "out" / claim.CLAIM_NAME).exists()


def test_a_flex_template_command_line_makes_the_same_conversion_as_the_usual_one():
    usual = [
        "gs://b/images",
        "gs://b/dataset",
        "--validation_fraction",
        "0.1",
        "--compress",
        "--num_shards",
        "8",
    ]
    flex = [
        "--source=gs://b/images",
        "--output=gs://b/dataset",
        "--validation_fraction=0.1",
        "--compress=true",
        "--overwrite=false",
        "--num_shards=8",
    ]
    configs = []
    for argv in (usual, flex):
        args, beam_args = flags.parse(flags.make_parser(), argv)
        assert beam_args == []
        configs.append(flags.config_from_args(args))
    assert configs[0] == configs[1]
    with pytest.raises(ValueError, match="--compress takes true or false"):
        flags.parse(flags.make_parser(), ["--source=a", "--output=b", "--compress=yes"])
    with pytest.raises(ValueError, match="SOURCE is given twice"):
        flags.parse(flags.make_parser(), ["a", "b", "--source=c"])
    with pytest.raises(ValueError, match="No OUTPUT"):
        flags.parse(flags.make_parser(), ["--source=a"])


def test_the_container_recipes_install_the_job_without_tensorflow():
    launcher = (ROOT / "dataflow" / "launcher.Dockerfile").read_text()
    worker = (ROOT / "dataflow" / "worker.Dockerfile").read_text()
    entry = re.search(r"FLEX_TEMPLATE_PYTHON_PY_FILE=/template/src/(\S+)", launcher).group(1)
    assert (ROOT / entry).is_file()
    # Run as the launcher runs it (a script, its folder first on sys.path), it must start.
    done = subprocess.run([sys.executable, str(ROOT / entry), "--help"], capture_output=True,
                          text=True, cwd="/", timeout=120)  # fmt: skip
    assert done.returncode == 0 and "--no_wait" in done.stdout, done.stderr[-2000:]
    for recipe, extra in ((launcher, "[beam]"), (worker, "[${EXTRAS}]")):
        installs = [line for line in recipe.splitlines() if line.startswith("RUN pip install")]
        assert installs and all(f'{extra}"' in line and "tensorflow" not in line for line in installs)
        # At the versions the suite passed with, as `make test` installs them.
        assert all(re.search(r" -c \S+/constraints\.txt ", line) for line in installs)
    # The workers' image: Beam's extra, all that the workers of the conversion and verify need.
    assert re.search(r"^ARG EXTRAS=beam$", worker, re.M)
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert {"beam", "all"} <= set(extras)
    # The SDK image must match the Beam that launches the job: the pinned one (not whatever
    # is installed here, which `make test-latest` changes).
    beam_version = re.search(r"beam_python3\.\d+_sdk:(\S+)", worker).group(1)
    pinned = re.search(r"^apache-beam==(\S+)$", (ROOT / "constraints.txt").read_text(), re.M)
    assert beam_version == pinned.group(1)
