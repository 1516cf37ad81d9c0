"""The disk tier in a server on the tiny model: a restart answers from disk, bit for bit as a
RAM hit and a cold miss; kill -9 in the middle of writes leaves only whole files; two
servers share one folder under concurrent load."""

from __future__ import annotations

import json
import signal
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.answering.service import ModelService
from app.engine.disk_tier import SUFFIX
from app.engine.ram_tier import CacheKey
from app.engine.snapshot_file import read_snapshot
from app.fleet.processes import READY, ServerProcess
from app.wire.contract import SystemOneRequest
from tests.support.live import wait_for_disk_writes
from tests.support.llama_calls import LlamaCalls
from tests.support.loading import load_model
from tests.support.settings import tiny_settings

QUESTIONS: dict[str, Any] = {
    "angry": {"type": "noul", "instructions": "Is the customer angry?"},
    "team": {"type": "choice", "instructions": "Which team?", "criteria": {"Billing": "money", "Tech": None}},
    "urgency": {"type": "score", "instructions": "How urgent?", "criteria": ["later", "soon", "now"]},
}
TIMEOUT_S = 120.0


def body(state: str) -> dict[str, Any]:
    return {"model": "tiny-chat", "state": state, "questions": QUESTIONS}


def states(n: int, words: int = 400) -> list[str]:
    return [f"Ticket {i}: " + " ".join(f"word{(i * 7 + j) % 97}" for j in range(words)) for i in range(n)]


def numbers(response: dict[str, Any]) -> str:
    """The answers, exactly: every float as JSON writes it."""
    return json.dumps(response["answers"], sort_keys=True)


def load(path: Path, folder: Path | None, **overrides: Any) -> ModelService:
    disk = {"session_cache_dir": folder, "session_cache_disk_bytes": 1 << 30} if folder is not None else {}
    return load_model(tiny_settings(path, **disk, **overrides))


@pytest.mark.parametrize("layout", ["state-first", "question-first"])
def test_a_disk_hit_after_a_restart_equals_a_ram_hit_and_a_cold_miss(
    tiny_chat_path: Path, tmp_path: Path, layout: str, llama_calls: LlamaCalls
) -> None:
    request = SystemOneRequest.model_validate(body("My card was charged twice and nobody answers."))
    off = load(tiny_chat_path, None, session_cache_entries=0, layout=layout)
    reference = off.answer(request).to_json()
    off.close()
    first = load(tiny_chat_path, tmp_path, layout=layout)
    miss, hit = first.answer(request), first.answer(request)
    assert (miss.x_cache, hit.x_cache) == ("miss", "hit")
    first.close()  # finishes the background write
    restarted = load(tiny_chat_path, tmp_path, layout=layout)
    decodes = llama_calls.decodes
    from_disk = restarted.answer(request)
    assert from_disk.x_cache == "disk" and from_disk.x_timing_ms.prefill == 0.0
    # the calibration priors came from disk too: the one decode is the request's own
    assert llama_calls.decodes - decodes == 1
    again = restarted.answer(request)
    assert again.x_cache == "hit"  # promoted into RAM
    answers = {json.dumps(json.loads(r.to_json())["answers"]) for r in (miss, hit, from_disk, again)}
    assert answers == {json.dumps(json.loads(reference)["answers"])}
    stats = restarted.cache_stats()["disk"]
    # the state's snapshot, the question set's in that layout, and one prior per question
    files = (2 if layout == "question-first" else 1) + len(QUESTIONS)
    assert (stats["hits"], stats["rejected"], stats["entries"]) == (files, {}, files)
    restarted.close()


def test_a_damaged_file_is_answered_as_a_miss_with_the_same_numbers(tiny_chat_path: Path, tmp_path: Path) -> None:
    request = SystemOneRequest.model_validate(body("The app crashes when I open settings."))
    first = load(tiny_chat_path, tmp_path)
    reference = first.answer(request).to_json()
    first.close()
    path = max(tmp_path.rglob(f"*{SUFFIX}"), key=lambda p: p.stat().st_size)  # the snapshot; priors are tiny
    data = bytearray(path.read_bytes())
    data[-10] ^= 0xFF
    path.write_bytes(bytes(data))
    restarted = load(tiny_chat_path, tmp_path)
    answered = restarted.answer(request)
    assert answered.x_cache == "miss"
    assert json.loads(answered.to_json())["answers"] == json.loads(reference)["answers"]
    assert restarted.cache_stats()["disk"]["rejected"] == {"checksum": 1}
    restarted.close()


def server_args(tiny: Path, folder: Path) -> list[str]:
    return ["--model", str(tiny), "--threads", "1", "--repack", "off", "--session-cache-dir", str(folder)]


@pytest.fixture
def reference_answers(tiny_chat_path: Path) -> Iterator[Any]:
    """Cold answers from an in-process service with every cache off."""
    service = load(tiny_chat_path, None, session_cache_entries=0)

    def answer(state: str) -> str:
        return numbers(json.loads(service.answer(SystemOneRequest.model_validate(body(state))).to_json()))

    yield answer
    service.close()


def verify_folder(tiny_chat_path: Path, folder: Path) -> int:
    """Read every snapshot file with a tier of this build and model; each must be whole."""
    service = load(tiny_chat_path, folder)
    assert service.states.disk is not None
    files = list(service.states.disk.folder.glob(f"*{SUFFIX}"))
    for path in files:
        with path.open("rb") as file:
            key = CacheKey(bytes.fromhex(path.name.removesuffix(SUFFIX)))
            read_snapshot(file, key, service.states.disk.identity)
    service.close()
    return len(files)


def test_kill_9_in_the_middle_of_writes_leaves_only_whole_files(
    tiny_chat_path: Path, tmp_path: Path, reference_answers: Any
) -> None:
    texts = states(12, words=500)
    answered: list[str] = []
    server = ServerProcess(server_args(tiny_chat_path, tmp_path))
    server.wait_for(READY)
    try:
        with httpx.Client(base_url=server.url, timeout=TIMEOUT_S) as client, ThreadPoolExecutor(4) as pool:
            killed = threading.Event()

            def ask(state: str) -> None:
                if killed.is_set():
                    return
                try:
                    reply = client.post("/v1/systemone", json=body(state))
                except httpx.TransportError:
                    return  # in flight when the server died
                answered.append(state)
                if len(answered) == 4:  # more snapshots are being written and queued right now
                    server.process.send_signal(signal.SIGKILL)
                    killed.set()
                assert reply.status_code == 200

            list(pool.map(ask, texts))
    finally:
        server.process.kill()
        server.process.wait(TIMEOUT_S)
    assert verify_folder(tiny_chat_path, tmp_path) >= 1
    restarted = ServerProcess(server_args(tiny_chat_path, tmp_path))
    restarted.wait_for(READY)
    try:
        with httpx.Client(base_url=restarted.url, timeout=TIMEOUT_S) as client:
            seen = set()
            for state in texts:
                reply = client.post("/v1/systemone", json=body(state)).json()
                seen.add(reply["x_cache"])
                assert numbers(reply) == reference_answers(state)
            disk = client.get("/v1/cache").json()["tiny-chat"]["disk"]
        assert "disk" in seen and disk["rejected"] == {}
    finally:
        restarted.stop()


def test_two_servers_share_one_folder_under_concurrent_load(
    tiny_chat_path: Path, tmp_path: Path, reference_answers: Any
) -> None:
    servers = [ServerProcess(server_args(tiny_chat_path, tmp_path)) for _ in range(2)]
    try:
        for server in servers:
            server.wait_for(READY)
        clients = [httpx.Client(base_url=s.url, timeout=TIMEOUT_S) for s in servers]
        texts = states(6, words=400)
        work = [(client, state) for state in texts for client in clients for _ in range(2)]
        with ThreadPoolExecutor(6) as pool:
            replies = list(pool.map(lambda job: (job[1], job[0].post("/v1/systemone", json=body(job[1]))), work))
        for state, reply in replies:
            assert reply.status_code == 200
            assert numbers(reply.json()) == reference_answers(state)
        # One server prefills a state, the other answers it from the shared folder.
        only_first = states(1, words=300)[0] + " (asked of the first server only)"
        assert clients[0].post("/v1/systemone", json=body(only_first)).json()["x_cache"] == "miss"
        wait_for_disk_writes(servers[0].url)
        shared = clients[1].post("/v1/systemone", json=body(only_first)).json()
        assert shared["x_cache"] == "disk" and numbers(shared) == reference_answers(only_first)
        metrics = clients[1].get("/metrics").text
        assert 'onepass_cache_hits_total{model="tiny-chat",tier="disk"}' in metrics
        assert 'onepass_cache_writes_total{model="tiny-chat",tier="disk"}' in metrics
        for client in clients:
            assert client.get("/v1/cache").json()["tiny-chat"]["disk"]["rejected"] == {}
            client.close()
    finally:
        for server in servers:
            server.stop()
    assert verify_folder(tiny_chat_path, tmp_path) >= len(texts)
