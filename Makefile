# onepass: `make run` serves the default model, `make test` runs the whole suite.
# Both install what they need on a fresh machine with only Python and a compiler.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

LLAMA_CPP_VERSION := 0.3.36
# -march=native enables ggml's AMX kernels, which segfault on these Xeons (DESIGN.md).
# Override for a GPU build: make setup CMAKE_ARGS="-DGGML_CUDA=on"
CMAKE_ARGS ?= -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON \
	-DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON -DGGML_AVX_VNNI=ON

# pip's own wheel cache ignores CMAKE_ARGS, so we keep our wheel in a folder named by the flags.
WHEEL_CACHE ?= $(HOME)/.cache/onepass/wheels
WHEEL_KEY := $(shell printf '%s|%s' '$(LLAMA_CPP_VERSION)' '$(CMAKE_ARGS)' | sha256sum | cut -c1-16)
WHEEL_DIR := $(WHEEL_CACHE)/$(WHEEL_KEY)
WHEEL_STAMP := $(WHEEL_DIR)/.built
INSTALL_STAMP := $(VENV)/.installed-$(WHEEL_KEY)

DEFAULT_MODEL := models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
SMALL_MODEL := models/gemma-3-270m-q4_k_m.gguf
HOST ?= 127.0.0.1
PORT ?= 8080

.PHONY: setup model model-small run test lint bench bench-quick eval load check-gpu clean

setup: $(INSTALL_STAMP)

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(WHEEL_STAMP): | $(BIN)/python
	@echo "building llama-cpp-python $(LLAMA_CPP_VERSION) into $(WHEEL_DIR) (a few minutes, once)"
	mkdir -p $(WHEEL_DIR)
	CMAKE_ARGS="$(CMAKE_ARGS)" CMAKE_BUILD_PARALLEL_LEVEL=$$(nproc) \
		$(BIN)/python -m pip wheel --no-deps --no-cache-dir --no-binary llama-cpp-python \
		-w $(WHEEL_DIR) llama-cpp-python==$(LLAMA_CPP_VERSION)
	touch $@

$(INSTALL_STAMP): $(WHEEL_STAMP) pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q --force-reinstall --no-deps $(WHEEL_DIR)/llama_cpp_python-*.whl
	$(BIN)/python -m pip install -q -e '.[dev]'
	rm -f $(VENV)/.installed-*
	touch $@

model: $(INSTALL_STAMP)
	$(PYTHON) models/fetch.py default --dest $(DEFAULT_MODEL)

model-small: $(INSTALL_STAMP)
	$(PYTHON) models/fetch.py small --dest $(SMALL_MODEL)

# Extra server flags: make run ARGS="--n-gpu-layers -1 --context-path ctx.md"
ARGS ?=

run: model
	$(BIN)/python -m app --host $(HOST) --port $(PORT) $(ARGS)

test: model lint
	$(BIN)/python -m pytest -q

lint: setup
	$(BIN)/ruff check app tests bench models
	$(BIN)/ruff format --check app tests bench models
	$(BIN)/mypy --strict app tests bench

BENCH_STAMP := $(VENV)/.bench-installed

$(BENCH_STAMP): $(INSTALL_STAMP)
	$(BIN)/python -m pip install -q -e '.[dev,bench]'
	touch $@

# The full comparison for a model (default: the default model): make bench BENCH_ARGS="--model models/x.gguf"
BENCH_ARGS ?=
bench: model $(BENCH_STAMP)
	$(BIN)/python -m bench.run $(BENCH_ARGS)

bench-quick: model $(BENCH_STAMP)
	$(BIN)/python -m bench.run --quick $(BENCH_ARGS)

# 64 concurrent clients against one server; fails on any error or changed answer.
LOAD_ARGS ?=
load: model
	$(BIN)/python -m bench.load $(LOAD_ARGS)

# Accuracy and calibration on tests/eval/items.jsonl: make eval EVAL_ARGS="--model models/other.gguf"
EVAL_ARGS ?=
eval: model
	$(BIN)/python -m bench.eval $(EVAL_ARGS)

# Load the default model with every layer offloaded and print where llama.cpp put the layers.
check-gpu: model
	$(BIN)/python -m app.check_gpu $(DEFAULT_MODEL)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
