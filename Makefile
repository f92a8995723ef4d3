# The two commands of the README's quick start. Both create .venv on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: demo test lint setup

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $@

setup: $(VENV)/.installed

# Train the offline demo, average checkpoints, translate samples, print test BLEU.
demo: setup
	$(PY) -m tx demo --workdir runs/demo

# The default test suite (slow tests excluded; `make test PYTEST_ARGS="-m slow"` runs those),
# in TEST_WORKERS processes (pytest-xdist): on the 2-core CI machine 2 take 12 minutes where
# one took 18, since most tests wait on one-threaded XLA compiles.
TEST_WORKERS ?= 2
test: setup
	$(PY) -m ruff check tx tests configs benchmarks train.py
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist worksteal $(PYTEST_ARGS)
