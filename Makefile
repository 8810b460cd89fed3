# `make demo` and `make test` set up a virtual environment from scratch (CPU torch first, so pip
# never pulls CUDA packages) and then run the main job or the test suite.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup demo test test-fast lint bench-quick

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e ".[dev]"
	touch $(STAMP)

setup: $(STAMP)

demo: setup
	$(BIN)/pacer-hf demo

lint: setup
	$(BIN)/ruff check pacer_hf tests examples

test: setup lint
	$(BIN)/python -m pytest -q

# The daily lane (about 2 minutes): everything but the slow tests and the chi-square sampling tests.
test-fast: setup lint
	$(BIN)/python -m pytest -q -m "not slow" -k "not distribution"

bench-quick: setup
	$(BIN)/pacer-hf bench --quick
