# Two commands do all the set-up on a fresh clone: `make demo` and `make test`.
# Both create (or reuse) .venv in the checkout and install the project into it.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Re-install when the project's declared dependencies change.
STAMP := $(VENV)/.installed-$(shell cksum < pyproject.toml | cut -d' ' -f1)
PYTEST_ARGS ?=

.PHONY: install test test-fast demo clean

install: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[test]"
	@rm -f $(VENV)/.installed-*
	@touch $@

# pytest exits 5 when it collects nothing; that is a failure here, said out loud.
test: $(STAMP)
	@$(BIN)/python -m pytest $(PYTEST_ARGS); rc=$$?; \
	  if [ $$rc -eq 5 ]; then echo "make test: no tests were collected; failing." >&2; fi; \
	  exit $$rc

# The fast part (no end-to-end runs), for a developer's own loop: about 80 s on 2 cores
# (every TensorFlow import also imports jax, which the test extra installs).
test-fast: $(STAMP)
	@$(BIN)/python -m pytest -m "not slow" $(PYTEST_ARGS)

demo: $(STAMP)
	$(BIN)/python -m examples.demo

clean:
	rm -rf $(VENV) demo-output *.egg-info
