"""llama.cpp's own HTTP server, built like onepass's llama.cpp, as the peer onepass is measured against.

`make peer` builds `llama-server` from the llama.cpp source inside the same llama-cpp-python
release, with the same CMake flags (tools/build_peer.py), so a ratio compares designs, not builds.
"""

from __future__ import annotations

import math
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx


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


@dataclass
class Peer:
    url: str
    system_info: str = "?"  # the build's llama_print_system_info, read from its log once it has exited


def stop(process: subprocess.Popen[str]) -> None:
    """Ask a server to stop; kill it if it has not within 30 s."""
    process.terminate()
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@contextmanager
def llama_server(
    binary: Path, model: Path, n_ctx: int, threads: int, repack: bool, flash_attn: bool, batch: int = 512
) -> Iterator[Peer]:
    """llama-server built from the same llama.cpp source and flags as onepass's wheel (make peer),
    set up as onepass is: one slot, f16 KV, the prompt cache on, and the thread count, repacked
    weights and flash attention given (onepass's measured choices), so a ratio measures the
    design, not a setting."""
    with socket.socket() as probe:  # llama-server cannot report a port it picked itself
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [str(binary), "-m", str(model), "--host", "127.0.0.1", "--port", str(port), "-c", str(n_ctx)]
    # batch: a model read whole (laya, clef, ...) takes each prompt in one micro-batch of at most this
    command += ["-np", "1", "-b", str(batch), "-ub", str(batch), "-ngl", "0", "-t", str(threads)]
    command += ["-fa", "on" if flash_attn else "off", "--repack" if repack else "--no-repack"]
    command += ["--swa-full", "--no-warmup", "--cache-prompt"]  # swa-full: else Gemma 3 reuses no prefix
    command += ["-lv", "4"]  # the level that logs system_info
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryFile(mode="w+") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, text=True)
        server = Peer(url)
        try:
            wait_ready(url + "/health", process)
            yield server
        finally:
            stop(process)
            log.seek(0)  # written in full only now: the server's stdio buffers a file
            found = [line.split("system_info:", 1)[1].strip() for line in log if "system_info:" in line]
            server.system_info = found[0] if found else "?"


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
