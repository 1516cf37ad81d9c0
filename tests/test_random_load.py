"""A seeded random load on a real server with one context: requests arriving at random moments, long new
states, hits on states sent before (some still being prefilled), clients that give up, and batch bodies,
while a busy process runs on each core. No request gets a 5xx, and every answer, including those asked
again after their client gave up, is the answer of the same request answered alone by a server that saw
nothing else, bit for bit. On the tiny attention model and on both tiny hybrids (kev: qwen35's linear
attention; lfm2-d1: short convolutions), whose recurrent state cannot go back; and again with the setting
batch_requests on and a fit running beside the load (background work on states of its own), where an
answer decoded beside other requests' questions, as its response says, moves by float rounding only."""

from __future__ import annotations

import json
import math
import os
import random
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.answering.service import ModelService
from app.serving.registry import ModelRegistry
from app.wire.contract import SystemOneRequest
from tests.support.live import RunningServer
from tests.support.loading import load_model
from tests.support.settings import tiny_settings
from tests.support.tiny_decision import BUILDERS

SEEDS = (11, 12, 13)
MEMORIES = ("attention", "kev", "lfm2-d1")
REQUESTS = 24
WINDOW_S = 1.5  # arrivals fall in this window
ANSWER_S = 120  # a client that does not give up waits this long at most; a healthy run takes seconds
KINDS = ("new", "hit", "gives up", "batch")

QUESTIONS: list[dict[str, Any]] = [
    {"late": {"type": "noul", "instructions": "Did it come late?"}},
    {"team": {"type": "choice", "criteria": {"Billing": None, "Shipping": None, "Other": None}}},
    {"mood": {"type": "score", "instructions": "How upset is the customer?", "criteria": ["calm", "cross", "furious"]}},
    {
        "late": {"type": "noul", "instructions": "Did it come late?"},
        "open": {"type": "noul", "instructions": "Was the box open?"},
    },
]


def long_state(rng: random.Random, n: int) -> str:
    """A new state of about 1,800 characters (more than three micro-batches of the tiny models' tokens)."""
    words = ("parcel", "late", "box", "open", "refund", "driver", "door", "again", "March", "twice")
    return f"ticket {n}: " + " ".join(rng.choice(words) for _ in range(290))


@dataclass
class Planned:
    at_s: float  # when it is sent, after the load starts
    kind: str
    body: dict[str, Any]  # a request, or a batch of them
    timeout_s: float


def single(state: str, rng: random.Random) -> dict[str, Any]:
    return {"model": "jev-latest", "state": state, "questions": rng.choice(QUESTIONS)}


def plan(seed: int) -> list[Planned]:
    """REQUESTS arrivals, each of a kind drawn with the seed; a hit repeats a state sent before it."""
    rng = random.Random(seed)
    states: list[str] = ["Where is my parcel?"]
    planned: list[Planned] = []
    for n in range(REQUESTS):
        kind = rng.choice(KINDS)
        if kind in ("new", "gives up"):
            states.append(long_state(rng, seed * 1000 + n))
            body = single(states[-1], rng)
        elif kind == "hit":
            body = single(rng.choice(states), rng)
        else:
            states.append(long_state(rng, seed * 1000 + n))
            body = {"requests": [single(states[-1], rng), single(rng.choice(states), rng)]}
        timeout = rng.uniform(0.02, 0.4) if kind == "gives up" else ANSWER_S
        planned.append(Planned(rng.uniform(0, WINDOW_S), kind, body, timeout))
    return planned


@contextmanager
def busy_cores() -> Iterator[None]:
    """A process spinning on each core for as long as the block runs."""
    spinning = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"], stdin=subprocess.DEVNULL)
        for _ in range(os.cpu_count() or 1)
    ]
    try:
        yield
    finally:
        for process in spinning:
            process.kill()
        for process in spinning:
            process.wait(timeout=30)


def answers_alone(service: ModelService, body: dict[str, Any]) -> dict[str, Any]:
    return dict(json.loads(service.answer(SystemOneRequest.model_validate(body)).to_json())["answers"])


def send(url: str, planned: list[Planned]) -> list[httpx.Response | None]:
    """Every planned request from a client of its own, at its moment; None where its client gave up."""
    got: list[httpx.Response | None] = [None] * len(planned)
    start = threading.Event()

    def client(i: int) -> None:
        assert start.wait(ANSWER_S)
        threading.Event().wait(planned[i].at_s)  # its arrival moment: the load, not a synchronisation
        try:
            got[i] = httpx.post(url + "/v1/systemone", json=planned[i].body, timeout=planned[i].timeout_s)
        except httpx.TimeoutException:
            assert planned[i].kind == "gives up"

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(len(planned))]
    for thread in threads:
        thread.start()
    start.set()
    for thread in threads:
        thread.join(ANSWER_S + WINDOW_S + 30)
        assert not thread.is_alive()
    return got


@pytest.fixture(scope="module")
def model_paths(tiny_chat_path: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("random-load")
    return {
        "attention": tiny_chat_path,
        **{kind: BUILDERS[kind](folder / f"{kind}.gguf") for kind in ("kev", "lfm2-d1")},
    }


def fit_examples(n: int) -> list[dict[str, Any]]:
    """Labelled examples for a fit of a question the load never asks (a fit changes its own question's
    answers only): background work on new states, beside the load."""
    question = {"fitted": {"type": "noul", "instructions": "Is this an example for the fit?"}}
    return [
        {"state": f"example {i}: " + "the parcel was fine and came on time. " * 8, "questions": question}
        | {"answers": {"fitted": i % 2 == 0}}
        for i in range(n)
    ]


def assert_same_answers(got: Any, want: Any, rounding: bool) -> None:
    """The same answers bit for bit; with `rounding` (decoded beside other requests' questions, as the
    response says), numbers may move by float rounding only: other rows change the order ggml sums in."""
    if not rounding:
        assert got == want
    elif isinstance(want, float):
        assert isinstance(got, float) and math.isclose(got, want, rel_tol=1e-3, abs_tol=1e-6), (got, want)
    elif isinstance(want, dict):
        assert isinstance(got, dict) and got.keys() == want.keys()
        for name in want:
            assert_same_answers(got[name], want[name], rounding)
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want)
        for item, wanted in zip(got, want, strict=True):
            assert_same_answers(item, wanted, rounding)
    else:
        assert got == want


CASES = [
    *((memory, seed, "alone") for memory in MEMORIES for seed in SEEDS),
    # batch_requests on (the hybrids decode each request on its own still) and a fit running beside
    *((memory, seed, "batch_requests and a fit") for memory in MEMORIES for seed in SEEDS[:2]),
]


@pytest.mark.parametrize(("memory", "seed", "beside"), CASES)
def test_a_random_load_gets_no_5xx_and_the_answers_of_requests_answered_alone(
    model_paths: dict[str, Path], memory: str, seed: int, beside: str, tmp_path: Path
) -> None:
    shared = beside != "alone"
    settings = tiny_settings(
        model_paths[memory],
        n_ctx=4096,
        threads=2,
        contexts=1,
        request_timeout=ANSWER_S,
        batch_requests=shared,
        calibration_dir=tmp_path,
    )
    planned = plan(seed)
    bodies = [body for p in planned for body in (p.body["requests"] if p.kind == "batch" else [p.body])]
    alone_service = load_model(settings)
    try:
        alone = [answers_alone(alone_service, body) for body in bodies]
    finally:
        alone_service.close()
    want = {json.dumps(body, sort_keys=True): answers for body, answers in zip(bodies, alone, strict=True)}

    service = load_model(settings)
    running = RunningServer(settings, ModelRegistry.serving(service))
    try:
        if shared:
            fitting = {"model": "jev-latest", "examples": fit_examples(16)}
            job = httpx.post(running.base_url + "/v1/calibrations", json=fitting, timeout=ANSWER_S)
            assert job.status_code == 202, job.text
        with busy_cores():
            got = send(running.base_url, planned)
        for p, response in zip(planned, got, strict=True):
            if response is None:
                continue  # its client gave up
            assert response.status_code < 500, f"{p.kind}: {response.status_code} {response.text}"
            assert response.status_code == 200, f"{p.kind}: {response.status_code} {response.text}"
            items = p.body["requests"] if p.kind == "batch" else [p.body]
            results = response.json()["results"] if p.kind == "batch" else [response.json()]
            for body, result in zip(items, results, strict=True):
                rounding = "other_requests" in result["x_depends_on"]
                assert shared or not rounding
                assert_same_answers(result["answers"], want[json.dumps(body, sort_keys=True)], rounding)
        given_up = [p for p, response in zip(planned, got, strict=True) if response is None]
        for p in given_up:  # what their prefills left (a partial, a handed-over snapshot) changes no answer
            again = httpx.post(running.base_url + "/v1/systemone", json=p.body, timeout=ANSWER_S)
            assert again.status_code == 200, again.text
            assert again.json()["answers"] == want[json.dumps(p.body, sort_keys=True)]
    finally:
        running.stop()
        service.close()
