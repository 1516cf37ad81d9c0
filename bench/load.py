"""make load: many concurrent clients against one onepass server; no errors, no changed answer.

64 clients send a fixed number of requests (states repeated and new, varied question sets)
to a server in its own process. Every distinct request is then answered again, alone, by a
fresh quiet server with the cache off; each loaded answer must equal that one exactly.

    python -m bench.load [--model PATH] [--requests N] [--clients N]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time
from pathlib import Path
from typing import Any

import httpx

from app.serving.known_models import default_model_path
from bench.servers import onepass_server, rss_mb
from bench.workloads import QUESTIONS, SENTENCES


def workload(n_requests: int, seed: int = 7) -> list[dict[str, Any]]:
    """A reproducible mix: 8 recurring states and a new state in every fourth request."""
    rng = random.Random(seed)
    recurring = [" ".join(s.format(n=f"r{i}-{j}") for j, s in enumerate(SENTENCES[: 1 + i % 3])) for i in range(8)]
    question_sets = [QUESTIONS[:1], QUESTIONS[1:3], [QUESTIONS[3], QUESTIONS[6]], QUESTIONS[:3]]
    requests = []
    for i in range(n_requests):
        state = f"New ticket {i}: " + SENTENCES[i % len(SENTENCES)].format(n=i) if i % 4 == 3 else rng.choice(recurring)
        questions = rng.choice(question_sets)
        requests.append(
            {"model": "jev-latest", "state": state, "questions": {f"q{k}": q for k, q in enumerate(questions)}}
        )
    return requests


async def drive(url: str, requests: list[dict[str, Any]], clients: int) -> tuple[list[float], list[Any]]:
    queue: asyncio.Queue[int] = asyncio.Queue()
    for index in range(len(requests)):
        queue.put_nowait(index)
    latencies: list[float] = []
    results: list[Any] = [None] * len(requests)
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(limits=limits, timeout=900) as client:

        async def worker() -> None:
            while not queue.empty():
                index = queue.get_nowait()
                began = time.perf_counter()
                response = await client.post(url + "/v1/systemone", json=requests[index])
                latencies.append((time.perf_counter() - began) * 1000)
                results[index] = response.json()["answers"] if response.status_code == 200 else response.status_code

        await asyncio.gather(*(worker() for _ in range(clients)))
    return latencies, results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=default_model_path())
    parser.add_argument("--requests", type=int, default=192)
    parser.add_argument("--clients", type=int, default=64)
    args = parser.parse_args()
    requests = workload(args.requests)
    with onepass_server(args.model, "--max-queue", str(args.clients)) as (url, pid):
        httpx.post(url + "/v1/systemone", json=requests[0], timeout=900)  # load, learn, warm up
        rss_before = rss_mb(pid)
        began = time.perf_counter()
        latencies, results = asyncio.run(drive(url, requests, args.clients))
        seconds = time.perf_counter() - began
        rss_after = rss_mb(pid)
    distinct = {json.dumps(r, sort_keys=True): i for i, r in enumerate(requests)}
    with onepass_server(args.model, "--session-cache-entries", "0") as (quiet_url, _), httpx.Client() as client:
        reference = {
            key: client.post(quiet_url + "/v1/systemone", json=requests[i], timeout=900).json()["answers"]
            for key, i in distinct.items()
        }
    errors = [r for r in results if isinstance(r, int)]
    mismatched = [
        i
        for i, r in enumerate(results)
        if not isinstance(r, int) and r != reference[json.dumps(requests[i], sort_keys=True)]
    ]
    ordered = sorted(latencies)
    report = {
        "model": args.model.name,
        "requests": len(requests),
        "clients": args.clients,
        "distinct_requests": len(distinct),
        "seconds": round(seconds, 1),
        "throughput_rps": round(len(requests) / seconds, 2),
        "p50_ms": round(statistics.median(ordered), 1),
        "p99_ms": round(ordered[int(0.99 * (len(ordered) - 1))], 1),
        "errors_5xx": sum(1 for r in errors if r >= 500),
        "errors_other": sum(1 for r in errors if r < 500),
        "mismatched_answers": len(mismatched),
        "rss_mb_before": round(rss_before, 1),
        "rss_mb_after": round(rss_after, 1),
        "rss_growth_mb": round(rss_after - rss_before, 1),
    }
    print(json.dumps(report, indent=2))
    if errors or mismatched:
        raise SystemExit(f"load test failed: {len(errors)} errors, {len(mismatched)} mismatched answers")


if __name__ == "__main__":
    main()
