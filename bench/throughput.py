"""onepass against llama.cpp's own /v1/systemone under 1, 4, 16 and 64 clients: requests/s and p50/p99 latency.

    python -m bench.throughput --server PATH/llama-server [--model GGUF] [--quick] [--threads N] [--slots N]
        [--only long-state]

The yardstick for issue 59's scheduler (requests of different clients sharing a decode). Both
servers run at once on one decision GGUF, each in its own process on a loopback port, with the
settings `make bench-native` (bench/native_speed.py) calls equal: the threads, repacked weights and
flash attention onepass measured on this machine, given to llama-server too; onepass with its
defaults for the model (one context of 8,192 tokens, the snapshot cache, its disk tier in a
temporary folder) and `--calibration none` (the file's temperatures, as llama-server answers);
llama-server with its default layout (4 slots of 8,192 tokens sharing one unified KV cache, its
prompt cache and host-memory prompt cache on). Two bounds on waiting, not on work, are raised on
onepass so that 64 clients at once are queued, not refused: `--max-queue` to the most clients and
`--request-timeout` to the client's own timeout (llama-server queues without a bound).

The curve: for each workload and each client count, the clients start at once, each with its own
connection, and each sends its requests one after another; request j of a cell goes to client
j mod clients. Requests/s is the cell's requests over the wall clock from the first send to the last
answer; p50 and p99 are latencies from the client (nearest rank: with fewer than 100 requests, p99
is the slowest). One server answers a whole cell, then the other; which one goes first alternates
from cell to cell, so a drift in the machine's speed falls on both alike. The workloads:

- new states: each request a state of ~`state_tokens` tokens neither server has seen, 5 questions;
- hits, 1 question and 5 questions: the same `hit_states` distinct states, each asked once with the
  5 questions before the curve (untimed), so that onepass answers them from its snapshot cache and
  llama-server from its slots or its prompt cache; request j asks state j mod `hit_states`.

The phases, in this order: the warm-up and the cached states; the hits' cells; the new states' cells;
the first target's pairs; the long-state case. The request counts (FULL) keep the full run near 25
minutes on a 2-core CPU, where a new state costs seconds and llama-server takes seconds a request
under load: with 64 clients, and with 4 clients on new states and 5-question hits, each client sends
one request.

Issue 59's target cases:

- 16 clients sending 1-question hits on 16 distinct cached states against the same requests sent one
  after another by one client (target: at least 1.5 for onepass), measured in pairs apart from the
  curve: `pair_requests` hits from one client, then the same from 16 clients at once (each of the 16
  states as often), `pairs` times per server; the report gives each pair's ratio of requests/s and
  their median. The two sides of a pair run seconds apart, where the curve's two cells run minutes
  apart on a machine whose speed drifts;
- a hit's p99 while a ~4,000-token new state is being prefilled, against its idle p99 (target: within
  2x): one client asks 1-question hits one after another on a few cached states, idle; then the long
  state is sent, and once the server reports it at work (onepass's `onepass_in_flight`,
  llama-server's `/slots`) the same client asks hits until the long request is answered. The idle hits
  are about as many as onepass answers beside the long state, so that the two p99s are of samples alike
  (of 20 idle hits, as before 2026-12-06's side context, the idle p99 was the slowest of 20, nearer
  a p95).

Every pair of answers (the same request to both) is compared (`agreement`, bench/native_decision.py):
the same answer to every question, and the largest probability gap (flash attention on two batch
layouts rounds apart, docs/exactness.md). Every loop is bounded in count and in time: a cell that runs
past its time limit sends no more requests, and the report counts the ones not sent.

Writes bench/results/<date>-<sha>-throughput.{json,md} (--quick: -throughput-quick), with the
commit, the CPU (`model name` of /proc/cpuinfo, cores) and the settings.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from app.config import Settings
from app.engine import bindings
from app.engine.engine import Engine
from app.paths import REPO_ROOT
from app.serving.loading import speed_settings_for
from app.serving.specs import ModelSpec
from bench.native_decision import DEFAULT_MODEL, Agreement, agreement
from bench.native_speed import N_CTX, on_off
from bench.native_speed import QUESTIONS as THREE_QUESTIONS
from bench.native_speed import native_server as llama_server
from bench.output import Progress, git_sha, machine, table, write_atomically
from bench.servers import onepass_server
from bench.workloads import StateMaker

CLIENT_TIMEOUT_S = 900.0  # one request, from the client; onepass's --request-timeout is set to it
TARGET_CONCURRENT = 1.5  # hits: 16 clients' requests/s over one client's, at least
TARGET_BUSY_P99 = 2.0  # a hit's p99 while a long state is prefilled over its idle p99, at most
BUSY_POLL_S = 0.02  # how often the server is asked whether the long request is at work

FIVE_QUESTIONS: dict[str, Any] = {
    **THREE_QUESTIONS,
    "order_number": {"type": "noul", "instructions": "Is an order number given?"},
    "sentiment": {
        "type": "choice",
        "instructions": "What is the sentiment?",
        "criteria": {"positive": None, "negative": None},
    },
}
ONE_QUESTION: dict[str, Any] = {"refund": THREE_QUESTIONS["refund"]}

NEW, HIT1, HIT5 = "new states, 5 questions", "hits, 1 question", "hits, 5 questions"
QUESTIONS_OF = {NEW: FIVE_QUESTIONS, HIT1: ONE_QUESTION, HIT5: FIVE_QUESTIONS}


@dataclass(frozen=True)
class Config:
    state_tokens: int  # a short state: the new states' and the cached ones'
    hit_states: int  # distinct cached states the hits ask
    requests: dict[str, dict[int, int]]  # per workload, per client count: the cell's requests
    long_tokens: int  # the new state prefilled while hits are asked
    busy_states: int  # cached states the hits around the long state ask, round-robin
    idle_hits: int
    busy_hits: int  # at most, while the long state is prefilled
    cell_limit_s: float  # a cell sends no more requests after this long
    pairs: int  # the first target's pairs: one client's hits, then sixteen clients' same requests
    pair_requests: int  # each side of a pair

    @property
    def clients(self) -> list[int]:
        return sorted({c for cells in self.requests.values() for c in cells})


# Hits at 1 and 16 clients ask the same requests: every cached state the same number of times. The counts
# keep the full run near 25 minutes on a 2-core CPU, where llama-server takes seconds a request under load:
# with 4 or 64 clients each client sends one request where a cell has as many requests as clients.
FULL = Config(
    state_tokens=100,
    hit_states=16,
    requests={
        HIT1: {1: 32, 4: 16, 16: 32, 64: 64},
        HIT5: {1: 4, 4: 4, 16: 16, 64: 64},
        NEW: {1: 4, 4: 4, 16: 16, 64: 64},
    },
    long_tokens=4000,
    busy_states=4,
    idle_hits=100,  # the idle p99 from about as many hits as come beside the long state, not the slowest of a few
    busy_hits=200,
    cell_limit_s=420.0,
    pairs=5,  # their median: one pair moves with the machine's speed (docs/notes/2026-12-06-throughput-baseline.md)
    pair_requests=64,
)
QUICK = Config(
    state_tokens=100,
    hit_states=16,
    requests={HIT1: {1: 16, 4: 16, 16: 16}, HIT5: {1: 2, 4: 4}, NEW: {1: 2, 4: 4}},
    long_tokens=1000,
    busy_states=4,
    idle_hits=6,
    busy_hits=50,
    cell_limit_s=180.0,
    pairs=1,
    pair_requests=16,
)


@dataclass(frozen=True)
class Server:
    """A server as the client sees it: onepass wants a model name in the body, llama-server serves one
    model; `at_work` says whether it is answering or holding a request now."""

    name: str
    url: str
    body: dict[str, Any]
    at_work: Callable[[httpx.Client], bool]

    def ask(self, client: httpx.Client, state: str, questions: dict[str, Any]) -> Answered:
        body = {**self.body, "state": state, "questions": questions}
        began = time.perf_counter()
        response = client.post(self.url + "/v1/systemone", json=body)
        elapsed = (time.perf_counter() - began) * 1000
        if response.is_error:
            raise RuntimeError(f"{self.name} answered {response.status_code}: {response.text[:1000]}")
        found = response.json()
        return Answered(elapsed, found["answers"], found.get("x_cache"))


@dataclass(frozen=True)
class Answered:
    ms: float
    answers: dict[str, Any]
    cache: str | None  # onepass's x_cache: hit (RAM), disk or miss; llama-server does not say


def onepass_at_work(url: str) -> Callable[[httpx.Client], bool]:
    def at_work(client: httpx.Client) -> bool:
        text = client.get(url + "/metrics").text
        return any(line.startswith("onepass_in_flight{") and float(line.split()[-1]) >= 1 for line in text.splitlines())

    return at_work


def llama_server_at_work(url: str) -> Callable[[httpx.Client], bool]:
    def at_work(client: httpx.Client) -> bool:
        return any(slot.get("is_processing") for slot in client.get(url + "/slots").json())

    return at_work


@dataclass(frozen=True)
class Request:
    state: str
    questions: dict[str, Any]


def cell_requests(kind: str, count: int, states: StateMaker, cfg: Config, cached: Sequence[str]) -> list[Request]:
    """A cell's requests in order (request j goes to client j mod clients)."""
    questions = QUESTIONS_OF[kind]
    if kind == NEW:
        return [Request(states.make(cfg.state_tokens), questions) for _ in range(count)]
    return [Request(cached[j % len(cached)], questions) for j in range(count)]


@dataclass
class Cell:
    """One server's run of one cell."""

    wall_s: float
    latencies_ms: dict[int, float] = field(default_factory=dict)  # by request index
    answers: dict[int, dict[str, Any]] = field(default_factory=dict)
    caches: dict[int, str | None] = field(default_factory=dict)
    not_sent: int = 0

    def summary(self) -> dict[str, Any]:
        done = list(self.latencies_ms.values())
        return {
            "answered": len(done),
            "not_sent": self.not_sent,
            "wall_s": round(self.wall_s, 2),
            "requests_per_s": round(len(done) / self.wall_s, 3) if self.wall_s else 0.0,
            "p50_ms": percentile(done, 50),
            "p99_ms": percentile(done, 99),
            **({"onepass_cache": tally(self.caches.values())} if any(self.caches.values()) else {}),
        }


def percentile(samples: Sequence[float], q: float) -> float:
    """Nearest rank: the smallest sample with at least q% of the samples at or below it."""
    if not samples:
        return float("nan")
    ordered = sorted(samples)
    return round(ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)], 1)


def tally(values: Any) -> dict[str, int]:
    found: dict[str, int] = {}
    for value in values:
        found[str(value)] = found.get(str(value), 0) + 1
    return found


def run_cell(
    server: Server, requests: Sequence[Request], clients: int, limit_s: float, step: Callable[[str], None]
) -> Cell:
    """`clients` clients at once, each with its own connection, each sending its share in order.

    The clients are made before the clock starts: making one loads a certificate bundle (about 20 ms of
    this CPU, docs/notes/2026-12-07-concurrent-hits-ceiling.md), which sixteen clients would otherwise
    spend inside the cell, on the cores the server answers with, where one client spends it once."""
    lock = threading.Lock()
    cell = Cell(0.0)
    with ExitStack() as stack:
        made = [stack.enter_context(httpx.Client(timeout=CLIENT_TIMEOUT_S)) for _ in range(clients)]
        began = time.perf_counter()

        def client_run(first: int) -> None:
            for j in range(first, len(requests), clients):
                if time.perf_counter() - began > limit_s:
                    with lock:
                        cell.not_sent += 1
                    continue
                got = server.ask(made[first], requests[j].state, requests[j].questions)
                with lock:
                    cell.latencies_ms[j], cell.answers[j], cell.caches[j] = got.ms, got.answers, got.cache
                step(server.name)

        with ThreadPoolExecutor(clients) as pool:
            list(pool.map(client_run, range(clients)))
        cell.wall_s = time.perf_counter() - began
    return cell


def agreements(questions: dict[str, Any], ours: Cell, theirs: Cell) -> list[Agreement]:
    return [
        agreement(question["type"], ours.answers[j][qid], theirs.answers[j][qid])
        for j in sorted(ours.answers.keys() & theirs.answers.keys())
        for qid, question in questions.items()
    ]


def agreed(found: Sequence[Agreement]) -> dict[str, Any]:
    return {
        "compared": len(found),
        "same_answer": sum(a.same_answer for a in found),
        "largest_gap": max((a.largest_gap for a in found), default=0.0),
    }


PAIR_CLIENTS = 16


def concurrent_hits(
    servers: Sequence[Server], cached: Sequence[str], cfg: Config, step: Callable[[str], None]
) -> dict[str, Any]:
    """Issue 59's first target: 1-question hits on the cached states sent by one client, then the same
    requests by sixteen clients at once, `cfg.pairs` times for each server in turn; each pair's ratio of
    requests/s and their median. The two sides of a pair run a few seconds apart: this machine's speed
    moves by a fifth within minutes (docs/notes/2026-12-07-concurrent-hits-ceiling.md), and a ratio of the
    curve's two cells, minutes apart, moves with it."""
    requests = [Request(cached[j % len(cached)], ONE_QUESTION) for j in range(cfg.pair_requests)]
    found: dict[str, Any] = {}
    for server in servers:
        key = "onepass" if server.name == "onepass" else "llama_server"
        pairs = []
        for _ in range(cfg.pairs):
            one = run_cell(server, requests, 1, cfg.cell_limit_s, step).summary()["requests_per_s"]
            many = run_cell(server, requests, PAIR_CLIENTS, cfg.cell_limit_s, step).summary()["requests_per_s"]
            pairs.append({"one_client": one, "sixteen_clients": many, "ratio": round(many / one, 3)})
        found[key] = {"median_ratio": round(statistics.median(p["ratio"] for p in pairs), 3), "pairs": pairs}
    return found


def hits_beside_long_state(
    server: Server,
    cached: Sequence[str],
    long_state: str,
    cfg: Config,
    limit_s: float,
    step: Callable[[str], None],
    unused: Callable[[int], None],
) -> dict[str, Any]:
    """One client's 1-question hits idle, then while the long state is prefilled (issue 59's second target)."""
    with httpx.Client(timeout=CLIENT_TIMEOUT_S) as client:
        for state in cached:  # back in onepass's RAM tier, should the curve have moved them out
            server.ask(client, state, ONE_QUESTION)
            step(f"{server.name} warm")
        idle: list[float] = []
        for i in range(cfg.idle_hits):
            idle.append(server.ask(client, cached[i % len(cached)], ONE_QUESTION).ms)
            step(f"{server.name} idle hit")
        long_answer: list[Answered] = []
        failed: list[BaseException] = []

        def long_run() -> None:
            try:
                with httpx.Client(timeout=CLIENT_TIMEOUT_S) as own:
                    long_answer.append(server.ask(own, long_state, ONE_QUESTION))
            except BaseException as error:  # re-raised below, on the bench's thread
                failed.append(error)

        sent = time.perf_counter()
        worker = threading.Thread(target=long_run, name="long-state", daemon=True)
        worker.start()
        waited_for_work = time.perf_counter() + 60.0
        while not server.at_work(client) and worker.is_alive():
            if time.perf_counter() > waited_for_work:
                raise TimeoutError(f"{server.name} did not report the long request at work within 60 s")
            time.sleep(BUSY_POLL_S)
        busy: list[float] = []
        while worker.is_alive() and len(busy) < cfg.busy_hits and time.perf_counter() - sent < limit_s:
            busy.append(server.ask(client, cached[len(busy) % len(cached)], ONE_QUESTION).ms)
            step(f"{server.name} hit beside the long state")
        unused(cfg.busy_hits - len(busy))
        worker.join(CLIENT_TIMEOUT_S)
        if failed:
            raise failed[0]
        if not long_answer:
            raise TimeoutError(f"{server.name}: the long request was not answered in {CLIENT_TIMEOUT_S} s")
    idle_p99, busy_p99 = percentile(idle, 99), percentile(busy, 99)
    return {
        "long_ms": round(long_answer[0].ms, 1),
        "idle": {"hits": len(idle), "p50_ms": percentile(idle, 50), "p99_ms": idle_p99},
        "beside_long_state": {"hits": len(busy), "p50_ms": percentile(busy, 50), "p99_ms": busy_p99},
        "p99_ratio": round(busy_p99 / idle_p99, 2) if busy else None,
    }


def cpu_model() -> str:
    """What `grep -m1 'model name' /proc/cpuinfo` says, where there is one."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return "?"
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), "?")


class Overall:
    """The whole run's phases, weighed by what each costs, for an overall ETA between phases."""

    def __init__(self, weights: list[float]) -> None:
        self.weights, self.done, self.began = weights, 0, time.monotonic()

    def finished(self, name: str) -> None:
        self.done += 1
        elapsed = time.monotonic() - self.began
        left = sum(self.weights[self.done :]) / max(sum(self.weights[: self.done]), 1e-9) * elapsed
        sys.stderr.write(
            f"phase {self.done}/{len(self.weights)} done ({name}): {elapsed / 60:.1f} min elapsed, "
            f"about {left / 60:.1f} min left\n"
        )
        sys.stderr.flush()


def weight(kind: str, cfg: Config) -> float:
    """A request's rough cost in hits of 1 question: a prefill of the state and 5 question decodes."""
    return {NEW: 5.0, HIT1: 1.0, HIT5: 2.5}[kind] * (1 + cfg.state_tokens / 300)


def markdown(report: dict[str, Any]) -> str:
    s, cfg = report["settings"], report["config"]
    lines = [
        f"# Throughput: onepass and llama-server's /v1/systemone, 1 to {max(cfg['clients'])} clients "
        f"({report['date']}, {report['git']})",
        "",
        f"Model {report['model']}. CPU: {report['cpu']} ({report['machine']}).",
        "",
        f"Both with {s['threads']} threads, repacked weights {on_off(s['repack'])}, flash attention "
        f"{on_off(s['flash_attn'])} (onepass's choice on this machine). onepass: {s['onepass']}. "
        f"llama-server: {s['llama_server']}.",
        "",
        f"Builds: onepass `{report['builds']['onepass']}`; llama-server `{report['builds']['llama_server']}`",
        "",
        f"States of ~{cfg['state_tokens']} tokens; hits on {cfg['hit_states']} distinct states asked once "
        "beforehand. Clients start at once, each sends its requests one after another; requests/s over the "
        "cell's wall clock, latency in ms from the client (p99: nearest rank, the slowest below 100 requests).",
        "",
        *table(
            [
                "workload",
                "clients",
                "requests",
                "onepass req/s",
                "p50",
                "p99",
                "llama-server req/s",
                "p50",
                "p99",
                "onepass / llama-server, req/s",
                "p50",
                "same answers",
            ],
            [
                [
                    r["workload"],
                    r["clients"],
                    r["requests"],
                    r["onepass"]["requests_per_s"],
                    r["onepass"]["p50_ms"],
                    r["onepass"]["p99_ms"],
                    r["llama_server"]["requests_per_s"],
                    r["llama_server"]["p50_ms"],
                    r["llama_server"]["p99_ms"],
                    r["ratio_requests_per_s"],
                    r["ratio_p50"],
                    f"{r['agreement']['same_answer']}/{r['agreement']['compared']}",
                ]
                for r in report["cells"]
            ],
        ),
        "",
    ]
    cut = [r for r in report["cells"] if r["onepass"]["not_sent"] or r["llama_server"]["not_sent"]]
    if cut:
        lines += [
            "Cells past their time limit (requests not sent, onepass / llama-server): "
            + ", ".join(
                f"{r['workload']} x{r['clients']} {r['onepass']['not_sent']}/{r['llama_server']['not_sent']}"
                for r in cut
            ),
            "",
        ]
    caches = [
        f"{r['workload']} x{r['clients']} {r['onepass']['onepass_cache']}"
        for r in report["cells"]
        if "onepass_cache" in r["onepass"]
    ]
    lines += ["onepass's x_cache per cell: " + "; ".join(caches), ""]
    t = report["concurrent_hits"]
    lines += ["## Issue 59's targets", ""]
    if t is not None:
        ours = t["onepass"]["median_ratio"]
        lines += [
            f"{PAIR_CLIENTS} clients with 1-question hits on {cfg['hit_states']} distinct cached states against the "
            f"same {cfg['pair_requests']} requests from one client just before, requests/s, {cfg['pairs']} "
            f"pair{'s' if cfg['pairs'] != 1 else ''} per server: onepass's median ratio {ours} "
            f"(target >= {TARGET_CONCURRENT}: "
            f"{'met' if ours >= TARGET_CONCURRENT else 'not met'}), "
            f"llama-server's {t['llama_server']['median_ratio']}.",
            "",
            *table(
                ["server", "pair", "one client, req/s", f"{PAIR_CLIENTS} clients, req/s", "ratio"],
                [
                    [name, i + 1, p["one_client"], p["sixteen_clients"], p["ratio"]]
                    for name, key in (("onepass", "onepass"), ("llama-server", "llama_server"))
                    for i, p in enumerate(t[key]["pairs"])
                ],
            ),
            "",
        ]
    b = report["beside_long_state"]
    same = sum(r["agreement"]["same_answer"] for r in report["cells"])
    compared = sum(r["agreement"]["compared"] for r in report["cells"])
    lines += [
        f"A 1-question hit idle and while a new state of ~{cfg['long_tokens']} tokens is prefilled (one client, "
        f"{cfg['busy_states']} cached states round-robin; ms from the client):",
        "",
        *table(
            [
                "server",
                "long request",
                "idle hits",
                "idle p50",
                "idle p99",
                "hits beside",
                "p50 beside",
                "p99 beside",
                f"p99 beside / idle (target <= {TARGET_BUSY_P99})",
            ],
            [
                [
                    name,
                    b[key]["long_ms"],
                    b[key]["idle"]["hits"],
                    b[key]["idle"]["p50_ms"],
                    b[key]["idle"]["p99_ms"],
                    b[key]["beside_long_state"]["hits"],
                    b[key]["beside_long_state"]["p50_ms"],
                    b[key]["beside_long_state"]["p99_ms"],
                    b[key]["p99_ratio"],
                ]
                for name, key in (("onepass", "onepass"), ("llama-server", "llama_server"))
            ],
        ),
        "",
        f"Equal work: the same answer to {same} of {compared} questions asked of both; the largest probability "
        f"gap {report['largest_gap']:.1e}.",
        "",
        f"The run took {report['seconds']} s.",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", type=Path, required=True, help="a llama-server with /v1/systemone")
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL, help="a decision GGUF (make model-decision)")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="hits at 1, 4 and 16 clients, the rest at 1 and 4, fewer requests, a 1,000-token long state",
    )
    parser.add_argument("--threads", type=int, default=0, help="threads for both (0: onepass's own choice)")
    parser.add_argument("--slots", type=int, default=4, help="llama-server's slots (-np), each with onepass's context")
    parser.add_argument(
        "--repack", choices=["auto", "on", "off"], default="auto", help="repacked weights for both (auto: onepass's)"
    )
    parser.add_argument(
        "--batch-requests", action="store_true", help="onepass decodes waiting requests' questions together"
    )
    parser.add_argument("--gpu-layers", type=int, default=0, help="layers on the GPU for both (-1: all; a GPU build)")
    parser.add_argument(
        "--only", choices=["long-state"], help="only this case: the hits beside a long state, no priming, no curve"
    )
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "bench" / "results", help="folder of the results")
    args = parser.parse_args()
    cfg = QUICK if args.quick else FULL
    began = time.perf_counter()
    engine = Engine(args.model, n_ctx=512, contexts=1)  # tokenizer only
    states = StateMaker(engine)
    warm_up = states.make(cfg.state_tokens)
    cached = [states.make(cfg.state_tokens) for _ in range(cfg.hit_states)]
    long_state = states.make(cfg.long_tokens)
    kinds = [HIT1, HIT5, NEW]  # the hits while the cached states are the only ones; new states last
    cells = [
        (kind, c, cell_requests(kind, n, states, cfg, cached)) for kind in kinds for c, n in cfg.requests[kind].items()
    ]
    if args.only == "long-state":
        cells = []
    engine.close()
    most_clients = max(cfg.clients)
    report: dict[str, Any] = {
        "model": args.model.name.removesuffix(".gguf"),
        "date": datetime.date.today().isoformat(),
        "git": git_sha(),
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "machine": machine(),
        "quick": args.quick,
        "server": str(args.server),
        "config": {
            "state_tokens": cfg.state_tokens,
            "hit_states": cfg.hit_states,
            "clients": cfg.clients,
            "requests": cfg.requests,
            "long_tokens": cfg.long_tokens,
            "busy_states": cfg.busy_states,
            "idle_hits": cfg.idle_hits,
            "busy_hits": cfg.busy_hits,
            "cell_limit_s": cfg.cell_limit_s,
            "pairs": cfg.pairs,
            "pair_requests": cfg.pair_requests,
            "questions": {"5": FIVE_QUESTIONS, "1": ONE_QUESTION},
        },
    }
    with tempfile.TemporaryDirectory(prefix="onepass-throughput-") as snapshots:
        own_flags = ["--threads", str(args.threads), "--repack", args.repack, "--calibration", "none"]
        own_flags += ["--batch-requests", "on" if args.batch_requests else "off"]
        own_flags += ["--n-gpu-layers", str(args.gpu_layers)]
        own_flags += ["--session-cache-disk-bytes", "4G", "--session-cache-dir", snapshots]
        own_flags += ["--max-queue", str(most_clients), "--request-timeout", str(int(CLIENT_TIMEOUT_S))]
        settings = Settings(model=args.model, threads=args.threads, repack=args.repack, n_gpu_layers=args.gpu_layers)
        spec = ModelSpec.from_settings(settings)
        shown = " ".join(["--n-ctx", str(N_CTX), *own_flags]).replace(snapshots, "TMP")
        with onepass_server(args.model, *own_flags) as (url, _):
            speed = speed_settings_for(spec)  # what the server chose at its start: the same tuning cache
            with llama_server(args.server, args.model, args.slots, True, speed, gpu_layers=args.gpu_layers) as props:
                report["settings"] = {
                    "threads": speed.threads,
                    "repack": speed.repack,
                    "flash_attn": speed.flash_attn,
                    "onepass": f"`{shown}` (one context; the disk tier in a temporary folder; other settings its "
                    "defaults)",
                    "llama_server": f"{props['total_slots']} slots, {args.slots * N_CTX} tokens of context, "
                    "unified KV, prompt cache on (its host-memory cache at its default)",
                }
                report["builds"] = {"onepass": bindings.system_info(), "llama_server": props.get("build_info", "?")}
                servers = [
                    Server("onepass", url, {"model": "jev-latest"}, onepass_at_work(url)),
                    Server("llama-server", props["url"], {}, llama_server_at_work(props["url"])),
                ]
                report |= measure_all(servers, cfg, warm_up, cached, long_state, cells)
    report["seconds"] = round(time.perf_counter() - began, 1)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = f"{report['date']}-{report['git']}-throughput" + ("-batched" if args.batch_requests else "")
    stem += "-quick" if args.quick else ""
    stem += f"-only-{args.only}" if args.only else ""
    write_atomically(args.out / f"{stem}.json", json.dumps(report, indent=2) + "\n")
    write_atomically(args.out / f"{stem}.md", markdown(report))
    print(markdown(report))
    print(f"throughput bench took {report['seconds']} s; wrote {args.out / stem}.*")


def measure_all(
    servers: list[Server],
    cfg: Config,
    warm_up: str,
    cached: list[str],
    long_state: str,
    cells: list[tuple[str, int, list[Request]]],
) -> dict[str, Any]:
    """The priming, the curve's cells and the long-state case, each a phase with its own progress."""
    lock = threading.Lock()
    prefill_weight = cfg.long_tokens / cfg.state_tokens * weight(NEW, cfg) / 2
    overall = Overall(
        [2 * (1 + len(cached)) * weight(NEW, cfg)]
        + [2 * len(requests) * weight(kind, cfg) for kind, _, requests in cells]
        + [2 * cfg.pairs * 2 * cfg.pair_requests * weight(HIT1, cfg)] * bool(cells)
        + [2 * (prefill_weight + cfg.idle_hits + 2 * cfg.busy_states)]
    )

    def stepper(progress: Progress) -> Callable[[str], None]:
        def step(note: str) -> None:
            with lock:
                progress.step(note)

        return step

    # each server's first request pays for one-off work (buffers, onepass's system snapshot); then the
    # cached states are asked once, 5 questions, by one client
    primed = Progress(2 * (1 + len(cached)), "warm-up and the cached states")
    for server in servers if cells else []:  # the long-state case alone warms its own states
        with httpx.Client(timeout=CLIENT_TIMEOUT_S) as client:
            for state in [warm_up, *cached]:
                server.ask(client, state, FIVE_QUESTIONS)
                primed.step(server.name)
    overall.finished("warm-up and the cached states")

    rows: list[dict[str, Any]] = []
    found_all: list[Agreement] = []
    for index, (kind, clients, requests) in enumerate(cells):
        progress = Progress(2 * len(requests), f"{kind}, {clients} clients")
        order = servers if index % 2 == 0 else servers[::-1]
        measured = {s.name: run_cell(s, requests, clients, cfg.cell_limit_s, stepper(progress)) for s in order}
        sys.stderr.write("\n")  # below the progress line, which a cell cut short leaves unfinished
        ours, theirs = measured["onepass"], measured["llama-server"]
        found = agreements(QUESTIONS_OF[kind], ours, theirs)
        found_all += found
        mine, native = ours.summary(), theirs.summary()
        row = {
            "workload": kind,
            "clients": clients,
            "requests": len(requests),
            "onepass": mine | {"latencies_ms": [round(ours.latencies_ms[j], 1) for j in sorted(ours.latencies_ms)]},
            "llama_server": native
            | {"latencies_ms": [round(theirs.latencies_ms[j], 1) for j in sorted(theirs.latencies_ms)]},
            "ratio_requests_per_s": round(mine["requests_per_s"] / native["requests_per_s"], 3),
            "ratio_p50": round(mine["p50_ms"] / native["p50_ms"], 3),
            "agreement": agreed(found),
        }
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k not in ("onepass", "llama_server")}), flush=True)
        overall.finished(f"{kind}, {clients} clients")

    concurrent = None
    if cells:  # only with the curve, whose warm-up put the cached states in both servers
        progress = Progress(2 * cfg.pairs * 2 * cfg.pair_requests, "hits: one client, then sixteen, in pairs")
        concurrent = concurrent_hits(servers, cached, cfg, stepper(progress))
        sys.stderr.write("\n")
        overall.finished("hits: one client, then sixteen, in pairs")

    busy_cached = cached[: cfg.busy_states]
    beside: dict[str, Any] = {}
    # its total counts the most hits beside the long state; those a server leaves unasked are skipped
    progress = Progress(
        2 * (cfg.busy_states + cfg.idle_hits + cfg.busy_hits), f"hits idle and beside a {cfg.long_tokens}-token state"
    )

    def unused(count: int) -> None:
        with lock:
            progress.skip(count, "the long request answered")

    for server in servers:
        key = "onepass" if server.name == "onepass" else "llama_server"
        beside[key] = hits_beside_long_state(
            server, busy_cached, long_state, cfg, cfg.cell_limit_s, stepper(progress), unused
        )
    sys.stderr.write("\n")
    overall.finished("hits beside a long state")
    return {
        "cells": rows,
        "concurrent_hits": concurrent,
        "beside_long_state": beside,
        "equal_work": all(a.same_answer for a in found_all),
        "largest_gap": max((a.largest_gap for a in found_all), default=0.0),
    }


if __name__ == "__main__":
    main()
