# Two commands do all the set-up on a fresh clone: `make demo` and `make test`.
# Both create (or reuse) .venv in the checkout and install the project into it, with every
# package at the version in constraints.txt: the versions the suite passed with.
# The Pythons the pins of constraints.txt are checked for (tests/test_environment.py reads
# this line). .venv is made with python3 where it is one of them, else the first of
# python3.11, python3.12, ... found (Ubuntu 22.04's python3 is 3.10; Fedora's may be newer
# than the pins know). `make demo PYTHON=python3.12` chooses one.
PYTHONS := 3.11 3.12 3.13
PYTHON_OK := import sys; sys.exit("%d.%d" % sys.version_info[:2] not in "$(PYTHONS)".split())
PYTHONS_SAID := $(firstword $(PYTHONS)) to $(lastword $(PYTHONS))
ifndef PYTHON
PYTHON := $(shell for p in python3 $(addprefix python,$(PYTHONS)); do \
  $$p -c '$(PYTHON_OK)' 2>/dev/null && { echo $$p; break; }; done)
endif
VENV := .venv
BIN := $(VENV)/bin
CONSTRAINTS := constraints.txt
# pip itself, pinned with the rest (pip freeze leaves it out).
PIP_VERSION := 26.3
# Re-install when the declared dependencies or their pinned versions change.
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml $(CONSTRAINTS) | cksum | cut -d' ' -f1)
PYTEST_ARGS ?=
# Test processes (pytest-xdist). Much of the suite waits (on subprocesses, TensorFlow
# starting, retries' backoff), so three keep a 2-core machine's cores busier than two:
# 7:51 against 8:14 for the whole suite (2026-11-28). Each worker starts its own test GCS.
PYTEST_WORKERS ?= 3
# The fast subset has few tests that wait, and each worker first spends 8 CPU-s collecting the
# suite: two workers, 54 s against three's 60 s (2026-12-07).
PYTEST_FAST_WORKERS ?= 2
# setuptools prints a boxed "Editable installation" note for every editable install of a project
# with two top-level packages; it is information only, and was a new user's first question.
# Filtered by its text, so its other warnings still show.
EDITABLE_NOTE_HIDDEN := PYTHONWARNINGS="ignore:Editable installation"
# $(call make_venv,DIR): a venv made with $(PYTHON) (emptied first, if half-made), or a
# message saying what to install.
make_venv = { $(PYTHON) -c '$(PYTHON_OK)' 2>/dev/null || { echo "make: tfrecord-pipe needs" \
  "Python $(PYTHONS_SAID); $(or $(PYTHON),python3) here is" \
  "$$($(or $(PYTHON),python3) --version 2>&1 | tr -d '\n')." "Install one (on Ubuntu 22.04:" \
  "sudo apt install python3.11 python3.11-venv) or name it: make $(or $(MAKECMDGOALS),install)" \
  "PYTHON=/path/to/python3.11" >&2; exit 1; } && $(PYTHON) -m venv --clear $(1); }

.PHONY: install test test-fast test-latest lock demo clean

install: $(STAMP)

$(STAMP): pyproject.toml $(CONSTRAINTS)
	@$(BIN)/python -c '$(PYTHON_OK)' 2>/dev/null || ! test -x $(BIN)/python || { \
	  echo "make: $(VENV) was made with $$($(BIN)/python --version 2>&1); this project needs" \
	    "Python $(PYTHONS_SAID). Remove it (make clean) and run make again." >&2; exit 1; }
	@# A venv made without pip (Debian's python3-venv missing) is made again, so that Python
	@# says what to install rather than pip's "No module named pip" on every later run.
	@$(BIN)/python -m pip --version >/dev/null 2>&1 || $(call make_venv,$(VENV))
	$(BIN)/python -m pip install --quiet "pip==$(PIP_VERSION)"
	$(EDITABLE_NOTE_HIDDEN) $(BIN)/python -m pip install --quiet -c $(CONSTRAINTS) -e ".[test]"
	@# Our modules compiled, as pip compiles an installed package (benchmarks/compiled.py).
	$(BIN)/python -m benchmarks.compiled
	@rm -f $(VENV)/.installed-*
	@touch $@

# pytest exits 5 when it collects nothing; that is a failure here, said out loud.
test: $(STAMP)
	@$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist worksteal $(PYTEST_ARGS); rc=$$?; \
	  if [ $$rc -eq 5 ]; then echo "make test: no tests were collected; failing." >&2; fi; \
	  exit $$rc

# The fast part (no end-to-end runs), for a developer's own loop.
test-fast: $(STAMP)
	@$(BIN)/python -m pytest -n $(PYTEST_FAST_WORKERS) --dist worksteal -m "not slow" $(PYTEST_ARGS)

# The suite against the newest release of every dependency, upper bounds lifted, in a venv of
# its own (.venv-latest): upstream breaks show here before users meet them. Not part of CI.
test-latest:
	@test -x .venv-latest/bin/python || $(call make_venv,.venv-latest)
	.venv-latest/bin/python -m pip install --quiet --upgrade pip
	.venv-latest/bin/python dev/requirements.py --unbounded > .venv-latest/requirements.txt
	.venv-latest/bin/python -m pip install --quiet --upgrade --upgrade-strategy eager \
	  -r .venv-latest/requirements.txt
	$(EDITABLE_NOTE_HIDDEN) .venv-latest/bin/python -m pip install --quiet --no-deps -e .
	.venv-latest/bin/python -m pip freeze --exclude-editable > .venv-latest/versions.txt
	@echo "make test-latest: versions in .venv-latest/versions.txt"
	.venv-latest/bin/python -m pytest -n $(PYTEST_WORKERS) --dist worksteal $(PYTEST_ARGS)

# Writes constraints.txt anew: the newest versions within pyproject.toml's ranges, resolved in
# a fresh venv. Run `make test` after it, and commit both only if the suite passes.
lock:
	rm -rf .venv-lock
	@$(call make_venv,.venv-lock)
	.venv-lock/bin/python -m pip install --quiet "pip==$(PIP_VERSION)"
	$(EDITABLE_NOTE_HIDDEN) .venv-lock/bin/python -m pip install --quiet -e ".[test]"
	{ .venv-lock/bin/python dev/requirements.py --header; \
	  .venv-lock/bin/python -m pip freeze --exclude-editable \
	    | .venv-lock/bin/python dev/requirements.py --pins; } > $(CONSTRAINTS)
	rm -rf .venv-lock

demo: $(STAMP)
	$(BIN)/python -m examples.demo

clean:
	rm -rf $(VENV) .venv-latest .venv-lock demo-output *.egg-info
