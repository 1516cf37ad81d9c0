"""What one `llama_decode` of many requests is worth against one after another (the setting
`batch_requests`), per kernel setting, through the engine's own path.

    python -m bench.shared_decode_cost [--model PATH] [--requests N] [--runs N] [--threads N]

N requests, each a different ~100-token state of onepass's own prompt with one question, all cached
first. Together: the engine's one context is lent while the N requests queue up in their own threads,
then let go, so the first of them leads one decode of all (app/engine/shared_decode.py); timed from
the release to the last readout, restores included. One after another: the same requests decoded by one
thread, each alone. Also the largest gap between a label probability decoded together and alone (the
spread docs/exactness.md states). Flash attention and repacked weights on and off: which kernels ggml
picks decides what more rows in one decode cost.

Writes bench/results/<date>-<sha>-shared-decode-cost.{json,md}, with the commit, the CPU and the load average.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import statistics
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from app.answering.prompting import OwnPrompter
from app.answering.service import distinct_suffixes
from app.engine.caller import Caller, Signal, working_for
from app.engine.engine import Engine, SuffixReadouts, SuffixTokens
from app.engine.snapshot import Prefix, Snapshot
from app.serving.known_models import default_model_path
from app.serving.loading import prompter_for
from app.wire.contract import SystemOneRequest
from bench.client import sized_text
from bench.output import RESULTS, Progress, git_sha, machine, table, write_atomically
from bench.workloads import QUESTIONS, SENTENCES

WAIT_S = 600.0  # a bound on every wait; a healthy run of one setting takes seconds
STATE_TOKENS = 100

Request = tuple[Snapshot, list[SuffixTokens]]


def make_requests(engine: Engine, count: int) -> list[Request]:
    prompter = prompter_for(engine)
    assert isinstance(prompter, OwnPrompter)  # the default model: onepass's own prompt
    made = []
    for i in range(count):
        state = sized_text(engine, SENTENCES, STATE_TOKENS, f"s{i}", start=i)
        body = SystemOneRequest.model_validate(
            {"model": "m", "state": state, "questions": {"q": QUESTIONS[i % len(QUESTIONS)]}}
        )
        suffixes = distinct_suffixes(prompter.question(q) for q in body.questions.values())
        snapshot, _ = engine.prefill(Prefix((*prompter.head_tokens, *prompter.state_tokens(state))))
        made.append((snapshot, suffixes))
    return made


@contextlib.contextmanager
def context_lent(engine: Engine) -> Iterator[None]:
    """The engine's one context held by another thread inside; let go on the way out."""
    got, go = threading.Event(), threading.Event()

    def hold() -> None:
        with engine._pool.borrow(None):
            got.set()
            go.wait(WAIT_S)

    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    if not got.wait(WAIT_S):
        raise RuntimeError("the context was never lent")
    try:
        yield
    finally:
        go.set()
        holder.join(WAIT_S)


def together(engine: Engine, requests: list[Request]) -> tuple[float, list[SuffixReadouts]]:
    """Milliseconds from the release of the context to the last readout, and each request's readouts."""
    found: list[SuffixReadouts | None] = [None] * len(requests)
    shared = engine._shared
    assert shared is not None

    def ask(i: int) -> None:
        with working_for(Caller("interactive", Signal())):
            found[i] = engine.decode_suffixes(*requests[i], beside_others=True)

    threads = [threading.Thread(target=ask, args=(i,), daemon=True) for i in range(len(requests))]
    with context_lent(engine):
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + WAIT_S
        while True:
            if engine._pool.questions_waiting() == len(requests):
                break
            if time.monotonic() > deadline:
                raise RuntimeError("the requests never all queued")
            threading.Event().wait(0.005)
        began = time.perf_counter()
    for thread in threads:
        thread.join(WAIT_S)
    ms = (time.perf_counter() - began) * 1000
    if any(f is None for f in found):
        raise RuntimeError("a request was not answered")
    return ms, [f for f in found if f is not None]


def apart(engine: Engine, requests: list[Request]) -> tuple[float, list[SuffixReadouts]]:
    began = time.perf_counter()
    found = [engine.decode_suffixes(*request) for request in requests]
    return (time.perf_counter() - began) * 1000, found


def probabilities(found: SuffixReadouts) -> NDArray[np.float64]:
    logits = np.array([r.label_logits for r in found.readouts], dtype=np.float64)
    p: NDArray[np.float64] = np.exp(logits - logits.max(axis=1, keepdims=True))
    total: NDArray[np.float64] = p.sum(axis=1, keepdims=True)
    return p / total


def measure(model: Path, count: int, runs: int, threads: int, flash_attn: bool, repack: bool) -> dict[str, Any]:
    engine = Engine(model, n_ctx=8192, threads=threads, flash_attn=flash_attn, repack=repack, batch_requests=True)
    try:
        requests = make_requests(engine, count)
        ms_together, ms_apart, spread, beside = [], [], 0.0, 0
        for _ in range(runs):
            ms, shared = together(engine, requests)
            ms_together.append(ms)
            ms, alone = apart(engine, requests)
            ms_apart.append(ms)
            beside = max(beside, max(f.beside for f in shared))
            pairs = zip(shared, alone, strict=True)
            gaps = [float(np.abs(probabilities(s) - probabilities(a)).max()) for s, a in pairs]
            spread = max(spread, *gaps)
        one = statistics.median(apart(engine, requests[:1])[0] for _ in range(runs))
    finally:
        engine.close()
    return {
        "flash_attn": flash_attn,
        "repack": repack,
        "ms_one": round(one, 1),
        "ms_together": round(statistics.median(ms_together), 1),
        "ms_apart": round(statistics.median(ms_apart), 1),
        "gain": round(statistics.median(ms_apart) / statistics.median(ms_together), 2),
        "largest_beside": beside,
        "probability_spread": round(spread, 4),
        "samples_together": [round(x, 1) for x in ms_together],
        "samples_apart": [round(x, 1) for x in ms_apart],
    }


def markdown(report: dict[str, Any]) -> str:
    rows = [
        [
            "on" if r["flash_attn"] else "off",
            "on" if r["repack"] else "off",
            f"{r['ms_one']:,.0f}",
            f"{r['ms_together']:,.0f}",
            f"{r['ms_apart']:,.0f}",
            f"{r['gain']}x",
            r["probability_spread"],
        ]
        for r in report["results"]
    ]
    lines = [
        f"# One decode of {report['requests']} requests against one after another, {report['date']}",
        "",
        f"Commit {report['git']}, {report['machine']}, {report['threads']} threads, "
        f"{report['model']}, load average {report['load_average']} at the start; {report['runs']} runs each, medians.",
        "",
        *table(
            [
                "flash attention",
                "repacked weights",
                "1 request",
                f"{report['requests']} together",
                f"{report['requests']} one after another",
                "gain",
                "largest probability gap",
            ],
            rows,
        ),
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=default_model_path())
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    settings = [(True, False), (True, True), (False, False), (False, True)]
    report: dict[str, Any] = {
        "model": args.model.name,
        "date": datetime.date.today().isoformat(),
        "git": git_sha(),
        "machine": machine(),
        "threads": args.threads,
        "load_average": " ".join(f"{x:.1f}" for x in os.getloadavg()),
        "requests": args.requests,
        "runs": args.runs,
        "results": [],
    }
    progress = Progress(len(settings), "shared decode cost")
    stem = f"{report['date']}-{report['git']}-shared-decode-cost"
    for flash_attn, repack in settings:
        report["results"].append(measure(args.model, args.requests, args.runs, args.threads, flash_attn, repack))
        progress.step(f"flash attention {'on' if flash_attn else 'off'}, repack {'on' if repack else 'off'}")
        write_atomically(args.out / f"{stem}.json", json.dumps(report, indent=2) + "\n")
        write_atomically(args.out / f"{stem}.md", markdown(report))
    print(markdown(report))


if __name__ == "__main__":
    main()
