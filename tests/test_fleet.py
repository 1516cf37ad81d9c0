"""A fleet: HAProxy (deploy/haproxy.cfg) in front of three onepass replicas on the tiny model.

Requests about one state reach one replica, whatever the body's encoding or the state's form;
answers equal a single server's; a hot state spreads no further than the balance factor allows;
a replica killed mid-run loses at most the requests in flight on it, and only its own states move.
"""

from __future__ import annotations

import gzip
import json
import os
import signal
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from backports.zstd import compress as zstd_compress
from starlette.testclient import TestClient

from app.fleet.processes import ServerProcess
from app.fleet.routing import affinity_key
from app.fleet.supervisor import Fleet, haproxy_problem, with_servers
from bench.fleet_sim import Ring, key_hash, slots
from tests.support.live import wait_for_disk_writes
from tests.support.settings import GPU_LAYERS
from tests.support.skip_groups import skip_if

MISSING = haproxy_problem()
needs_haproxy = skip_if(MISSING is not None, "fleet", f"no fleet test: {MISSING}")

QUESTION_SETS: list[dict[str, Any]] = [
    {"refund": {"type": "noul", "instructions": "Does the customer ask for money back?"}},
    {"team": {"type": "choice", "criteria": {"Billing": "Payments", "Technical": None}}},
    {
        "anger": {"type": "score", "criteria": ["Calm", "Annoyed", "Furious"]},
        "refund": {"type": "noul", "instructions": "Does the customer ask for money back?"},
    },
]
# HAProxy's bound (hash-balance-factor 150, three replicas of one weight): with 12 requests in flight
# at most, a replica is passed over once it holds its share of ceil(12 * 1.5) = 18 slots, 6.
BURST = 12
MOST_PER_REPLICA = max(slots(BURST - 1, 3, replica) for replica in range(3))


@dataclass(frozen=True)
class Answered:
    replica: str
    key: str
    body: dict[str, Any]


def replica_args(model: Path) -> list[str]:
    return [
        "--model",
        str(model),
        "--n-ctx",
        "8192",
        "--threads",
        "1",
        "--repack",
        "off",
        "--n-gpu-layers",
        str(GPU_LAYERS),
    ]


@pytest.fixture(scope="module")
def fleet(tiny_chat_path: Path) -> Iterator[Fleet]:
    with Fleet(3, replica_args(tiny_chat_path), timeout=120) as running:
        yield running


def request(state: Any, questions: dict[str, Any]) -> dict[str, Any]:
    return {"model": "jev-latest", "state": state, "questions": questions}


def ask(
    client: httpx.Client, url: str, body: dict[str, Any], key: str | None = None, encoding: str | None = None
) -> Answered:
    """POST through the proxy: UTF-8 JSON (not ASCII-escaped), optionally compressed, optionally keyed."""
    raw = json.dumps(body, ensure_ascii=False).encode()
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["X-Onepass-Prefix-Key"] = key
    if encoding is not None:
        raw = zstd_compress(raw) if encoding == "zstd" else gzip.compress(raw)
        headers["Content-Encoding"] = encoding
    response = client.post(url + "/v1/systemone", content=raw, headers=headers)
    assert response.status_code == 200, response.text
    return Answered(response.headers["x-onepass-replica"], response.headers["x-onepass-prefix-key"], response.json())


def same_as_one_server(reference: TestClient, body: dict[str, Any], answered: Answered) -> None:
    alone = reference.post("/v1/systemone", json=body).json()
    assert answered.body["answers"] == alone["answers"]  # exact floats
    assert answered.body["usage"] == alone["usage"] and answered.body["model"] == alone["model"]


@needs_haproxy
def test_one_state_reaches_one_replica_and_is_answered_as_one_server_answers(fleet: Fleet, client: TestClient) -> None:
    states = [f"Ticket {i}: I was charged twice in month {i} and want a refund." for i in range(9)]
    plan = [(state, questions) for _ in range(2) for questions in QUESTION_SETS for state in states]
    homes: dict[str, set[str]] = {}
    ring = Ring(3)  # bench/fleet_sim.py's copy of HAProxy 2.6's ring, which the simulation relies on
    with httpx.Client(timeout=60) as proxy:
        for n, (state, questions) in enumerate(plan):
            body = request(state, questions)
            answered = ask(proxy, fleet.url, body)
            homes.setdefault(state, set()).add(answered.replica)
            assert answered.key == affinity_key(state)
            assert answered.replica == f"replica{ring.pick(key_hash(answered.key)) + 1}"
            assert answered.body["x_cache"] == ("miss" if n < len(states) else "hit")  # the state's snapshot is there
            same_as_one_server(client, body, answered)
    assert all(len(replicas) == 1 for replicas in homes.values()), homes
    assert len(set().union(*homes.values())) > 1  # the states spread over the fleet


@needs_haproxy
def test_the_header_the_body_and_compressed_bodies_agree_on_the_replica(fleet: Fleet, client: TestClient) -> None:
    # raw UTF-8 and JSON escapes in the body; six states, so that agreeing by chance is unlikely (1 in 729)
    texts = [f'Résumé "reçu" {i} fois\nどうして? ✓' for i in range(6)]
    structured = {"order": 1234, "lines": [{"sku": "A-1", "qty": 2}], "note": "doublé"}
    reordered = {"note": "doublé", "lines": [{"qty": 2, "sku": "A-1"}], "order": 1234}
    with httpx.Client(timeout=60) as proxy:
        for text in texts:
            first = ask(proxy, fleet.url, request(text, QUESTION_SETS[0]))  # the proxy reads the key from the body
            keyed = [
                ask(proxy, fleet.url, request(text, QUESTION_SETS[1]), key=first.key),
                ask(proxy, fleet.url, request(text, QUESTION_SETS[2]), key=first.key.upper(), encoding="zstd"),
                ask(proxy, fleet.url, request(text, QUESTION_SETS[0]), key=first.key, encoding="gzip"),
            ]
            assert {answered.replica for answered in keyed} == {first.replica}
            assert [answered.body["x_cache"] for answered in keyed] == ["hit", "hit", "hit"]
        # An object state: the proxy cannot read its key from the body, the client echoes the one it got.
        echoed = ask(proxy, fleet.url, request(structured, QUESTION_SETS[0])).key
        assert echoed == affinity_key(reordered)
        bodies = [request(structured, QUESTION_SETS[1]), request(reordered, QUESTION_SETS[2])] * 2
        objects = [ask(proxy, fleet.url, body, key=echoed, encoding="zstd") for body in bodies]
    assert len({answered.replica for answered in objects}) == 1
    assert [answered.body["x_cache"] for answered in objects[1:]] == ["hit", "hit", "hit"]
    for body, answered in zip(bodies, objects, strict=True):
        same_as_one_server(client, body, answered)


@needs_haproxy
def test_a_hot_state_spreads_over_replicas_no_further_than_the_balance_factor(fleet: Fleet, client: TestClient) -> None:
    questions = {f"q{i}": {"type": "noul", "instructions": f"Is it about topic {i}?"} for i in range(10)}
    body = request("The hot ticket. " * 200, questions)  # slow enough that the burst is all in flight at once (checked)
    spans: list[tuple[float, float]] = []

    def timed(_: int) -> Answered:
        began = time.monotonic()
        answered = ask(proxy, fleet.url, body)
        spans.append((began, time.monotonic()))
        return answered

    with (
        httpx.Client(timeout=60, limits=httpx.Limits(max_connections=BURST)) as proxy,
        ThreadPoolExecutor(BURST) as pool,
    ):
        burst = list(pool.map(timed, range(BURST)))
    # the bound is about requests in flight together: every one began before any ended
    assert max(began for began, _ in spans) < min(ended for _, ended in spans), "the burst did not overlap"
    served = Counter(answered.replica for answered in burst)
    assert len(served) > 1 and max(served.values()) <= MOST_PER_REPLICA, served
    assert all(answered.body["answers"] == burst[0].body["answers"] for answered in burst)
    same_as_one_server(client, body, burst[0])


@dataclass
class Outcome:
    state: str
    began: float
    ended: float = 0.0
    replica: str | None = None  # None: the request failed
    error: str | None = None


CLIENTS = 4
AFTER_DOWN = 24  # requests each run sends after HAProxy took the victim out, at least


@needs_haproxy
def test_killing_a_replica_loses_only_requests_in_flight_on_it_and_moves_only_its_states(
    tiny_chat_path: Path, client: TestClient
) -> None:
    """What the design promises: a request in flight on a replica that dies may fail (HAProxy has
    sent the client its headers, so it cannot retry), and nothing else. Any state's request may be on
    the victim, not only its own states': the bound (hash-balance-factor) spills keys onto neighbours."""
    states = [f"Customer {i} asks about invoice {i * 7}." for i in range(12)]
    with Fleet(3, replica_args(tiny_chat_path), timeout=120) as running, httpx.Client(timeout=60) as proxy:
        assert running.haproxy is not None
        home = {state: ask(proxy, running.url, request(state, QUESTION_SETS[0])).replica for state in states}
        victim = Counter(home.values()).most_common(1)[0][0]
        outcomes: list[Outcome] = []
        lock = threading.Condition()
        stop = threading.Event()
        marks: dict[str, float] = {}

        def send(state: str) -> None:
            outcome = Outcome(state, time.monotonic())
            try:
                outcome.replica = ask(proxy, running.url, request(state, QUESTION_SETS[2])).replica
            except (httpx.HTTPError, AssertionError) as error:
                outcome.error = repr(error)
            outcome.ended = time.monotonic()
            with lock:
                outcomes.append(outcome)
                lock.notify_all()

        def keep_sending(first: int) -> None:
            for n in range(first, 20_000, CLIENTS):  # bounded; stopped long before
                if stop.is_set():
                    return
                send(states[n % len(states)])

        def count(predicate: Any) -> int:
            return sum(1 for outcome in outcomes if predicate(outcome))

        logged = len(running.haproxy.lines)
        with ThreadPoolExecutor(CLIENTS) as pool:
            sent = [pool.submit(keep_sending, n) for n in range(CLIENTS)]
            try:
                with lock:
                    assert lock.wait_for(lambda: len(outcomes) >= 32, 60)
                marks["killed"] = time.monotonic()
                os.kill(running.replicas[victim].pid, signal.SIGKILL)
                running.replicas[victim].process.wait(30)  # reaped: its sockets are closed
                marks["died"] = time.monotonic()
                # the health check takes it out; the proxy says so in its log
                running.haproxy.wait_for(rf"Server replicas/{victim} is DOWN", timeout=30, after=logged)
                marks["down"] = time.monotonic()  # at or after the moment HAProxy marked it
                with lock:
                    assert lock.wait_for(lambda: count(lambda o: o.began > marks["down"]) >= AFTER_DOWN, 60)
            finally:
                stop.set()
            for future in sent:
                future.result(timeout=120)
        after = {state: [ask(proxy, running.url, request(state, q)) for q in QUESTION_SETS[:2]] for state in states}
    failed = [outcome for outcome in outcomes if outcome.error is not None]
    # only requests in flight while the victim died failed, at most one per client
    assert all(o.began < marks["died"] and o.ended > marks["killed"] for o in failed), failed
    assert len(failed) <= CLIENTS, failed
    # nothing sent after HAProxy marked it DOWN failed or reached it, the victim's own states included
    late = [o for o in outcomes if o.began > marks["down"]]
    assert len(late) >= AFTER_DOWN and all(o.error is None and o.replica != victim for o in late), late
    assert any(home[o.state] == victim for o in late)
    for state, (one, two) in after.items():
        assert one.replica == two.replica != victim and two.body["x_cache"] == "hit"
        if home[state] != victim:
            assert one.replica == home[state]  # consistent hashing moved only the victim's states
        same_as_one_server(client, request(state, QUESTION_SETS[1]), two)


@needs_haproxy
def test_a_fleet_with_an_api_key_serves_keyed_requests_and_refuses_others(tiny_chat_path: Path) -> None:
    """HAProxy's health checks carry no key: /health must answer them, or every replica is DOWN."""
    # debug: a replica logs each health check it answers (at info, a probe answered 200 is not news)
    args = [*replica_args(tiny_chat_path), "--api-key", "fleet-secret", "--log-level", "debug"]
    body = json.dumps(request("A keyed customer asks about a refund.", QUESTION_SETS[0])).encode()
    keyed = {"Authorization": "Bearer fleet-secret", "Content-Type": "application/json"}
    with Fleet(3, args, timeout=120) as running, httpx.Client(timeout=60) as proxy:
        assert running.haproxy is not None
        # Three checks answered by every replica: HAProxy has acted on two (fall 2), so a replica whose
        # check failed would be DOWN by now.
        for replica in running.replicas.values():
            seen = 0
            for _ in range(3):
                line = replica.wait_for(r'"route": "/health", "status"', timeout=30, after=seen)
                seen = replica.lines.index(line, seen) + 1
        answers = [proxy.post(running.url + "/v1/systemone", content=body, headers=keyed) for _ in range(3)]
        refused = proxy.post(running.url + "/v1/systemone", content=body, headers={"Content-Type": "application/json"})
        wrong = proxy.post(running.url + "/v1/systemone", content=body, headers={**keyed, "Authorization": "Bearer no"})
        health = proxy.get(running.url + "/health")
        down = [line for line in running.haproxy.lines if " is DOWN" in line]
    assert [a.status_code for a in answers] == [200, 200, 200], answers[0].text
    assert [a.json()["x_cache"] for a in answers] == ["miss", "hit", "hit"]
    for response in (refused, wrong):
        assert response.status_code == 401
        assert response.json()["detail"]["error_type"] == "authentication_error"
    assert health.status_code == 200 and not down


def test_the_config_gets_one_server_line_per_replica_where_its_server_lines_stood() -> None:
    shipped = (Path(__file__).parent.parent / "deploy" / "haproxy.cfg").read_text().splitlines()
    filled = with_servers("\n".join(shipped), [("replica1", "127.0.0.1:4001"), ("replica2", "127.0.0.1:4002")])

    def is_server(line: str) -> bool:
        return line.split()[:1] == ["server"]

    assert [line for line in filled.splitlines() if is_server(line)] == [
        "    server replica1 127.0.0.1:4001",
        "    server replica2 127.0.0.1:4002",
    ]
    others = [line for line in shipped if not is_server(line)]
    assert [line for line in filled.splitlines() if not is_server(line)] == others  # the rest as shipped
    first = next(i for i, line in enumerate(shipped) if is_server(line))
    assert filled.splitlines()[first] == "    server replica1 127.0.0.1:4001"
    with pytest.raises(ValueError, match="no `server` line"):
        with_servers("backend b\n    balance roundrobin\n", [("replica1", "127.0.0.1:4001")])


def test_a_server_names_itself_by_host_and_port_unless_given_a_replica_name(tiny_chat_path: Path) -> None:
    server = ServerProcess(["--model", str(tiny_chat_path), "--repack", "off", "--threads", "1"], timeout=120)
    try:
        response = httpx.get(server.url + "/health/live", timeout=30)  # answered before the model loads
        assert response.headers["x-onepass-replica"] == f"{socket.gethostname()}:{urlsplit(server.url).port}"
    finally:
        server.stop()


def test_a_missing_haproxy_is_named_with_how_to_install_it() -> None:
    problem = haproxy_problem("haproxy-that-is-not-installed")
    assert problem is not None and "apt-get install haproxy" in problem and "2.6" in problem


@needs_haproxy
def test_a_replica_that_cannot_load_its_model_stops_the_fleet_with_its_words(tmp_path: Path) -> None:
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"not a GGUF file")
    with pytest.raises(RuntimeError, match="replica1 could not load its model"):
        Fleet(2, ["--model", str(broken), "--repack", "off"], timeout=60)
    left = [pid for pid in os.listdir("/proc") if pid.isdigit() and str(broken).encode() in _cmdline(pid)]
    assert not left  # the replica that failed was stopped, and the second never started


def _cmdline(pid: str) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:  # it exited meanwhile
        return b""


@needs_haproxy
def test_replicas_on_one_snapshot_folder_answer_a_dead_replicas_state_from_disk(
    tiny_chat_path: Path, client: TestClient, tmp_path: Path
) -> None:
    """The second line behind the routing: a state whose replica died is a disk hit on the next."""
    args = [*replica_args(tiny_chat_path), "--session-cache-dir", str(tmp_path)]
    body = request("A customer whose replica will die mid-conversation.", QUESTION_SETS[2])
    with Fleet(3, args, timeout=120) as running, httpx.Client(timeout=60) as proxy:
        assert running.haproxy is not None
        first = ask(proxy, running.url, body)
        assert first.body["x_cache"] == "miss"
        home = running.replicas[first.replica]
        wait_for_disk_writes(home.url)
        logged = len(running.haproxy.lines)
        os.kill(home.pid, signal.SIGKILL)
        running.haproxy.wait_for(rf"Server replicas/{first.replica} is DOWN", timeout=30, after=logged)
        moved = ask(proxy, running.url, body)
    assert moved.replica != first.replica and moved.body["x_cache"] == "disk"
    assert moved.body["answers"] == first.body["answers"]  # exact floats
    same_as_one_server(client, body, moved)
