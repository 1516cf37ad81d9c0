"""llama.cpp's own HTTP server (from the `xllamacpp` wheel) as the peer onepass is measured against.

It runs in its own process: both wheels bundle their own ggml. The child starts the server,
prints its address, and lives until we close its stdin (llama.cpp takes over SIGTERM there).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import httpx

_CHILD = r"""
import json, sys, xllamacpp as xlc
cfg = json.loads(sys.argv[1])
p = xlc.CommonParams()
p.model.path = cfg["model"]
p.n_ctx = cfg["n_ctx"]
p.n_parallel = 1
p.n_batch = p.n_ubatch = 512
p.n_gpu_layers = 0
p.flash_attn_type = xlc.llama_flash_attn_type.LLAMA_FLASH_ATTN_TYPE_DISABLED
p.cache_prompt = True          # reuse the slot's KV for a shared prompt prefix
p.swa_full = True              # without it Gemma 3 reuses no shared prefix at all
p.hostnames = ["127.0.0.1"]
p.port = cfg["port"]
p.warmup = False
srv = xlc.Server(p)            # returns once the model is loaded and the port listens
print("LISTENING " + srv.listening_address, flush=True)
sys.stdin.read()
del srv
"""


def wait_ready(url: str, process: subprocess.Popen[bytes] | subprocess.Popen[str], timeout: float = 300) -> None:
    """Poll a health URL until 200 (a benchmark may poll; tests synchronise on events)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{url}: the server exited with {process.returncode}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"{url} not ready after {timeout} s")


@contextmanager
def llama_server(model: Path, port: int, n_ctx: int) -> Iterator[str]:
    config = json.dumps({"model": str(model), "n_ctx": n_ctx, "port": port})
    process = subprocess.Popen(
        [sys.executable, "-c", _CHILD, config],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        if not line.startswith("LISTENING "):
            raise RuntimeError(f"llama-server did not start (exit {process.poll()})")
        address = line.split(None, 1)[1].strip()
        url = address if address.startswith("http") else "http://" + address
        wait_ready(url + "/health", process)
        yield url
    finally:
        if process.stdin is not None:
            process.stdin.close()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def label_probabilities(client: httpx.Client, url: str, prompt: str, labels: Sequence[str]) -> list[float]:
    """What a user without onepass does: one /completion per question, reading the label tokens' probabilities."""
    response = client.post(
        url + "/completion",
        timeout=900,
        json={"prompt": prompt, "n_predict": 1, "n_probs": 200, "temperature": 0, "cache_prompt": True},
    )
    response.raise_for_status()
    top = response.json()["completion_probabilities"][0]["top_logprobs"]
    by_token = {entry["token"]: entry["logprob"] for entry in top}
    return [math.exp(by_token.get(label, -math.inf)) for label in labels]
