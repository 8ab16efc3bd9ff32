"""The pinned environment: constraints.txt pins every package `make test` installs, within
pyproject.toml's ranges, and every range has a tested upper bound."""

import importlib.util
import pathlib
import re

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = pathlib.Path(__file__).resolve().parents[1]


def dev_requirements():
    spec = importlib.util.spec_from_file_location("dev_requirements", ROOT / "dev" / "requirements.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def pinned() -> dict[str, str]:
    text = (ROOT / "constraints.txt").read_text()
    pins = re.findall(r"^([A-Za-z0-9._-]+)==(\S+)$", text, re.M)
    lines = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert len(pins) == len(lines), "every line of constraints.txt is an exact pin"
    return {canonicalize_name(name): version for name, version in pins}


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
