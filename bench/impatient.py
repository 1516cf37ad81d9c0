"""make bench-impatient: clients that give up and retry against patient ones, on one onepass server (issue 58).

    python -m bench.impatient [--quick] [--config TOML] [--out DIR]

One server in its own process on a loopback port, serving the config (models/onepass.toml: the default
model, its defaults: one context), its snapshot disk tier off and its fits in a temporary folder; this
process is only the client (it loads the model's tokenizer to build states of a given token length).
Every state is new to the server unless a phase says it repeats one. Three phases:

1. The issue's stall: an ordinary request (one short state, one question) asked on the idle server, then
   four requests about new long states with many questions each, sent at once by clients that give up
   after half a second, then the ordinary request again: its latency against the idle median.
2. Impatient against patient clients: patient clients (no client timeout; the server's own
   request_timeout bounds them) each ask about new states of a mix of sizes, alone (the baseline), then
   with as many impatient clients asking the same mix through the official SDK (typesafe-sdk) with its
   default timeout and retries, so the larger states outlast its timeout. Wasted work: the seconds the
   model's contexts were lent to interactive work (onepass_context_busy_seconds_total, over the run)
   less the engine time the answered requests report (x_timing_ms: prefill, restore, decode, calibrate).
3. An interactive request during a fit: a fitting job (POST /v1/calibrations, labelled examples on new
   states) runs while a client asks a cached state one question and a new short state one question, in
   turn; the same requests on the idle server before the job are the reference.

Between phases the bench waits until /metrics shows no request in flight or queued, so each phase's
counters hold its own work. Every loop is bounded by a count and a deadline.

Writes bench/results/<date>-<sha>-impatient.{json,md} (--quick: -impatient-quick).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import statistics
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
import httpx2
import typesafe_sdk
from prometheus_client.parser import text_string_to_metric_families
from pydantic import BaseModel, ConfigDict
from typesafe_sdk import RetryPolicy, TypeSafeAPIError, TypeSafeClient, TypeSafeError
from typesafe_sdk.constants import DEFAULT_TIMEOUT

from app.engine.engine import Engine
from app.fleet.processes import READY, ServerProcess
from app.paths import REPO_ROOT
from app.serving.known_models import default_model_path
from bench.output import RESULTS, Progress, git_sha, machine, table, write_atomically
from bench.workloads import QUESTIONS, SENTENCES, StateMaker

PATIENT_TIMEOUT_S = 330.0  # past the server's default request_timeout (300 s): the server, not the client, ends it
SETTLE_TIMEOUT_S = 330.0  # the longest a request may still run after its client left, on a server without the fix
ENGINE_PARTS = ("prefill", "restore", "decode", "calibrate")
ORDINARY_QUESTION = {"refund": QUESTIONS[0]}


@dataclass(frozen=True)
class Config:
    idle_repeats: int  # the ordinary request on the idle server, after its first (cold) ask
    flood_requests: int
    flood_tokens: int
    flood_questions: int
    flood_timeout_s: float
    patient_clients: int
    impatient_clients: int
    requests_per_client: int
    mix_tokens: tuple[int, ...]  # client i's request j asks about a new state of mix[(i + j) % len(mix)] tokens
    mix_questions: int
    run_deadline_s: float  # no client starts a request after this, in each run of phase 2
    fit_examples: int
    idle_pairs: int  # (hit, new state) pairs on the idle server
    fit_pairs: int  # at most, while the fit runs
    fit_deadline_s: float
    short_tokens: int


FULL = Config(5, 4, 3000, 20, 0.5, 4, 4, 3, (250, 600, 1200, 2000), 3, 240, 48, 8, 40, 180, 80)
QUICK = Config(3, 4, 1000, 20, 0.5, 2, 2, 2, (250, 1500), 3, 150, 16, 3, 12, 150, 80)


class Answered(BaseModel):
    """What the bench reads of an answer the SDK parsed: its engine time."""

    model_config = ConfigDict(extra="ignore")
    x_timing_ms: dict[str, float]


class CountingTransport(httpx2.HTTPTransport):
    """The SDK's own transport, counting its attempts (a retry is one more) and those that timed out."""

    def __init__(self) -> None:
        super().__init__()
        self.attempts = 0
        self.timed_out = 0

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        self.attempts += 1
        try:
            return super().handle_request(request)
        except httpx2.TimeoutException:
            self.timed_out += 1
            raise


def sdk_settings() -> dict[str, Any]:
    """The SDK's defaults as the installed package defines them (typesafe_sdk/constants.py DEFAULT_TIMEOUT,
    typesafe_sdk/_core/retry.py RetryPolicy), so the report stays true to the version it ran."""
    policy = RetryPolicy()
    return {
        "package": f"typesafe-sdk {typesafe_sdk.__version__}",
        "timeout_s": DEFAULT_TIMEOUT,
        "max_retries": policy.max_retries,
        "backoff_initial_s": policy.backoff_initial,
        "backoff_max_s": policy.backoff_max,
        "backoff_jitter": policy.backoff_jitter,
        "retry_budget_s": policy.timeout,
        "read_from": "typesafe_sdk/constants.py (DEFAULT_TIMEOUT: each HTTP operation, the read included), "
        "typesafe_sdk/_core/retry.py (RetryPolicy: retries timeouts, connection errors, 408, 429 and 5xx; "
        "backoff doubled from backoff_initial up to backoff_max, less up to backoff_jitter of it; no retry "
        "whose delay would reach the retry budget; Retry-After honoured)",
    }


def cpu() -> dict[str, Any]:
    """What `grep -m1 'model name' /proc/cpuinfo` says, and the cores."""
    lines = Path("/proc/cpuinfo").read_text().splitlines()
    name = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), "unknown")
    return {"model_name": name, "cores": os.cpu_count(), "load_average_at_start": os.getloadavg()[0]}


def worktree_changes() -> list[str]:
    """Files the working tree changes against the commit: the server runs them, not the commit alone."""
    run = subprocess.run(["git", "status", "--porcelain"], cwd=REPO_ROOT, capture_output=True, text=True)
    return [line[3:] for line in run.stdout.splitlines() if line[3:].startswith("app/")]


@contextmanager
def config_server(config: Path, calibrations: Path) -> Iterator[str]:
    """A server on `config` as shipped, its disk tier off (a new state must be new) and its fits in `calibrations`."""
    args = ["--config", str(config), "--session-cache-disk-bytes", "0", "--calibration-dir", str(calibrations)]
    server = ServerProcess(args)
    try:
        server.wait_for(READY)
        yield server.url
    finally:
        server.stop()


def metrics(url: str) -> dict[tuple[str, str], float]:
    """(name, lane) -> value, summed over models, for the samples the bench reads."""
    found: dict[tuple[str, str], float] = {}
    text = httpx.get(url + "/metrics", timeout=30).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = (sample.name, sample.labels.get("lane", ""))
            found[key] = found.get(key, 0.0) + sample.value
    return found


def busy_s(url: str, lane: str) -> float:
    return metrics(url).get(("onepass_context_busy_seconds_total", lane), 0.0)


def settle(url: str) -> None:
    """Until no request is in flight or queued: what a phase started has ended (with the fix, a request
    leaves in_flight only when its work has stopped)."""
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    while time.monotonic() < deadline:
        found = metrics(url)
        if found.get(("onepass_in_flight", ""), 0.0) == 0 and found.get(("onepass_queue_depth", ""), 0.0) == 0:
            return
        time.sleep(0.2)  # polls another process's gauge, bounded by the deadline
    raise TimeoutError(f"requests still in flight {SETTLE_TIMEOUT_S:g} s after the phase ended")


def engine_s(body: dict[str, Any]) -> float:
    timing = body["x_timing_ms"]
    return sum(float(timing[part]) for part in ENGINE_PARTS) / 1000


def percentile(samples: list[float], q: float) -> float | None:
    """Nearest rank: with few samples the p99 is the largest. None without samples (JSON has no NaN)."""
    ordered = sorted(samples)
    return round(ordered[max(0, math.ceil(q * len(ordered)) - 1)], 1) if ordered else None


def spread(samples_ms: list[float]) -> dict[str, Any]:
    return {
        "n": len(samples_ms),
        "p50_ms": percentile(samples_ms, 0.5),
        "p99_ms": percentile(samples_ms, 0.99),
        "samples_ms": [round(ms, 1) for ms in samples_ms],
    }


def body_of(state: str, questions: dict[str, Any]) -> dict[str, Any]:
    return {"model": "jev-latest", "state": state, "questions": questions}


def timed(client: httpx.Client, url: str, body: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    """(ms from the client, the answer); an error status raises."""
    began = time.perf_counter()
    response = client.post(url + "/v1/systemone", json=body)
    elapsed = (time.perf_counter() - began) * 1000
    response.raise_for_status()
    answer: dict[str, Any] = response.json()
    return elapsed, answer


def many_questions(count: int) -> dict[str, Any]:
    """`count` distinct questions: the bench's ten, then each again asked of another part of the message."""
    asked = {}
    for k in range(count):
        question = dict(QUESTIONS[k % len(QUESTIONS)])
        if k >= len(QUESTIONS):
            question["instructions"] += f" Judge by part {k // len(QUESTIONS) + 1} of the message."
        asked[f"q{k}"] = question
    return asked


def stall(url: str, states: StateMaker, cfg: Config) -> dict[str, Any]:
    """Phase 1: the ordinary request idle, the flood of abandoned long requests, the ordinary request after."""
    progress = Progress(1 + cfg.idle_repeats + cfg.flood_requests + 1, "1/3 the stall")
    ordinary = body_of(states.make(cfg.short_tokens), ORDINARY_QUESTION)
    with httpx.Client(timeout=PATIENT_TIMEOUT_S) as client:
        cold_ms, _ = timed(client, url, ordinary)
        progress.step("ordinary request, cold")
        idle = []
        for _ in range(cfg.idle_repeats):
            idle.append(timed(client, url, ordinary)[0])
            progress.step("ordinary request, idle")
        settle(url)
        busy_before = busy_s(url, "interactive")
        flood = [
            body_of(states.make(cfg.flood_tokens), many_questions(cfg.flood_questions))
            for _ in range(cfg.flood_requests)
        ]

        def give_up(body: dict[str, Any]) -> str:
            with httpx.Client(timeout=cfg.flood_timeout_s) as impatient:
                try:
                    impatient.post(url + "/v1/systemone", json=body)
                except httpx.TimeoutException:
                    return "timed out"
                return "answered"

        with ThreadPoolExecutor(len(flood)) as pool:
            outcomes = []
            for outcome in pool.map(give_up, flood):
                outcomes.append(outcome)
                progress.step(f"long request {outcome}")
        after_ms, after = timed(client, url, ordinary)
        progress.step("ordinary request after the flood")
    settle(url)
    busy = busy_s(url, "interactive") - busy_before
    idle_median = statistics.median(idle)  # idle_repeats >= 1
    return {
        "ordinary": f"one state of ~{cfg.short_tokens} tokens, one question, asked again (a hit after the first)",
        "cold_ms": round(cold_ms, 1),
        "idle": spread(idle),
        "flood": {
            "requests": cfg.flood_requests,
            "state_tokens": cfg.flood_tokens,
            "questions": cfg.flood_questions,
            "client_timeout_s": cfg.flood_timeout_s,
            "outcomes": outcomes,
        },
        "after_ms": round(after_ms, 1),
        "after_cache": after.get("x_cache"),
        "factor": round(after_ms / idle_median, 2),
        "busy_s": round(busy, 2),
        "wasted_s": round(busy - engine_s(after), 2),
    }


@dataclass
class Outcome:
    client: str  # "patient" or "impatient"
    state_tokens: int
    ms: float  # from the client; for the SDK, the whole call, its retries and backoff included
    answered: bool
    engine_s: float = 0.0  # what the answer reports (x_timing_ms)
    attempts: int = 1
    timed_out_attempts: int = 0
    error: str = ""


Plan = list[tuple[int, str]]  # (state tokens, state), in the order a client asks them
Step = Callable[[str], None]


def patient_client(url: str, plan: Plan, questions: dict[str, Any], deadline: float, step: Step) -> list[Outcome]:
    done = []
    with httpx.Client(timeout=PATIENT_TIMEOUT_S) as client:
        for tokens, state in plan:
            if time.monotonic() > deadline:
                break
            began = time.perf_counter()
            try:
                ms, answer = timed(client, url, body_of(state, questions))
                done.append(Outcome("patient", tokens, ms, True, engine_s(answer)))
            except httpx.HTTPError as error:
                done.append(Outcome("patient", tokens, (time.perf_counter() - began) * 1000, False, error=repr(error)))
            step("patient " + ("answered" if done[-1].answered else "failed"))
    return done


def impatient_client(url: str, plan: Plan, questions: dict[str, Any], deadline: float, step: Step) -> list[Outcome]:
    """Each request one call of the SDK with its defaults: its timeout, its retries, its backoff."""
    done = []
    transport = CountingTransport()
    with TypeSafeClient(api_key="bench", base_url=url, transport=transport) as sdk:
        for tokens, state in plan:
            if time.monotonic() > deadline:
                break
            attempts, timed_out = transport.attempts, transport.timed_out
            began = time.perf_counter()
            outcome = Outcome("impatient", tokens, 0.0, False)
            try:
                answer = sdk.system_one(state=state, questions=questions, response_model=Answered)
                outcome.answered, outcome.engine_s = True, engine_s(answer.model_dump())
            except TypeSafeAPIError as error:  # an error status, after the retries it allows
                outcome.error = f"{type(error).__name__}: {error}"
            except TypeSafeError as error:  # timed out or unreachable, after its retries
                outcome.error = type(error).__name__
            outcome.ms = (time.perf_counter() - began) * 1000
            outcome.attempts = transport.attempts - attempts
            outcome.timed_out_attempts = transport.timed_out - timed_out
            done.append(outcome)
            step("impatient " + ("answered" if outcome.answered else "gave up"))
    return done


def plans(states: StateMaker, cfg: Config, clients: int) -> list[Plan]:
    mix = cfg.mix_tokens
    sizes = [[mix[(i + j) % len(mix)] for j in range(cfg.requests_per_client)] for i in range(clients)]
    return [[(tokens, states.make(tokens)) for tokens in client] for client in sizes]


def crowd(url: str, patient: list[Plan], impatient: list[Plan], cfg: Config, label: str) -> dict[str, Any]:
    """One run of phase 2: every client at once, each with its own connection."""
    questions = {f"q{k}": question for k, question in enumerate(QUESTIONS[: cfg.mix_questions])}
    planned = sum(len(plan) for plan in patient + impatient)
    progress = Progress(planned, label)
    lock = threading.Lock()  # clients step from their threads

    def step(note: str) -> None:
        with lock:
            progress.step(note)

    settle(url)
    before = busy_s(url, "interactive")
    deadline = time.monotonic() + cfg.run_deadline_s
    began = time.perf_counter()
    with ThreadPoolExecutor(len(patient) + len(impatient)) as pool:
        futures = [pool.submit(patient_client, url, plan, questions, deadline, step) for plan in patient]
        futures += [pool.submit(impatient_client, url, plan, questions, deadline, step) for plan in impatient]
        outcomes = [outcome for future in futures for outcome in future.result()]
    seconds = time.perf_counter() - began
    if progress.done < planned:
        print(f"\n{label}: {planned - progress.done} requests not started by the {cfg.run_deadline_s:g} s deadline")
    settle(url)
    busy = busy_s(url, "interactive") - before
    answered_engine = sum(outcome.engine_s for outcome in outcomes if outcome.answered)
    waiting = [o for o in outcomes if o.client == "patient"]
    giving_up = [o for o in outcomes if o.client == "impatient"]
    return {
        "seconds": round(seconds, 1),
        "patient": {
            "clients": len(patient),
            "planned": sum(len(plan) for plan in patient),
            "answered": sum(o.answered for o in waiting),
            "failed": sum(not o.answered for o in waiting),
            **spread([o.ms for o in waiting if o.answered]),
        },
        "impatient": {
            "clients": len(impatient),
            "planned": sum(len(plan) for plan in impatient),
            "calls": len(giving_up),
            "completed": sum(o.answered for o in giving_up),
            "gave_up": sum(not o.answered for o in giving_up),
            "attempts": sum(o.attempts for o in giving_up),
            "timed_out_attempts": sum(o.timed_out_attempts for o in giving_up),
            "completed_ms": spread([o.ms for o in giving_up if o.answered]),
        },
        "busy_s": round(busy, 2),
        "answered_engine_s": round(answered_engine, 2),
        "wasted_s": round(busy - answered_engine, 2),
        "wasted_share": round((busy - answered_engine) / busy, 3) if busy > 0 else None,
        "outcomes": [asdict(outcome) for outcome in outcomes],
    }


def fit_examples(states: StateMaker, count: int) -> list[dict[str, Any]]:
    """Labelled examples on new states: every other one asks for money back."""
    examples = []
    for i in range(count):
        states.count += 1
        tag = f"fit{states.count}"
        asks = SENTENCES[2] if i % 2 == 0 else SENTENCES[3].format(n=tag)
        state = f"Ticket {tag}: {SENTENCES[i % 2].format(n=tag)} {asks}"
        examples.append({"state": state, "questions": ORDINARY_QUESTION, "answers": {"refund": i % 2 == 0}})
    return examples


def during_fit(url: str, states: StateMaker, cfg: Config) -> dict[str, Any]:
    """Phase 3: a cached state and a new short state, one question each, idle and while a fit runs."""
    progress = Progress(2 * cfg.idle_pairs + cfg.fit_examples, "3/3 during a fit")
    cached = body_of(states.make(cfg.short_tokens), ORDINARY_QUESTION)
    found: dict[str, dict[str, list[float]]] = {"idle": {"hit": [], "new": []}, "during_fit": {"hit": [], "new": []}}

    def pair(client: httpx.Client, into: dict[str, list[float]]) -> None:
        into["hit"].append(timed(client, url, cached)[0])
        into["new"].append(timed(client, url, body_of(states.make(cfg.short_tokens), ORDINARY_QUESTION))[0])

    with httpx.Client(timeout=PATIENT_TIMEOUT_S) as client:
        timed(client, url, cached)  # a hit from here on
        for _ in range(cfg.idle_pairs):
            pair(client, found["idle"])
            progress.step("idle hit")
            progress.step("idle new state")
        settle(url)
        background, interactive = busy_s(url, "background"), busy_s(url, "interactive")
        examples = fit_examples(states, cfg.fit_examples)
        response = client.post(url + "/v1/calibrations", json={"model": "jev-latest", "examples": examples})
        response.raise_for_status()
        job: dict[str, Any] = response.json()
        began = time.perf_counter()
        deadline = time.monotonic() + cfg.fit_deadline_s
        shown = 0
        while job["status"] == "running" and time.monotonic() < deadline:
            if len(found["during_fit"]["hit"]) < cfg.fit_pairs:
                pair(client, found["during_fit"])
            else:
                time.sleep(0.5)  # enough asked: polls the job until it ends, bounded by the deadline
            job = client.get(f"{url}/v1/calibrations/jobs/{job['id']}").json()
            for _ in range(shown, job["done"]):
                progress.step(f"fit {job['done']}/{job['total']}, {len(found['during_fit']['hit'])} pairs asked")
            shown = max(shown, job["done"])
        fit_seconds = time.perf_counter() - began
    if job["status"] == "running":
        print(f"\nthe fit still ran at the {cfg.fit_deadline_s:g} s deadline")
    settle(url)
    return {
        "asked": f"a cached state of ~{cfg.short_tokens} tokens and a new one of ~{cfg.short_tokens}, "
        "one question each, in turn",
        "fit": {
            "examples": cfg.fit_examples,
            "status": job["status"],
            "seconds": round(fit_seconds, 1),
            "fits": len(job.get("fits") or []),
            "error": job.get("error"),
        },
        "idle": {kind: spread(samples) for kind, samples in found["idle"].items()},
        "during_fit": {kind: spread(samples) for kind, samples in found["during_fit"].items()},
        "background_busy_s": round(busy_s(url, "background") - background, 2),
        "interactive_busy_s": round(busy_s(url, "interactive") - interactive, 2),
    }


def ms(value: float) -> str:
    return f"{value:,.0f}"


def markdown(report: dict[str, Any]) -> str:
    s, sdk, one = report["settings"], report["sdk"], report["stall"]
    runs, fit = report["crowd"], report["fit"]
    alone, mixed = runs["patient_alone"], runs["with_impatient"]
    changed = report["worktree_app_changes"]
    lines = [
        f"# Clients that give up and retry: {report['model']} ({report['date']}, {report['git']}, "
        f"{report['cpu']['model_name']}, {report['cpu']['cores']} cores)",
        "",
        f"One onepass server on `{s['config']}` ({s['server']}); this process is only the client. "
        f"Latencies in ms from the client; p99 is the nearest rank (the largest of fewer than 100). "
        f"Machine: {report['machine']}; its 1-minute load average {report['cpu']['load_average_at_start']:.1f} "
        f"at the start, {report['cpu']['load_average_at_end']:.1f} at the end. The whole run took "
        f"{report['seconds']} s" + (" (--quick)." if report["quick"] else "."),
        *(
            ["", f"The server ran the commit plus {len(changed)} changed files under app/: {', '.join(changed)}."]
            if changed
            else []
        ),
        "",
        "## 1. The stall (issue 58's reproduction)",
        "",
        f"The ordinary request: {one['ordinary']}. Then {one['flood']['requests']} requests about new states of "
        f"~{one['flood']['state_tokens']:,} tokens with {one['flood']['questions']} questions each, sent at once "
        f"with a {one['flood']['client_timeout_s']} s client timeout ({', '.join(one['flood']['outcomes'])}), "
        "then the ordinary request again.",
        "",
        *table(
            ["cold", "idle (median)", "after the abandoned requests", "factor", "interactive busy s", "wasted s"],
            [
                [
                    ms(one["cold_ms"]),
                    ms(one["idle"]["p50_ms"]),
                    ms(one["after_ms"]) + f" ({one['after_cache']})",
                    f"{one['factor']}x",
                    one["busy_s"],
                    one["wasted_s"],
                ]
            ],
        ),
        "",
        "## 2. Impatient clients (the SDK's defaults) against patient ones",
        "",
        f"Impatient clients: {sdk['package']} with its defaults, a {sdk['timeout_s']:g} s timeout, "
        f"{sdk['max_retries']} retries, backoff from {sdk['backoff_initial_s']:g} s doubling to "
        f"{sdk['backoff_max_s']:g} s less up to {sdk['backoff_jitter']:.0%} jitter, a {sdk['retry_budget_s']:g} s "
        f"budget for a call (read from {sdk['read_from']}). Patient clients: no client timeout. Each client asks "
        f"{s['requests_per_client']} new states in turn, of {', '.join(f'{t:,}' for t in s['mix_tokens'])} tokens "
        f"(client i's request j: size (i + j) mod {len(s['mix_tokens'])}), {s['mix_questions']} questions each.",
        "",
        *table(
            [
                "run",
                "seconds",
                "patient answered",
                "patient p50",
                "patient p99",
                "impatient completed / gave up",
                "attempts (timed out)",
                "interactive busy s",
                "engine s of answers",
                "wasted s",
                "wasted share",
            ],
            [
                [
                    name,
                    run["seconds"],
                    f"{run['patient']['answered']}/{run['patient']['planned']}",
                    ms(run["patient"]["p50_ms"]),
                    ms(run["patient"]["p99_ms"]),
                    f"{run['impatient']['completed']} / {run['impatient']['gave_up']}"
                    if run["impatient"]["clients"]
                    else "-",
                    f"{run['impatient']['attempts']} ({run['impatient']['timed_out_attempts']})"
                    if run["impatient"]["clients"]
                    else "-",
                    run["busy_s"],
                    run["answered_engine_s"],
                    run["wasted_s"],
                    f"{run['wasted_share']:.1%}" if run["wasted_share"] is not None else "-",
                ]
                for name, run in (
                    (f"{alone['patient']['clients']} patient alone", alone),
                    (f"{mixed['patient']['clients']} patient + {mixed['impatient']['clients']} impatient", mixed),
                )
            ],
        ),
        "",
        f"Patient p50 with the impatient clients / alone: {runs['p50_factor']}x; p99: {runs['p99_factor']}x. "
        "Wasted: busy seconds (onepass_context_busy_seconds_total, interactive) less the answered requests' "
        "x_timing_ms prefill + restore + decode + calibrate; alone it is the overhead between a context's loan "
        "and its engine work.",
        "",
        "## 3. An interactive request while a fit runs",
        "",
        f"A fitting job of {fit['fit']['examples']} labelled examples on new states (POST /v1/calibrations): "
        f"{fit['fit']['status']} in {fit['fit']['seconds']} s, {fit['fit']['fits']} fit(s) stored; "
        f"background busy {fit['background_busy_s']} s, interactive busy {fit['interactive_busy_s']} s over it. "
        f"Asked: {fit['asked']}.",
        "",
        *table(
            ["request", "idle p50", "idle p99", "during the fit p50", "p99", "n (idle / fit)", "p50 factor"],
            [
                [
                    kind,
                    ms(fit["idle"][kind]["p50_ms"]),
                    ms(fit["idle"][kind]["p99_ms"]),
                    ms(fit["during_fit"][kind]["p50_ms"]),
                    ms(fit["during_fit"][kind]["p99_ms"]),
                    f"{fit['idle'][kind]['n']} / {fit['during_fit'][kind]['n']}",
                    f"{fit['during_fit'][kind]['p50_ms'] / fit['idle'][kind]['p50_ms']:.2f}x",
                ]
                for kind in ("hit", "new")
            ],
        ),
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer clients and requests, smaller states")
    parser.add_argument(
        "--config", type=Path, default=REPO_ROOT / "models" / "onepass.toml", help="the server's config"
    )
    parser.add_argument("--model", type=Path, default=default_model_path(), help="its default model (the tokenizer)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder of the results")
    args = parser.parse_args()
    cfg = QUICK if args.quick else FULL
    began = time.perf_counter()
    engine = Engine(args.model, n_ctx=512, contexts=1)  # tokenizer only
    states = StateMaker(engine)
    report: dict[str, Any] = {
        "model": args.model.name.removesuffix(".gguf"),
        "date": datetime.date.today().isoformat(),
        "git": git_sha(),
        "worktree_app_changes": worktree_changes(),
        "cpu": cpu(),
        "machine": machine(),
        "quick": args.quick,
        "settings": {
            **asdict(cfg),
            "config": str(args.config.relative_to(REPO_ROOT) if args.config.is_relative_to(REPO_ROOT) else args.config),
            "server": "its defaults, the snapshot disk tier off, fits in a temporary folder",
        },
        "sdk": sdk_settings(),
    }
    patient = [plans(states, cfg, cfg.patient_clients) for _ in range(2)]
    impatient = plans(states, cfg, cfg.impatient_clients)
    with (
        tempfile.TemporaryDirectory(prefix="onepass-impatient-") as calibrations,
        config_server(args.config, Path(calibrations)) as url,
    ):
        models = httpx.get(url + "/v1/models", timeout=30).json()["models"]
        served = next(m for m in models if m["x_loaded"])
        report["settings"]["served"] = {k: v for k, v in served.items() if k not in ("x_path", "description")}
        report["stall"] = stall(url, states, cfg)
        print(json.dumps({k: v for k, v in report["stall"].items() if k != "idle"}), flush=True)
        alone = crowd(url, patient[0], [], cfg, "2/3 patient clients alone")
        mixed = crowd(url, patient[1], impatient, cfg, "2/3 patient and impatient clients")
        report["crowd"] = {
            "patient_alone": alone,
            "with_impatient": mixed,
            "p50_factor": round(mixed["patient"]["p50_ms"] / alone["patient"]["p50_ms"], 2),
            "p99_factor": round(mixed["patient"]["p99_ms"] / alone["patient"]["p99_ms"], 2),
        }
        for name in ("patient_alone", "with_impatient"):
            shown = {k: v for k, v in report["crowd"][name].items() if k != "outcomes"}
            print(json.dumps({name: shown}), flush=True)
        report["fit"] = during_fit(url, states, cfg)
        print(json.dumps(report["fit"]), flush=True)
    engine.close()
    report["seconds"] = round(time.perf_counter() - began, 1)
    report["cpu"]["load_average_at_end"] = os.getloadavg()[0]  # other work on the machine shows here
    stem = f"{report['date']}-{report['git']}-impatient" + ("-quick" if args.quick else "")
    write_atomically(args.out / f"{stem}.json", json.dumps(report, indent=2) + "\n")
    write_atomically(args.out / f"{stem}.md", markdown(report))
    print(markdown(report))
    print(f"impatient-clients bench took {report['seconds']} s; wrote {args.out / stem}.*")


if __name__ == "__main__":
    main()
