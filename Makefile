# onepass: `make run` serves the default model, `make test` runs the whole suite.
# Both install what they need on a fresh machine with only Python and a compiler.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

# Python 3.11 or newer, checked before anything is built: PYTHON=python3.12 make run for another one.
ifneq ($(filter-out clean,$(or $(MAKECMDGOALS),run)),)
PYTHON_OK := $(shell $(PYTHON) -c 'import sys; print(int(sys.version_info >= (3, 11)))' 2>/dev/null)
ifneq ($(PYTHON_OK),1)
$(error onepass needs Python 3.11 or newer; '$(PYTHON)' is $(or $(shell $(PYTHON) --version 2>&1),not found). Name another: PYTHON=python3.12 make run)
endif
endif

# The engine: llama-cpp-python 0.3.36's bindings on the llama.cpp that serves /v1/systemone (the tree in
# xllamacpp's sdist), assembled by tools/engine_source.py; its version names that llama.cpp.
LLAMA_CPP_VERSION := $(shell $(PYTHON) -m tools.engine_source --print-version)
ENGINE_SOURCE := $(HOME)/.cache/onepass/engine-source/$(LLAMA_CPP_VERSION)
# The build: make setup GPU=cuda (NVIDIA), GPU=metal (Apple silicon), GPU=vulkan (AMD, Intel, any Vulkan
# driver) or GPU=cpu (the default). The choice is recorded beside the venv ($(VENV)/build-choice.mk), and
# every later target (run, test, check-gpu, ...) builds and installs that one until you choose again.
# CMAKE_ARGS adds flags of your own (recorded too); they go after the CPU flags and the GPU's, and win.
BUILD_CHOICE := $(VENV)/build-choice.mk
-include $(BUILD_CHOICE)
GPU ?= cpu
CMAKE_ARGS ?=
ifeq ($(filter $(GPU),cpu cuda metal vulkan),)
$(error GPU=$(GPU): choose cpu, cuda, metal or vulkan)
endif
# The CPU flags come from this machine (app/platform/cpu.py: every x86 instruction set named ON or OFF
# from /proc/cpuinfo or sysctl, AMX always off; ggml's own detection on arm64).
# ONEPASS_CPUINFO=FILE builds for a recorded /proc/cpuinfo instead of this CPU (tests/cpuinfo/).
ONEPASS_CPUINFO ?=
export ONEPASS_CPUINFO
CPU_CMAKE_ARGS := $(shell ONEPASS_CPUINFO='$(ONEPASS_CPUINFO)' $(PYTHON) -m app.platform.cpu cmake-args)
# CUDA: the GPU architectures to compile for (docs/gpu.md), each one a long compile. Given (CUDA_ARCHS=89),
# they win; a later target uses the recorded ones; a new choice (make setup GPU=cuda) builds for this
# machine's GPUs where nvidia-smi reports their compute capability (tools/cuda_archs.py), else for the
# default: Turing, Ampere (A100, RTX 30), Ada (RTX 40), Hopper (H100, H200), Blackwell (RTX 50).
CUDA_ARCHS_DEFAULT := 75;80;86;89;90;120
ifeq ($(GPU),cuda)
ifneq ($(filter command line environment,$(origin CUDA_ARCHS)),)
CUDA_ARCHS_WHY := given
else ifeq ($(origin CUDA_ARCHS) $(origin GPU),file file)
CUDA_ARCHS_WHY := recorded in $(BUILD_CHOICE)
else
CUDA_ARCHS_SEEN := $(shell $(PYTHON) -m tools.cuda_archs)
CUDA_ARCHS := $(or $(CUDA_ARCHS_SEEN),$(CUDA_ARCHS_DEFAULT))
CUDA_ARCHS_WHY := $(if $(CUDA_ARCHS_SEEN),this machine's GPUs as nvidia-smi reports them,the default: nvidia-smi reported no GPU)
endif
endif
CUDA_ARCHS ?= $(CUDA_ARCHS_DEFAULT)
# A CUDA toolkit on this machine (nvcc with cuBLAS) is used; without one, tools/cuda_toolkit.py puts
# together one from NVIDIA's wheels on the package index (the build log says which).
CUDA_TOOLKITS := $(HOME)/.cache/onepass/cuda
# Vulkan on Debian 12: its headers are too old for ggml-vulkan.cpp, so tools/vulkan_headers.py unpacks Debian 13's.
VULKAN_HEADERS := $(HOME)/.cache/onepass/vulkan-headers-trixie
GPU_CMAKE_ARGS_cpu :=
GPU_CMAKE_ARGS_cuda := -DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=$(CUDA_ARCHS)
GPU_CMAKE_ARGS_metal := -DGGML_METAL=on
GPU_CMAKE_ARGS_vulkan := -DGGML_VULKAN=on
ifeq ($(GPU),vulkan)
VULKAN_DEPS := vulkan-deps
ifneq ($(wildcard /usr/bin/apt-get),)
VULKAN_ARGS := -DVulkan_INCLUDE_DIR=$(VULKAN_HEADERS)/usr/include
endif
endif
BUILD_ARGS := $(strip $(CPU_CMAKE_ARGS) $(GPU_CMAKE_ARGS_$(GPU)) $(CMAKE_ARGS) $(VULKAN_ARGS))

# What `make setup` records: the build's every input a user chooses (for CUDA its architectures too, or a
# later target would build for others; a build without CUDA records none, so that choosing CUDA later
# finds this machine's GPUs).
RECORD_CHOICE := printf 'GPU := %s\nCMAKE_ARGS := %s\n$(if $(filter cuda,$(GPU)),CUDA_ARCHS := %s\n)' \
	'$(GPU)' '$(CMAKE_ARGS)' $(if $(filter cuda,$(GPU)),'$(CUDA_ARCHS)') > $(BUILD_CHOICE)

# pip's own wheel cache ignores CMAKE_ARGS, so we keep our wheel in a folder named by the
# version, the flags and this CPU's features: a shared or copied cache never hands a wheel
# to a CPU it was not built for.
WHEEL_CACHE ?= $(HOME)/.cache/onepass/wheels
WHEEL_KEY := $(shell ONEPASS_CPUINFO='$(ONEPASS_CPUINFO)' $(PYTHON) -m app.platform.cpu key '$(LLAMA_CPP_VERSION)' '$(BUILD_ARGS)')
WHEEL_DIR := $(WHEEL_CACHE)/$(WHEEL_KEY)
WHEEL_STAMP := $(WHEEL_DIR)/.built
INSTALL_STAMP := $(VENV)/.installed-$(WHEEL_KEY)
DEV_STAMP := $(VENV)/.dev-installed

DEFAULT_MODEL := $(shell $(PYTHON) models/fetch.py default --print-path)
SMALL_MODEL := $(shell $(PYTHON) models/fetch.py small --print-path)
# Unset, `make run` passes neither and the config's [server] host and port (default 127.0.0.1:8080) apply.
HOST ?=
PORT ?=

.PHONY: bench-prefills-together api-examples setup vulkan-deps bench-native bench-throughput test-gpu test-build-choice build-info native-server test-native model model-small model-decision eval-decision run fleet test test-tools lint check-build doctor peer bench bench-quick bench-restart bench-images bench-exactness bench-shared-decode print-peer bench-impatient bench-fleet bench-calibration bench-labelling eval load check-gpu clean clean-build

# `make setup` records the choice even when that build is installed already (choosing it again).
setup: $(INSTALL_STAMP)
	@$(RECORD_CHOICE)
	@echo "llama-cpp-python $(LLAMA_CPP_VERSION), GPU=$(GPU): installed in $(VENV) and recorded in $(BUILD_CHOICE)"

$(BIN)/python:
	$(PYTHON) -m venv $(VENV) || { echo "creating the venv failed: on Debian or Ubuntu, apt-get install python3-venv"; exit 1; }
	$(BIN)/python -m pip install -q --upgrade pip

$(ENGINE_SOURCE)/ONEPASS-ENGINE:
	$(PYTHON) -m tools.engine_source --out $(ENGINE_SOURCE)

$(WHEEL_STAMP): | $(BIN)/python $(VULKAN_DEPS) $(ENGINE_SOURCE)/ONEPASS-ENGINE
	@echo "building llama-cpp-python $(LLAMA_CPP_VERSION) (GPU=$(GPU)) into $(WHEEL_DIR) (minutes, once)"
	rm -rf $(WHEEL_DIR) && mkdir -p $(WHEEL_DIR)
	@set -e; toolkit=""; \
	if [ "$(GPU)" = cuda ]; then \
		echo "  CUDA architectures: $(CUDA_ARCHS) ($(CUDA_ARCHS_WHY); each one a long compile, CUDA_ARCHS=... to choose)"; \
		toolkit="$$($(PYTHON) tools/cuda_toolkit.py --cache $(CUDA_TOOLKITS) --record $(WHEEL_DIR)/cuda-toolkit.json)"; \
	fi; \
	echo "  CMAKE_ARGS=$(BUILD_ARGS) $$toolkit"; \
	CMAKE_ARGS="$(BUILD_ARGS) $$toolkit" CMAKE_BUILD_PARALLEL_LEVEL=$$(getconf _NPROCESSORS_ONLN) \
		$(BIN)/python -m pip wheel --no-deps --no-cache-dir -w $(WHEEL_DIR) $(ENGINE_SOURCE)
	$(PYTHON) -m app.platform.cpu describe '$(LLAMA_CPP_VERSION)' '$(BUILD_ARGS)' '$(GPU)' > $(WHEEL_DIR)/built-for.json
	touch $@

# What running needs: the wheel, onepass and its dependencies (make test adds the dev extras), and for a
# CUDA build made with NVIDIA's wheels, the CUDA libraries it links (app/engine/bindings.py loads them).
$(INSTALL_STAMP): $(WHEEL_STAMP) pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q --force-reinstall --no-deps $(WHEEL_DIR)/llama_cpp_python-*.whl
	$(BIN)/python -m pip install -q -e .
	@if [ -f $(WHEEL_DIR)/cuda-toolkit.json ]; then \
		runtime=$$($(PYTHON) tools/cuda_toolkit.py --runtime-of $(WHEEL_DIR)/cuda-toolkit.json); \
		if [ -n "$$runtime" ]; then echo "installing the CUDA libraries the build links: $$runtime"; \
			$(BIN)/python -m pip install -q $$runtime; fi; \
	fi
	cp $(WHEEL_DIR)/built-for.json $(VENV)/llama-build.json
	rm -f $(VENV)/.installed-* $(DEV_STAMP)
	@$(RECORD_CHOICE)
	touch $@

# The dev extras (pytest, ruff, mypy, the SDK, ...): for make test and lint, not for make run.
$(DEV_STAMP): $(INSTALL_STAMP)
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $@

# What the Vulkan build needs from Debian (glslc, headers, SPIR-V headers) and what it runs on (lavapipe).
VULKAN_PACKAGES := glslc libvulkan-dev spirv-headers mesa-vulkan-drivers
vulkan-deps:
	@missing=""; for p in $(VULKAN_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
			echo "installing$$missing (apt-get) for the Vulkan build"; \
			apt-get update -qq && apt-get install -y -qq $$missing >/dev/null; \
		else \
			echo "the Vulkan build needs$$missing (as root: apt-get install$$missing)"; exit 1; \
		fi; \
	fi
	@if command -v apt-get >/dev/null; then $(PYTHON) -m tools.vulkan_headers $(VULKAN_HEADERS); fi

model: $(INSTALL_STAMP)
	$(PYTHON) models/fetch.py default --dest $(DEFAULT_MODEL)

model-small: $(INSTALL_STAMP)
	$(PYTHON) models/fetch.py small --dest $(SMALL_MODEL)

# The default model as a decision GGUF (openjev metadata, a systemone template of onepass's prompt,
# its fitted temperature): served through the decision path, and by llama.cpp's /v1/systemone too.
DECISION_MODEL := $(DEFAULT_MODEL:.gguf=-decision.gguf)
model-decision: $(DECISION_MODEL)

$(DECISION_MODEL): models/decision_model.py app/answering/prompting.py | model
	$(BIN)/python models/decision_model.py $(DEFAULT_MODEL) $@

# Extra server flags: make run ARGS="--n-gpu-layers -1 --context-path ctx.md"
ARGS ?=

run: model
	$(BIN)/python -m app $(if $(HOST),--host $(HOST)) $(if $(PORT),--port $(PORT)) $(ARGS)

# N replicas on loopback ports behind HAProxy (deploy/haproxy.cfg) on HOST:PORT, routed by state;
# ARGS go to every replica: make fleet N=3 ARGS="--threads 1". Ctrl-C stops them all.
N ?= 3
fleet: model
	$(BIN)/python -m app.fleet.supervisor --replicas $(N) $(if $(HOST),--host $(HOST)) $(if $(PORT),--port $(PORT)) -- $(ARGS)

# Every test run ends with one line naming the groups of tests it skipped and why (tests/support/skip_groups.py).
# Each target's --may-skip names the groups it leaves to another target; under CI=true a skip of any other
# group fails the run. make test leaves the device, build-choice and llama-server tests to their targets,
# and the emulated-CPU test where this CPU's build adds nothing that test can see (a fact of the CPU).
# tests/test_install.py installs the package into a fresh venv with the wheel built here.
test: model model-decision $(DEV_STAMP) lint check-build test-tools
	ONEPASS_TEST_WHEEL_DIR=$(WHEEL_DIR) $(BIN)/python -m pytest -q \
		--may-skip=gpu,build-choice,native-server,emulated-cpu-inconclusive

# tests/test_cpu_emulated.py runs the build on an emulated AVX2-only CPU with qemu's user mode;
# tests/test_fleet.py runs three replicas behind HAProxy (2.6 or newer).
# tests/test_playground.py drives the page in headless Chromium through its driver.
# As root with apt-get they are installed here; otherwise those tests are skipped, saying why.
test-tools:
	@missing=""; \
	if [ "$$(uname -m)" = x86_64 ] && ! command -v qemu-x86_64 >/dev/null; then missing=" qemu-user"; fi; \
	command -v chromium >/dev/null || command -v chromium-browser >/dev/null || command -v google-chrome >/dev/null \
		|| missing="$$missing chromium"; \
	command -v chromedriver >/dev/null || missing="$$missing chromium-driver"; \
	command -v haproxy >/dev/null || missing="$$missing haproxy"; \
	if [ -n "$$missing" ]; then \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
			echo "installing$$missing (apt-get) for the emulated-CPU, browser and fleet tests"; \
			(apt-get update -qq && apt-get install -y -qq $$missing >/dev/null) \
				|| echo "note: could not install$$missing: the tests that need them will be skipped"; \
		else \
			echo "note: missing$$missing (as root: apt-get install$$missing): the tests that need them will be skipped"; \
		fi; \
	fi

# Load llama.cpp in a subprocess and decode once: a build for another CPU fails here with words.
check-build: setup
	$(BIN)/python -m app.platform.build_check

# What a bug report needs: OS, Python, CPU, the llama.cpp build, backends, models, the wheel.
doctor:
	@$(PYTHON) -m tools.doctor --venv $(VENV) --wheel-dir $(WHEEL_DIR)

lint: $(DEV_STAMP)
	$(BIN)/ruff check app tests bench models tools
	$(BIN)/ruff format --check app tests bench models tools
	$(BIN)/mypy --strict app tests bench tools

BENCH_STAMP := $(VENV)/.bench-installed

$(BENCH_STAMP): $(INSTALL_STAMP)
	$(BIN)/python -m pip install -q -e '.[dev,bench]'
	touch $@

# llama.cpp's own server, built from the engine's llama.cpp with the same flags as its wheel: the bench's
# peer, and make test-native's /v1/systemone (server-decision.cpp) that onepass is compared with.
PEER_CACHE ?= $(HOME)/.cache/onepass/llama-server
PEER := $(PEER_CACHE)/$(WHEEL_KEY)/llama-server
NATIVE_SERVER := $(PEER)
$(PEER): | $(BIN)/python $(ENGINE_SOURCE)/ONEPASS-ENGINE
	@echo "building llama-server from the engine's llama.cpp ($(LLAMA_CPP_VERSION)) with the same flags (once)"
	$(BIN)/python -m tools.build_peer --source $(ENGINE_SOURCE)/vendor/llama.cpp --cmake-args '$(BUILD_ARGS)' \
		--out $(dir $(PEER)) --jobs $$(getconf _NPROCESSORS_ONLN)

peer: $(PEER)

# Where `make peer` puts llama-server for this build choice (bench/gpu_throughput.sh copies it to carry it).
print-peer:
	@echo $(PEER)

native-server: $(NATIVE_SERVER)

test-native: model model-decision $(DEV_STAMP) $(NATIVE_SERVER)
	ONEPASS_NATIVE_SERVER=$(NATIVE_SERVER) $(BIN)/python -m pytest -q tests/test_native_server.py --may-skip=

# onepass and llama.cpp's /v1/systemone on speed, the same requests to both on the converted default model: new
# states, one state repeated, more states than llama-server has slots, a 2,000-token state, 4 clients at once;
# bench/results/<date>-<sha>-native-speed.{json,md}. make bench-native BENCH_ARGS=--quick: a smaller run.
bench-native: model-decision $(BENCH_STAMP) $(NATIVE_SERVER)
	$(BIN)/python -m bench.native_speed --server $(NATIVE_SERVER) --model $(DECISION_MODEL) $(BENCH_ARGS)

# Issue 59's yardstick: onepass and llama.cpp's /v1/systemone at 1, 4, 16 and 64 clients, new states (5 questions)
# and hits (1 and 5), requests/s and p50/p99; 16 clients' hits against one client's, and a hit beside a ~4,000-token
# prefill: bench/results/<date>-<sha>-throughput.{json,md} (about 25 minutes on 2 cores). BENCH_ARGS=--quick: shorter.
bench-throughput: model-decision $(BENCH_STAMP) $(NATIVE_SERVER)
	$(BIN)/python -m bench.throughput --server $(NATIVE_SERVER) --model $(DECISION_MODEL) $(BENCH_ARGS)

# The full comparison for a model (default: the default model): make bench BENCH_ARGS="--model models/x.gguf"
BENCH_ARGS ?=
bench: model $(BENCH_STAMP) $(PEER)
	$(BIN)/python -m bench.run --peer $(PEER) $(BENCH_ARGS)

bench-quick: model $(BENCH_STAMP) $(PEER)
	$(BIN)/python -m bench.run --quick --peer $(PEER) $(BENCH_ARGS)

# The snapshot disk tier after a restart: cold, RAM hit, disk hit at 256, 1,024 and 2,048 tokens.
bench-restart: model $(BENCH_STAMP)
	$(BIN)/python -m bench.restart $(BENCH_ARGS)

# Image states on the session cache, in-process on the small model with a tiny random projector: cold and
# hit with 1 and 5 questions, the encoder's share, more image states than llama-server has slots;
# bench/results/<date>-<sha>-image-states.{json,md}
bench-images: model-small $(BENCH_STAMP)
	$(BIN)/python -m bench.image_states --model $(SMALL_MODEL) $(BENCH_ARGS)

# Clients that time out and retry (the official SDK's defaults) against patient ones on one server with
# the default config, issue 58's stall, and what an interactive request waits while a fit runs:
# bench/results/<date>-<sha>-impatient.{json,md}. make bench-impatient BENCH_ARGS=--quick: a short run.
bench-impatient: model $(BENCH_STAMP)
	$(BIN)/python -m bench.impatient $(BENCH_ARGS)

# Two new states sent together on one context against the same two one after the other (issue 69: within
# 1.1x): bench/results/<date>-<sha>-prefills-together.{json,md}.
bench-prefills-together: model $(BENCH_STAMP)
	$(BIN)/python -m bench.prefills_together $(BENCH_ARGS)

# In-process, the default model: whether a request's label logits stay bit-identical when its question
# suffixes share one llama_decode with other requests' (flash attention, repacked weights, unified KV and
# split streams), and one decode of k requests against k: bench/results/<date>-<sha>-cross-request-exactness.{json,md}.
# make bench-exactness BENCH_ARGS=--quick: short states, one placement each.
bench-exactness: model $(BENCH_STAMP)
	$(BIN)/python -m bench.cross_request_exactness $(BENCH_ARGS)

# What one llama_decode of 16 waiting requests (batch_requests) is worth against one after another, through the
# engine's own path, per kernel setting, and the largest probability gap it makes (docs/exactness.md):
# bench/results/<date>-<sha>-shared-decode-cost.{json,md}. BENCH_ARGS="--requests N --runs N".
bench-shared-decode: model $(BENCH_STAMP)
	$(BIN)/python -m bench.shared_decode_cost $(BENCH_ARGS)

# Simulated, no model, seconds: cache hit rate and prefill saved against fleet size (1 to 64 replicas) for
# round robin, least connections and HAProxy's bounded-load hashing; bench/results/fleet-sim.{json,md,png}
bench-fleet: $(BENCH_STAMP)
	$(BIN)/python -m bench.fleet_sim

# 64 concurrent clients against one server; fails on any error or changed answer.
LOAD_ARGS ?=
load: model $(BENCH_STAMP)
	$(BIN)/python -m bench.load $(LOAD_ARGS)

# Fitted calibration on the pipeline workloads (bench/pipelines.py): answers them once with the default model
# (200 items each to fit on, 100 more from another seed to hold out: about an hour on 2 cores, see
# docs/calibration.md; the hidden states beside the evidence, *.hidden.npz, are not committed), then fits and
# measures: bench/results/calibration-study.{json,md}.
bench-calibration: model $(BENCH_STAMP)
	$(BIN)/python -m bench.evidence
	$(BIN)/python -m bench.evidence --seed 1 --per-workload 100 --out bench/results/calibration-evidence-test.json
	$(BIN)/python -m bench.calibration_study

# The labelling loop on the same evidence (make bench-calibration writes it; this target answers seed 2's
# held-out items where they are missing, about 10 minutes; without the *.hidden.npz the probes are not tried,
# and the bench says so): labels chosen by onepass label's ranking against random ones, held-out accuracy and
# 90% answer sets; and the support priority asked as its facts (bench/priority_facts.py answers those with
# the default model first, about 2 minutes): bench/results/<date>-<sha>-labelling.{json,md}.
bench-labelling: model $(BENCH_STAMP)
	test -f bench/results/calibration-evidence-test2.json || $(BIN)/python -m bench.evidence --seed 2 \
		--per-workload 100 --out bench/results/calibration-evidence-test2.json
	$(BIN)/python -m bench.priority_facts
	$(BIN)/python -m bench.labelling $(BENCH_ARGS)

# Accuracy and calibration on tests/eval/items.jsonl: make eval EVAL_ARGS="--model models/other.gguf"
EVAL_ARGS ?=
eval: model $(BENCH_STAMP)
	$(BIN)/python -m bench.eval $(EVAL_ARGS)

# The same items through the decision path: the converted default model (make model-decision).
eval-decision: model-decision $(BENCH_STAMP)
	$(BIN)/python -m bench.eval --model $(DECISION_MODEL) $(EVAL_ARGS)

# The GPU suite: the engine, cache, disk-tier, layout and property tests with every layer on the device,
# the device tests (tests/test_gpu.py) and a small-model smoke test, run with this venv's GPU build (leaving the
# real model's tests and those of a CPU-only build to make test). With a
# CPU build here it runs the Vulkan build on Mesa's lavapipe (a Vulkan device that runs on the CPU) in a
# venv of its own, as CI does (.ci/run, after make test).
ifeq ($(GPU),cpu)
GPU_VENV := .venv-vulkan
GPU_OF_VENV := vulkan
GPU_TEST_ENV := GGML_VK_VISIBLE_DEVICES=0
else
GPU_VENV := $(VENV)
GPU_OF_VENV := $(GPU)
GPU_TEST_ENV :=
endif
GPU_TESTS := tests/test_gpu.py tests/test_engine.py tests/test_cache.py tests/test_disk_tier.py tests/test_layouts.py \
	tests/test_properties.py
test-gpu: model-small
	$(MAKE) setup VENV=$(GPU_VENV) GPU=$(GPU_OF_VENV)
	$(MAKE) VENV=$(GPU_VENV) $(GPU_VENV)/.dev-installed
	$(GPU_TEST_ENV) ONEPASS_TEST_GPU_LAYERS=-1 ONEPASS_SKIP_REAL_MODEL=1 ONEPASS_TEST_SMALL_MODEL=$(SMALL_MODEL) \
		$(GPU_VENV)/bin/python -m pytest -q $(GPU_TESTS) --may-skip=real-model,cpu-build,not-cuda

# After make test-gpu (CI): make run, make check-gpu and make test-gpu in the Vulkan venv keep its wheel.
test-build-choice: model-small $(DEV_STAMP)
	ONEPASS_BUILD_CHOICE_VENV=.venv-vulkan GGML_VK_VISIBLE_DEVICES=0 ONEPASS_TEST_SMALL_MODEL=$(SMALL_MODEL) \
		$(BIN)/python -m pytest -q tests/test_build_choice.py --may-skip=

# Load a model with every layer offloaded, step by step, each step under its own timeout: the step that
# fails or hangs is named. make check-gpu GPU_CHECK_MODEL=models/x.gguf (the small model is fetched only
# when it is the one checked: a GPU machine may have no network)
GPU_CHECK_MODEL ?= $(SMALL_MODEL)
check-gpu: $(INSTALL_STAMP) $(if $(filter $(SMALL_MODEL),$(GPU_CHECK_MODEL)),model-small)
	$(BIN)/python -m tools.check_gpu $(GPU_CHECK_MODEL)

# docs/api.md's examples, made again by the real server on a tiny model (tools/api_examples/; a test
# fails when the page differs from them).
api-examples: $(DEV_STAMP)
	$(BIN)/python -m tools.api_examples --write

# What this venv builds and installs, from its recorded choice and the command line (no build).
build-info:
	@echo "venv: $(VENV)"
	@echo "GPU: $(GPU)"
	@echo "CMAKE_ARGS: $(BUILD_ARGS)"
	@echo "CUDA architectures: $(if $(filter cuda,$(GPU)),$(CUDA_ARCHS) ($(CUDA_ARCHS_WHY)),none)"
	@echo "wheel: $(WHEEL_DIR)"
	@echo "installed: $(if $(wildcard $(INSTALL_STAMP)),yes,no)"

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache

# Build llama-cpp-python again for this machine (after a CPU mismatch, or to change compilers).
clean-build:
	rm -rf $(WHEEL_DIR)
	rm -f $(VENV)/.installed-* $(VENV)/llama-build.json
