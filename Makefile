# Two entry points that work on a fresh machine: `make demo` and `make test`.
# Each creates .venv if missing and installs the package with the extras it needs
# (re-installed when pyproject.toml changes).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test test-slow test-gpu lint bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.installed-demo: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e ".[plot]"
	touch $@

$(VENV)/.installed-test: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e ".[dev,plot,tfds]"
	touch $@ $(VENV)/.installed-demo

demo: $(VENV)/.installed-demo
	$(BIN)/pfedwn run --out runs/demo

# Test tiers (markers in pyproject.toml, skipping rules in tests/conftest.py):
# quick checks (a few minutes on 2 cores), then the long statistical and end-to-end checks,
# then the accelerator-against-CPU checks (skipped, with the reason, where JAX has no GPU/TPU).
test: $(VENV)/.installed-test
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -m "not slow and not gpu" -q

test-slow: $(VENV)/.installed-test
	$(BIN)/python -m pytest -m "slow and not gpu" -q --durations=10

test-gpu: $(VENV)/.installed-test
	$(BIN)/python -m pytest -m "gpu" -q -rs

lint: $(VENV)/.installed-test
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

bench: $(VENV)/.installed-test
	$(BIN)/python benchmarks/bench_perr.py
	$(BIN)/python benchmarks/bench_engine.py

clean:
	rm -rf $(VENV) runs build *.egg-info .pytest_cache .ruff_cache
