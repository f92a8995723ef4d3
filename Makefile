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

# The default test suite (slow tests excluded; `make test PYTEST_ARGS="-m slow"` runs those).
test: setup
	$(PY) -m ruff check tx tests configs benchmarks train.py
	$(PY) -m pytest -q $(PYTEST_ARGS)
