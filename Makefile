# The two commands of the README's quick start. Both create .venv on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: demo test test-slow test-py312 python312 lint setup

# glibc backs its large allocations with transparent huge pages (glibc >= 2.35; others ignore
# it): XLA:CPU allocates its scratch buffers afresh every step, and touching them 4 KiB at a
# time is slow. Not glibc's one arena, which `python -m tx train` adds for itself: the tests
# compile more than they run, and compiling is slower on one arena. A GLIBC_TUNABLES of your
# own is kept. Figures: docs/training.md#on-a-cpu-huge-pages-and-to-train-one-malloc-arena
export GLIBC_TUNABLES ?= glibc.malloc.hugetlb=1

# libtpu (XLA's TPU compiler, the version jax pins) goes to a directory of its own (VENV/libtpu),
# not into the environment: a test compiles the tiny config for a TPU slice with it on this CPU
# (tests/test_aot.py puts it on that subprocess's path), while everything else, the demo
# included, runs without a TPU plugin that would probe for chips at start-up. Linux x86-64 only.
# $(call install,PYTHON,VENV): a virtual environment with tx and its test extra, and libtpu
# beside it (VENV/libtpu) where the package index has the one its jax names (jax 0.12.1's
# libtpu 0.0.53 is only on Google's own index).
define install
	$(1) -m venv $(2)
	$(2)/bin/python -m pip install --quiet --upgrade pip
	$(2)/bin/python -m pip install --quiet -e '.[test]'
	if [ "$$(uname -s)-$$(uname -m)" = Linux-x86_64 ]; then \
	  libtpu="$$($(2)/bin/python -c 'import importlib.metadata as m; \
	    print(next(r.split(";")[0] for r in m.requires("jax") if r.startswith("libtpu")))')"; \
	  $(2)/bin/python -m pip install --quiet --no-deps --upgrade --target $(2)/libtpu "$$libtpu" || \
	    echo "$$libtpu is not on the package index: tests/test_aot.py's TPU compile will skip" >&2; \
	fi
	# PyPI's torch for Python >= 3.12 is the CUDA build: importing its triton (a GPU compiler
	# the CPU tests never use) beside TensorFlow 2.21 crashes the process (SIGSEGV).
	$(2)/bin/python -m pip uninstall --quiet --yes triton
	touch $(2)/.installed
endef

$(VENV)/.installed: pyproject.toml
	$(call install,$(PYTHON),$(VENV))

setup: $(VENV)/.installed

# Train the offline demo, average checkpoints, translate samples, print test BLEU.
demo: setup
	$(PY) -m tx demo --workdir runs/demo

# The default test suite (slow tests excluded: `make test-slow` runs those),
# in TEST_WORKERS processes (pytest-xdist): most tests wait on one-threaded XLA compiles, so
# two workers beat one even on 2 cores. Times: docs/development.md#how-long-the-suite-takes
TEST_WORKERS ?= 2
test: setup
	$(PY) -m ruff check tx tests configs benchmarks train.py
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist worksteal $(PYTEST_ARGS)

# The tests `make test` leaves out (-m slow: minutes each). CI runs them after `make test`.
test-slow: setup
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist worksteal -m slow $(PYTEST_ARGS)

# The default suite again under Python 3.12, on the newest releases pyproject.toml admits
# there (jax 0.11 and later need Python >= 3.12; Python 3.11 gets jax 0.10), in .venv312.
# The interpreter: PYTHON312, else pyenv's newest 3.12, else python3.12 on the PATH.
PYTHON312 ?= $(shell v=$$(pyenv versions --bare 2>/dev/null | grep -E '^3\.12(\.[0-9]+)?$$' | tail -1); \
  if [ -n "$$v" ]; then PYENV_VERSION=$$v pyenv which python3.12; else command -v python3.12; fi 2>/dev/null)
VENV312 := .venv312

$(VENV312)/.installed: pyproject.toml
	@[ -n "$(PYTHON312)" ] || { echo "no Python 3.12 here (pyenv install 3.12, or PYTHON312=/path/to/python3.12)" >&2; exit 2; }
	$(call install,$(PYTHON312),$(VENV312))

test-py312: $(VENV312)/.installed
	$(VENV312)/bin/python -m pytest -q -n $(TEST_WORKERS) --dist worksteal $(PYTEST_ARGS)

# Prints the interpreter test-py312 would use, or nothing (.ci/run asks before running it).
python312:
	@echo $(PYTHON312)
