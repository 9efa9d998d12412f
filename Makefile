# Two entry points that work on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-slow lint bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# One install covers demo and tests; re-run when pyproject.toml changes.
$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e ".[dev,plot,tfds]"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/pfedwn run --out runs/demo

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -m "not slow and not gpu" -q

test-slow: $(STAMP)
	$(BIN)/python -m pytest -m "slow" -q

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_perr.py
	$(BIN)/python benchmarks/bench_engine.py

clean:
	rm -rf $(VENV) runs build *.egg-info .pytest_cache .ruff_cache
