# The two commands of the README's quick start. Both create .venv on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: demo test lint setup

# glibc backs its large allocations with transparent huge pages (glibc >= 2.35; others ignore
# it): XLA:CPU allocates its scratch buffers afresh every step, and touching them 4 KiB at a
# time is slow. Not glibc's one arena, which `python -m tx train` adds for itself: the tests
# compile more than they run, and compiling is slower on one arena. A GLIBC_TUNABLES of your
# own is kept. Figures: docs/training.md#on-a-cpu-huge-pages-and-to-train-one-malloc-arena
export GLIBC_TUNABLES ?= glibc.malloc.hugetlb=1

# libtpu (XLA's TPU compiler, the version jax pins) goes to a directory of its own, not into
# the environment: a test compiles the tiny config for a TPU slice with it on this CPU
# (tests/test_aot.py puts it on that subprocess's path), while everything else, the demo
# included, runs without a TPU plugin that would probe for chips at start-up. Linux x86-64 only.
LIBTPU := $(VENV)/libtpu

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	if [ "$$(uname -s)-$$(uname -m)" = Linux-x86_64 ]; then \
	  $(PY) -m pip install --quiet --no-deps --target $(LIBTPU) "$$($(PY) -c \
	    'import importlib.metadata as m; print(next(r.split(";")[0] for r in m.requires("jax") if r.startswith("libtpu")))')"; \
	fi
	touch $@

setup: $(VENV)/.installed

# Train the offline demo, average checkpoints, translate samples, print test BLEU.
demo: setup
	$(PY) -m tx demo --workdir runs/demo

# The default test suite (slow tests excluded; `make test PYTEST_ARGS="-m slow"` runs those),
# in TEST_WORKERS processes (pytest-xdist): most tests wait on one-threaded XLA compiles, so
# two workers beat one even on 2 cores. Times: docs/development.md#how-long-the-suite-takes
TEST_WORKERS ?= 2
test: setup
	$(PY) -m ruff check tx tests configs benchmarks train.py
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist worksteal $(PYTEST_ARGS)
