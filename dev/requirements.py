"""The project's dependency lists, for the Makefile's `lock` and `test-latest`.

    python dev/requirements.py --unbounded   every requirement of the test extra, upper bounds
                                             lifted (what `make test-latest` installs)
    python dev/requirements.py --header      the comment that heads constraints.txt
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
    else:
        sys.exit(__doc__)
