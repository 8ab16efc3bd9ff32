"""The project's dependency lists, for the Makefile's `lock` and `test-latest`.

    python dev/requirements.py --unbounded   every requirement of the test extra, upper bounds
                                             lifted (what `make test-latest` installs)
    python dev/requirements.py --header      the comment that heads constraints.txt
    pip freeze | python dev/requirements.py --pins
                                             the pins of constraints.txt: pip freeze's, with
                                             the versions of other Pythons (BY_PYTHON) added
"""

from __future__ import annotations

import pathlib
import platform
import re
import sys

try:
    import tomllib
except ImportError:  # Python 3.10: pip vendors the same parser
    from pip._vendor import tomli as tomllib

ROOT = pathlib.Path(__file__).resolve().parents[1]


# Versions for Pythons other than the one `make lock` runs on, where a dependency wants other
# versions there: {package: {first Python: its version from there on}}. apache-beam[gcp] 2.77
# wants google-apitools <0.5.32 below Python 3.13 and >=0.5.35 from it.
# tests/test_environment.py checks every pin against every requirement on each Python.
BY_PYTHON = {"google-apitools": {"3.13": "0.5.35"}}


def requirements() -> list[str]:
    """Every requirement `.[test]` installs, the project's own extras resolved."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    own = re.compile(rf"^{re.escape(project['name'])}\[(.+)\]$")
    found, pending, seen = list(project["dependencies"]), ["test"], set()
    while pending:
        extra = pending.pop()
        if extra in seen:
            continue
        seen.add(extra)
        for requirement in extras[extra]:
            nested = own.match(requirement)
            if nested:
                pending.extend(name.strip() for name in nested.group(1).split(","))
            else:
                found.append(requirement)
    return found


def unbounded(requirement: str) -> str:
    """`requirement` without its upper bounds ("<2.22", "<=3"); extras and markers are kept."""
    spec, semicolon, marker = requirement.partition(";")
    name, specifiers = re.match(r"\s*([A-Za-z0-9._-]+(?:\[[^\]]*\])?)\s*(.*)", spec).groups()
    kept = [part.strip() for part in specifiers.split(",") if part.strip()[:1] not in ("", "<")]
    return name + ",".join(kept) + (f";{marker}" if semicolon else "")


def pins(frozen: list[str], python: tuple[int, int] = sys.version_info[:2]) -> list[str]:
    """pip freeze's lines, each package of BY_PYTHON pinned per Python with markers; frozen
    on `python`, which must be below every Python BY_PYTHON names (its versions are those
    below the first)."""
    firsts = {first for versions in BY_PYTHON.values() for first in versions}
    if any(python >= tuple(map(int, first.split("."))) for first in firsts):
        raise SystemExit(
            f"The lock must run on a Python below {min(firsts)} (BY_PYTHON's versions are for "
            "those from it): make lock PYTHON=python3.11"
        )
    lines = []
    for line in frozen:
        name, _, version = line.partition("==")
        firsts = sorted(BY_PYTHON.get(name.strip(), {}).items(),
                        key=lambda item: tuple(map(int, item[0].split("."))))  # fmt: skip
        if not firsts:
            lines.append(line)
            continue
        lines.append(f'{name}=={version}; python_version < "{firsts[0][0]}"')
        for (first, pinned), (after, _) in zip(firsts, [*firsts[1:], (None, None)]):
            upto = f' and python_version < "{after}"' if after else ""
            lines.append(f'{name}=={pinned}; python_version >= "{first}"{upto}')
    return lines


def header() -> str:
    return (
        "# The exact versions `make test` and `make demo` install (pip install -c), and the\n"
        "# suite passed with. Written by `make lock`, on Python "
        f"{platform.python_version()}, {platform.machine()} Linux.\n"
        "# pyproject.toml keeps ranges for users; `make test-latest` tries the newest releases.\n"
    )


if __name__ == "__main__":
    if sys.argv[1:] == ["--unbounded"]:
        print("\n".join(unbounded(requirement) for requirement in requirements()))
    elif sys.argv[1:] == ["--header"]:
        print(header(), end="")
    elif sys.argv[1:] == ["--pins"]:
        print("\n".join(pins(sys.stdin.read().splitlines())))
    else:
        sys.exit(__doc__)
