"""make bench-prefills-together: two new states sent together on one context, against the same two sent one
after the other (issue 69's target: within 1.1x).

    python -m bench.prefills_together [--model GGUF] [--tokens N] [--pairs N] [--out DIR]

One onepass server in its own process on the model (the default model: one context, the snapshot disk tier
off). Each pair asks about two new states of about N tokens each, one question each: first one after the
other (the second sent once the first is answered), then two other new states sent at once from two
clients; the time from the first send to the last answer, for each. Every state is new to the server, so
each request prefills its whole state. The pairs alternate so that a machine whose speed drifts moves
both alike; the report gives each pair's ratio and their median.

Writes bench/results/<date>-<sha>-prefills-together.{json,md}.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from app.engine.engine import Engine
from app.serving.known_models import default_model_path
from bench.output import RESULTS, Progress, git_sha, machine, table, write_atomically
from bench.servers import onepass_server
from bench.workloads import QUESTIONS, StateMaker

ANSWER_S = 600.0  # a request's longest wait; one ~1,400-token prefill takes ~10-20 s on 2 cores


def body(state: str) -> dict[str, Any]:
    return {"model": "jev-latest", "state": state, "questions": {"refund": QUESTIONS[0]}}


def ask(url: str, state: str) -> dict[str, Any]:
    response = httpx.post(url + "/v1/systemone", json=body(state), timeout=ANSWER_S)
    response.raise_for_status()
    answered: dict[str, Any] = response.json()
    assert answered["x_cache"] == "miss", "a state meant to be new was not"
    return answered


def one_after_the_other(url: str, states: tuple[str, str]) -> float:
    began = time.perf_counter()
    for state in states:
        ask(url, state)
    return time.perf_counter() - began


def together(url: str, states: tuple[str, str]) -> float:
    errors: list[BaseException] = []

    def send(state: str) -> None:
        try:
            ask(url, state)
        except BaseException as error:  # reported below, on the bench's thread
            errors.append(error)

    threads = [threading.Thread(target=send, args=(state,), daemon=True) for state in states]
    began = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(ANSWER_S)
        assert not thread.is_alive(), "a request outlasted its timeout"
    if errors:
        raise errors[0]
    return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=default_model_path())
    parser.add_argument("--tokens", type=int, default=1400, help="each new state's tokens, about")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    states = StateMaker(Engine(args.model, n_ctx=512, contexts=1))  # its tokenizer only
    rows: list[dict[str, float]] = []
    progress = Progress(args.pairs, "pairs")
    with onepass_server(args.model, "--contexts", "1") as (url, _):
        ask(url, states.make(64))  # the system prompt's snapshot and the question's priors: not timed
        for _ in range(args.pairs):
            apart = one_after_the_other(url, (states.make(args.tokens), states.make(args.tokens)))
            both = together(url, (states.make(args.tokens), states.make(args.tokens)))
            rows.append({"one_after_the_other_s": round(apart, 2), "together_s": round(both, 2)})
            progress.step()
    ratios = [row["together_s"] / row["one_after_the_other_s"] for row in rows]
    report = {
        "commit": git_sha(),
        "machine": machine(),
        "model": args.model.name,
        "tokens": args.tokens,
        "pairs": rows,
        "ratios": [round(ratio, 3) for ratio in ratios],
        "median_ratio": round(statistics.median(ratios), 3),
    }
    stem = f"{datetime.date.today()}-{report['commit']}-prefills-together"
    lines = [
        "# Two new states together against one after the other",
        "",
        f"{report['commit']}, {report['machine']}, {report['model']}, states of about {args.tokens} tokens,"
        " one context.",
        "",
        *table(
            ["pair", "one after the other (s)", "together (s)", "ratio"],
            [
                [i + 1, row["one_after_the_other_s"], row["together_s"], f"{ratio:.3f}"]
                for i, (row, ratio) in enumerate(zip(rows, ratios, strict=True))
            ],
        ),
        "",
        f"Median ratio: **{report['median_ratio']}** (issue 69's target: at most 1.1).",
        "",
    ]
    write_atomically(args.out / f"{stem}.json", json.dumps(report, indent=2) + "\n")
    write_atomically(args.out / f"{stem}.md", "\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
