# Two entry points that work on a fresh machine: `make demo` and `make test`.
# Each creates .venv if missing and installs the package with the extras it needs
# (re-installed when pyproject.toml changes).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test test-slow lint bench clean

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

test: $(VENV)/.installed-test
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -m "not slow and not gpu" -q

# Slow checks (none collected is not an error: pytest exits 5 then).
test-slow: $(VENV)/.installed-test
	$(BIN)/python -m pytest -m "slow" -q || [ $$? -eq 5 ]

lint: $(VENV)/.installed-test
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

bench: $(VENV)/.installed-test
	$(BIN)/python benchmarks/bench_perr.py
	$(BIN)/python benchmarks/bench_engine.py

clean:
	rm -rf $(VENV) runs build *.egg-info .pytest_cache .ruff_cache
