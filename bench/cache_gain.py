"""Cache gain on one model: cold vs hit latency for a ~1,000-token state, 1 and 5 questions.

Runs a real onepass HTTP server in-process (uvicorn on a loopback port) and times requests
from the client side. "decode" is the engine's own batched suffix decode, as the server
reports it in x_timing_ms; a hit can only skip the prefix, so hit / decode is the overhead.

    python -m bench.cache_gain [--model PATH] [--runs N] [--state-tokens N]
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from app.config import DEFAULT_MODEL_PATH, Settings
from app.models import ModelRegistry, load_model
from app.server import create_app

QUESTIONS: list[dict[str, Any]] = [
    {"type": "noul", "instructions": "Does the customer ask for money back?"},
    {
        "type": "choice",
        "instructions": "Which team handles it?",
        "criteria": {"Billing": "Payments and refunds", "Technical": None, "Sales": None},
    },
    {"type": "score", "instructions": "How frustrated is the customer?", "criteria": ["Calm", "Annoyed", "Furious"]},
    {"type": "noul", "instructions": "Is the message written in English?"},
    {"type": "choice", "instructions": "What is the sentiment?", "criteria": {"positive": None, "negative": None}},
]
SENTENCE = "Ticket {n}: I was charged twice for March, support did not answer, and I want my money back now. "


def state_of(tokens: int, tag: int) -> str:
    # ~27 tokens per sentence with the Qwen tokenizer; the tag makes every cold state new.
    return "".join(SENTENCE.format(n=f"{tag}-{i}") for i in range(max(1, tokens // 27)))


def serve(settings: Settings) -> tuple[str, uvicorn.Server, threading.Thread]:
    registry = ModelRegistry.serving(load_model(settings))
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    server = uvicorn.Server(uvicorn.Config(create_app(settings, registry=registry), log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    return f"http://127.0.0.1:{sock.getsockname()[1]}", server, thread


def timed(client: httpx.Client, url: str, body: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    began = time.perf_counter()
    response = client.post(url + "/v1/systemone", json=body, timeout=600)
    elapsed = (time.perf_counter() - began) * 1000
    response.raise_for_status()
    return elapsed, response.json()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL_PATH)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--state-tokens", type=int, default=1000)
    args = parser.parse_args()
    url, server, thread = serve(Settings(model=args.model, n_ctx=4096))
    results: dict[str, Any] = {"model": args.model.name, "state_tokens_target": args.state_tokens, "rows": []}
    with httpx.Client() as client:
        timed(client, url, {"model": "jev-latest", "state": "warm-up", "questions": {"q": QUESTIONS[0]}})
        for n in (1, 5):
            questions = {f"q{i}": QUESTIONS[i] for i in range(n)}
            cold, hit, decode, prefill = [], [], [], []
            for run in range(args.runs):
                body = {
                    "model": "jev-latest",
                    "state": state_of(args.state_tokens, run + 100 * n),
                    "questions": questions,
                }
                ms, data = timed(client, url, body)
                assert data["x_cache"] == "miss"
                cold.append(ms)
                prefill.append(data["x_timing_ms"]["prefill"])
                ms, data = timed(client, url, body)
                assert data["x_cache"] == "hit"
                hit.append(ms)
                decode.append(data["x_timing_ms"]["decode"])
            row = {
                "questions": n,
                "input_tokens": data["usage"]["input_tokens"],
                "cold_ms": statistics.median(cold),
                "hit_ms": statistics.median(hit),
                "engine_prefill_ms": statistics.median(prefill),
                "engine_decode_ms": statistics.median(decode),
            }
            row["speedup"] = row["cold_ms"] / row["hit_ms"]
            row["hit_over_decode"] = row["hit_ms"] / row["engine_decode_ms"]
            results["rows"].append(row)
            print(json.dumps(row), flush=True)
    server.should_exit = True
    thread.join()
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
