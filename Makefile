# Two entry points that work on a fresh machine: `make demo` and `make test`.
# Each creates .venv if missing and installs the package with the extras it needs
# (re-installed when pyproject.toml changes).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

FLOORS_VENV := .venv-floors
FLOOR_EXTRAS := test,plot,tfds

.PHONY: demo test test-slow test-gpu test-floors lint docs bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.installed-demo: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e ".[plot]"
	touch $@

$(VENV)/.installed-test: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e ".[dev,plot,tfds]"
	touch $@ $(VENV)/.installed-demo

$(VENV)/.installed-docs: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e ".[docs]"
	touch $@

demo: $(VENV)/.installed-demo
	$(BIN)/pfedwn run --out runs/demo

# Test tiers (markers in pyproject.toml, skipping rules in tests/conftest.py):
# quick checks (a few minutes on 2 cores; two pytest workers, as XLA compiles on one thread
# and most tests are mostly compiling), then the long statistical and end-to-end checks,
# then the accelerator-against-CPU checks (skipped, with the reason, where JAX has no GPU/TPU).
# The quick tier compiles with XLA:CPU's older fusion emitters on one codegen thread: the
# same bits as XLA's defaults (tests/test_ahead.py checks it), about a fifth less CPU.
QUICK_XLA_FLAGS := --xla_cpu_use_fusion_emitters=false --xla_cpu_parallel_codegen_split_count=1

test: $(VENV)/.installed-test
	$(BIN)/ruff check .
	XLA_FLAGS="$$XLA_FLAGS $(QUICK_XLA_FLAGS)" \
		$(BIN)/python -m pytest -m "not slow and not gpu" -q -n 2 --dist worksteal

test-slow: $(VENV)/.installed-test
	$(BIN)/python -m pytest -m "slow and not gpu" -q --durations=10

test-gpu: $(VENV)/.installed-test
	$(BIN)/python -m pytest -m "gpu" -q -rs

# The quick tier in a separate venv pinned to every floor (`>=X`) of pyproject.toml, the core
# dependencies and the test, plot and tfds extras (scripts/floor_pins.py): the declared minimum
# versions are the tested ones. Builds the venv afresh each time (downloads, a few minutes,
# then the quick tier). When it last passed: README, "Supported versions".
test-floors:
	rm -rf $(FLOORS_VENV)
	$(PYTHON) -m venv $(FLOORS_VENV)
	$(FLOORS_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(PYTHON) scripts/floor_pins.py $(FLOOR_EXTRAS) > $(FLOORS_VENV)/floors.txt
	$(FLOORS_VENV)/bin/python -m pip install --quiet -c $(FLOORS_VENV)/floors.txt -e ".[$(FLOOR_EXTRAS)]"
	$(FLOORS_VENV)/bin/python -m pip list --format=freeze | grep -iE '^(jax|jaxlib|flax|optax|chex|orbax.checkpoint|numpy|scipy)=='
	$(FLOORS_VENV)/bin/python -m pytest -m "not slow and not gpu" -q -p no:cacheprovider

# The API reference generated from the docstrings (pdoc, offline) into build/api/ (generated,
# not committed); open build/api/index.html.
docs: $(VENV)/.installed-docs
	$(BIN)/python scripts/make_docs.py

# Style and types: ruff (lint, format) over the repository, mypy over the package
# ([tool.mypy] in pyproject.toml).
lint: $(VENV)/.installed-test
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

bench: $(VENV)/.installed-test
	$(BIN)/python benchmarks/bench_perr.py
	$(BIN)/python benchmarks/bench_engine.py

clean:
	rm -rf $(VENV) $(FLOORS_VENV) runs build *.egg-info .pytest_cache .ruff_cache
