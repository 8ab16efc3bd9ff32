"""The pinned environment: constraints.txt pins every package `make test` installs, within
pyproject.toml's ranges, and every range has a tested upper bound."""

import importlib.metadata
import importlib.util
import pathlib
import re
import shutil
import subprocess
import sys
import tomllib

import pytest
from packaging.markers import Marker, default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = pathlib.Path(__file__).resolve().parents[1]


def dev_requirements():
    spec = importlib.util.spec_from_file_location("dev_requirements", ROOT / "dev" / "requirements.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# pip freeze leaves these out (pip itself is pinned in the Makefile).
FREEZE_LEAVES_OUT = {"pip", "setuptools", "wheel", "distribute"}
# The Pythons `make` takes (the Makefile's PYTHONS); the suite runs on the first.
PYTHONS = tuple(re.search(r"^PYTHONS := (.+)$", (ROOT / "Makefile").read_text(), re.M)[1].split())


def pinned(python: str = PYTHONS[0]) -> dict[str, str]:
    """constraints.txt's exact version of each package, on `python` (some pins are per Python)."""
    text = (ROOT / "constraints.txt").read_text()
    pins = re.findall(r"^([A-Za-z0-9._-]+)==([^\s;]+)(?:; (.+))?$", text, re.M)
    lines = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert len(pins) == len(lines), "every line of constraints.txt is an exact pin"
    return {
        canonicalize_name(name): version
        for name, version, marker in pins
        if not marker or Marker(marker).evaluate(on_python(python))
    }


def on_python(python: str, extra: str = "") -> dict[str, str]:
    """The marker environment of this machine with `python` as the Python."""
    return {**default_environment(), "python_version": python,
            "python_full_version": python + ".0", "extra": extra}  # fmt: skip


def test_every_requirement_is_pinned_within_its_range_and_has_an_upper_bound():
    pins = pinned()
    requirements = [Requirement(text) for text in dev_requirements().requirements()]
    assert {"tensorflow", "apache-beam", "jax", "pytest"} <= {r.name for r in requirements}
    for requirement in requirements:
        version = pins.get(canonicalize_name(requirement.name))
        assert version, f"{requirement.name} is not pinned in constraints.txt: run make lock"
        assert requirement.specifier.contains(version), (
            f"constraints.txt pins {requirement.name}=={version}, outside pyproject.toml's "
            f"{requirement}: raise the bound there (after make test-latest) or run make lock"
        )
        assert any(spec.operator in ("<", "<=") for spec in requirement.specifier), (
            f"{requirement} has no upper bound: add the next release after the tested one"
        )


def test_the_pins_meet_every_requirement_of_every_package_on_each_python():
    # apache-beam[gcp] 2.77 wants google-apitools <0.5.32 below Python 3.13 and >=0.5.35 from
    # it: with one pin, make demo failed on Python 3.13 (Debian 13's) in pip's resolver.
    # The installed packages' own requirements are read, each evaluated on each Python.
    for python in PYTHONS:
        pins = pinned(python)
        ours = dev_requirements().requirements()
        pending = [(Requirement(text), "tfrecord-pipe") for text in ours]
        seen = set()
        while pending:
            requirement, wanted_by = pending.pop()
            extras = sorted(requirement.extras)
            if requirement.marker and not any(
                requirement.marker.evaluate(on_python(python, extra)) for extra in ["", *extras]
            ):
                continue
            name = canonicalize_name(requirement.name)
            if name in FREEZE_LEAVES_OUT:
                continue
            version = pins.get(name)
            assert version, f"on Python {python}, {wanted_by} needs {name}, which is not pinned"
            assert requirement.specifier.contains(version, prereleases=True), (
                f"on Python {python}, {wanted_by} wants {requirement}, and constraints.txt pins"
                f" {name}=={version}: add its version there to dev/requirements.py's BY_PYTHON"
            )
            if (name, tuple(extras)) in seen:
                continue
            seen.add((name, tuple(extras)))
            try:
                installed = importlib.metadata.distribution(name)
            except importlib.metadata.PackageNotFoundError:
                continue  # only another Python needs it: its requirements are not here to read
            if installed.version != version:
                continue  # another Python's pin: the same
            for text in installed.requires or []:
                child = Requirement(text)
                marker = child.marker
                if marker is None or any(
                    marker.evaluate(on_python(python, extra)) for extra in ["", *extras]
                ):
                    child.marker = None
                    pending.append((child, f"{name}=={version}"))


def test_the_lock_pins_other_pythons_versions_beside_pip_freezes():
    module = dev_requirements()
    frozen = ["absl-py==2.5.1", "google-apitools==0.5.31", "zipp==4.1.2"]
    assert module.pins(frozen, python=(3, 11)) == [
        "absl-py==2.5.1",
        'google-apitools==0.5.31; python_version < "3.13"',
        'google-apitools==0.5.35; python_version >= "3.13"',
        "zipp==4.1.2",
    ]
    # Frozen on Python 3.13, apitools would be 3.13's version, pinned below 3.13 too.
    with pytest.raises(SystemExit, match="The lock must run on a Python below 3.13"):
        module.pins(["google-apitools==0.5.35"], python=(3, 13))
    module.BY_PYTHON["zipp"] = {"3.14": "5.0", "3.12": "4.9"}
    try:
        assert module.pins(["zipp==4.1.2"], python=(3, 11)) == [
            'zipp==4.1.2; python_version < "3.12"',
            'zipp==4.9; python_version >= "3.12" and python_version < "3.14"',
            'zipp==5.0; python_version >= "3.14"',
        ]
    finally:
        del module.BY_PYTHON["zipp"]


def test_test_latest_lifts_the_upper_bounds_and_keeps_the_rest():
    module = dev_requirements()
    assert module.unbounded("tensorflow>=2.16,<2.22") == "tensorflow>=2.16"
    assert module.unbounded("apache-beam[gcp]<2.78,>=2.60") == "apache-beam[gcp]>=2.60"
    assert module.unbounded("jax[cpu]<0.11") == "jax[cpu]"
    assert module.unbounded('x>=1,<2; python_version < "3.12"') == 'x>=1; python_version < "3.12"'
    for text in module.requirements():
        assert "<" not in module.unbounded(text).partition(";")[0]


def test_the_projects_modules_are_compiled_once_as_an_installed_packages_are():
    # An editable install is never compiled, and with PYTHONDONTWRITEBYTECODE set every
    # process a conversion starts compiled our modules again; `make install` and the
    # conversion benchmarks compile them as `pip install` compiles a package's.
    from benchmarks import compiled

    module = ROOT / "beam_jobs" / "load.py"
    cached = pathlib.Path(importlib.util.cache_from_source(str(module)))
    cached.unlink(missing_ok=True)
    assert compiled.compile_project()
    assert cached.stat().st_mtime_ns >= module.stat().st_mtime_ns
    assert "benchmarks.compiled" in (ROOT / "Makefile").read_text()


def make(tmp_path, *goals, pythons=(), options=("-n",)):
    """`make` run in a copy of what the Makefile reads, with a PATH of the shell tools it
    uses, a `python3` that is Python 3.10 (Ubuntu 22.04's), and `pythons` (name: path)."""
    project, tools = tmp_path / "project", tmp_path / "bin"
    project.mkdir(parents=True, exist_ok=True), tools.mkdir(parents=True)
    for name in ("Makefile", "pyproject.toml", "constraints.txt"):
        shutil.copy(ROOT / name, project / name)
    for tool in ("sh", "make", "sed", "cat", "cksum", "cut", "tr", "test", "rm", "touch"):
        (tools / tool).symlink_to(shutil.which(tool))
    old = tools / "python3"
    old.write_text('#!/bin/sh\n[ "$1" = "--version" ] && { echo "Python 3.10.12"; exit 0; }\n'
                   "exit 1\n")  # fmt: skip
    old.chmod(0o755)
    for name, path in dict(pythons).items():
        (tools / name).symlink_to(path)
    return subprocess.run(["make", *options, *goals], cwd=project, capture_output=True, text=True,
                          env={"PATH": str(tools), "HOME": str(tmp_path)}, timeout=60)  # fmt: skip


def test_make_finds_a_python_the_pinned_versions_support_or_says_what_to_install(tmp_path):
    # Ubuntu 22.04's python3 is 3.10, which constraints.txt has no versions for: pip's
    # resolver failed on jax, minutes into the install.
    assert pyproject_requires_python() == f">={PYTHONS[0]}"
    found = make(tmp_path / "found", "demo", pythons={"python3.11": sys.executable})
    assert found.returncode == 0, found.stderr
    assert "python3.11 -m venv --clear .venv" in found.stdout
    chosen = make(tmp_path / "chosen", "demo", "PYTHON=" + sys.executable)
    assert f"{sys.executable} -m venv --clear .venv" in chosen.stdout
    # A real Python the pins do not know (as Python 3.14 would be) is passed over, and said.
    unknown = make(tmp_path / "unknown", "demo", "PYTHONS=3.12 3.13", options=(),
                   pythons={"python3.11": sys.executable})  # fmt: skip
    assert unknown.returncode != 0 and "needs Python 3.12 to 3.13;" in unknown.stderr
    for goal, given in (("demo", ()), ("test", ("PYTHON=python3",))):
        refused = make(tmp_path / goal, goal, *given, options=())
        assert refused.returncode != 0
        assert (
            "make: tfrecord-pipe needs Python 3.11 to 3.13; python3 here is Python 3.10.12."
            " Install one (on Ubuntu 22.04: sudo apt install python3.11 python3.11-venv) or name"
            f" it: make {goal} PYTHON=/path/to/python3.11"
        ) in refused.stderr
        assert not (tmp_path / goal / "project" / ".venv").exists()


def test_make_refuses_a_venv_of_an_old_python_and_remakes_one_without_pip(tmp_path):
    old = tmp_path / "old"
    venv = old / "project" / ".venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "python").symlink_to(tmp_path / "old" / "bin" / "python3")  # the 3.10 made below
    refused = make(old, "demo", pythons={"python3.11": sys.executable}, options=())
    assert "make: .venv was made with Python 3.10.12; this project needs Python 3.11 to 3.13." \
        " Remove it (make clean) and run make again." in refused.stderr  # fmt: skip
    # A venv made without pip (Debian's python3-venv missing when it was made) is made again.
    remade = tmp_path / "remade"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", remade / "project" / ".venv"],
                   check=True)  # fmt: skip
    dry = make(remade, "demo", pythons={"python3.11": sys.executable})
    assert "python3.11 -m venv --clear .venv" in dry.stdout


def pyproject_requires_python() -> str:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
