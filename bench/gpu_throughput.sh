#!/usr/bin/env bash
# Issue 59's throughput curve on an NVIDIA GPU, in one run on the GPU machine: make check-gpu first (it names
# the step that fails), then bench/throughput.py with every layer on the GPU for onepass and llama-server,
# onepass's requests alone and then with batch_requests. Prepared where no GPU was lent: not run yet.
#
# Beforehand, on any machine with a compiler (the CUDA wheel takes over an hour on 2 cores, docs/gpu.md):
#   make setup VENV=.venv-cuda GPU=cuda CUDA_ARCHS=90     # 90: H100/H200; nvidia-smi names others
#   make peer VENV=.venv-cuda                             # llama-server from the same llama.cpp, with CUDA
#   make model-decision VENV=.venv-cuda
#   mkdir -p build/peer && cp "$(make -s print-peer VENV=.venv-cuda)" build/peer/  # beside the tree, to carry
# Carry .venv-cuda, build/peer and models/ to the GPU machine, then, from the repository root there:
#   bash bench/gpu_throughput.sh [OUT_DIR] [MODEL]
# Where what travels is capped (the device machines lent to this project's sessions take 64 MiB a call and
# reach no network, 2026-12-07), the default model (1.1 GB) cannot go: make its shape twin there from the
# recipe made here (bench/twin.py, docs/gpu.md) and pass it as MODEL; its answers mean nothing, its speed is
# the model's. The CUDA library alone is 61 MB, so under that cap the wheel must reach the machine another way.
# Each run writes bench/results/<date>-<sha>-throughput*.{json,md} (or into OUT_DIR), naming the device's
# build in its "builds" line; compare a GPU's figures only with figures from the same GPU.
set -euo pipefail

out="${1:-bench/results}"
model="${2:-models/qwen2.5-coder-1.5b-instruct-q4_k_m-decision.gguf}"
python=.venv-cuda/bin/python
server=build/peer/llama-server
mkdir -p "$out"

timeout 900 make check-gpu VENV=.venv-cuda
for batching in "" "--batch-requests"; do
  # --quick: the curve at 1, 4 and 16 clients and the long state at 1,000 tokens, about ten minutes on a CPU
  timeout 1800 "$python" -m bench.throughput --server "$server" --model "$model" --gpu-layers -1 --quick $batching \
    --out "$out"
done
