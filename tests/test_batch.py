"""Batches: POST /v1/systemone with {"requests": [...]} (tiny model, real llama.cpp). Each request is
answered as it would be alone and fails alone; the results come in the request's order; small batches
are answered in the response, large ones by a job; a batch counts against admission as its size and
never stands between a single request and a context."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from app.answering.service import ModelService
from app.http.batch import parse_items, schedule
from app.http.runtime import Runtime
from app.http.server import create_app
from app.platform.tiny_images import png
from app.serving.registry import Intercept, ModelRegistry
from app.serving.specs import ModelsConfig, ModelSpec
from tests.support.batches import URGENT, WAIT, alone, batch, runtime_of, settled, ticket
from tests.support.interceptors import Doorman, Faulty
from tests.support.llama_calls import LlamaCalls
from tests.support.settings import isolated_settings, tiny_settings

PHOTO = {"type": "image", "format": "png", "data_base64": base64.b64encode(png()).decode()}


def app_with(service: ModelService, path: Path, intercept: Intercept | None = None, **settings: Any) -> Any:
    registry = ModelRegistry.serving(service, intercept=intercept)
    return create_app(tiny_settings(path, **settings), registry=registry)


def until(runtime: Runtime, condition: Callable[[], bool]) -> None:
    """Wait (bounded) until the admission counts satisfy `condition`."""
    with runtime.admission.changed:
        assert runtime.admission.changed.wait_for(condition, WAIT)


def batch_of_50(
    service: ModelService, path: Path, checked: list[int]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """50 tickets in one batch, the 18th invalid: the tickets and their results, those at `checked`
    equal to what the same request gets alone, the invalid one's error its own."""
    tickets = [ticket(i) for i in range(50)]
    tickets[17] = ticket(17, questions={"team": {"type": "multiple", "criteria": ["a", "b"]}})
    with TestClient(app_with(service, path, max_sync_batch_items=50, max_queue=64)) as client:
        response = batch(client, tickets)
        assert response.status_code == 200
        results: list[dict[str, Any]] = response.json()["results"]
        assert [settled(results[i]) for i in checked] == [alone(client, tickets[i]) for i in checked]
    assert len(results) == 50 and results[17]["error"]["status"] == 422
    assert results[17]["error"]["detail"][0]["loc"] == ["body", "questions", "team"]
    return tickets, results


def test_a_batch_of_50_tickets_answers_each_in_order_as_alone_and_a_bad_one_fails_alone(
    tiny_service: ModelService, tiny_chat_path: Path
) -> None:
    _, results = batch_of_50(tiny_service, tiny_chat_path, list(range(50)))
    assert results[17]["error"]["detail"][0]["type"] == "union_tag_invalid"
    assert sum("answers" in result for result in results) == 49


def test_on_the_real_model_50_tickets_come_back_in_order_and_a_bad_one_fails_alone(
    real_service: ModelService, real_model_path: Path
) -> None:
    """The same batch through the default model: 50 results in the request's order, the bad item's
    error its own, and the first ticket of each state answered as it is alone."""
    tickets, results = batch_of_50(real_service, real_model_path, [*range(7), 17])
    for body, result in zip(tickets, results, strict=True):  # in order: each has its own questions
        assert body is tickets[17] or set(result["answers"]) == set(body["questions"])


def test_each_bad_request_fails_alone_with_the_error_it_gets_alone(
    tiny_service: ModelService, tiny_chat_path: Path
) -> None:
    requests: list[Any] = [
        ticket(1, "a lost card"),
        ticket(2, "a lost card", model="gpt-5"),  # 404 model_not_found
        "not an object",  # 422 model_type
        ticket(3, "a lost card", questions={f"q{i}": URGENT for i in range(4)}),  # 422: max_questions
        ticket(4, " ".join(f"word{i}" for i in range(9000))),  # 422: the prompt does not fit the context
        ticket(6, "a lost card", assets=[{"url": "x"}]),  # 422: assets is a map
        ticket(7, "a stolen card"),
        ticket(8, "<photo> a torn box", assets={"<photo>": PHOTO}),  # 422: no vision
    ]
    with TestClient(app_with(tiny_service, tiny_chat_path, max_questions=3)) as client:
        results = batch(client, requests).json()["results"]
        assert [settled(result) for result in results] == [alone(client, body) for body in requests]
    statuses = [result["error"]["status"] if "error" in result else 200 for result in results]
    assert statuses == [200, 404, 422, 422, 422, 422, 200, 422]
    assert results[1]["error"]["detail"]["error_type"] == "model_not_found"
    assert results[4]["error"]["detail"][0]["loc"] == ["body", "state"]
    assert results[7]["error"]["detail"][0]["type"] == "images_unsupported"


def test_a_fault_inside_llama_cpp_fails_that_request_only(tiny_service: ModelService, tiny_chat_path: Path) -> None:
    requests = [ticket(i, f"fault {i}") for i in range(3)]
    with TestClient(app_with(tiny_service, tiny_chat_path, Faulty())) as client:
        results = batch(client, requests).json()["results"]
        internal = {"error_type": "internal_error", "message": "internal error; see the server log"}
        assert results[0] == {"error": {"status": 500, "detail": internal}}
        assert [settled(result) for result in results[1:]] == [alone(client, body) for body in requests[1:]]


def test_repeated_states_are_answered_together_and_results_come_in_the_request_order(
    tiny_service: ModelService, tiny_chat_path: Path
) -> None:
    doorman = Doorman()
    order = ["schedule a", "schedule b", "schedule a", "schedule c", "schedule b", "schedule a"]
    requests = [ticket(1, subject) for subject in order]
    with TestClient(app_with(tiny_service, tiny_chat_path, doorman)) as client:
        results = batch(client, requests).json()["results"]
        entered = doorman.wait_entered(6)
        assert entered == [f"Ticket about {s}: please help." for s in sorted(order)]
        assert [result["x_cache"] for result in results] == ["miss", "miss", "hit", "miss", "hit", "hit"]
        assert [settled(result) for result in results] == [alone(client, body) for body in requests]


def test_one_text_with_other_images_is_another_state_in_the_order(tiny_chat_path: Path) -> None:
    photos = [f"data:image/png;base64,{base64.b64encode(png(seed=seed)).decode()}" for seed in (1, 2)]
    bodies = [{**ticket(1, "a photo"), "images": [photos[k]]} for k in (0, 1, 0, 1)]
    items = parse_items(bodies, tiny_settings(tiny_chat_path), lambda name: name)
    assert [item.index for item in schedule(items)] == [0, 2, 1, 3]  # each image's requests together


def test_a_batch_may_name_several_models_and_each_model_answers_its_own_together(
    tiny_service: ModelService, tiny_chat_path: Path
) -> None:
    doorman = Doorman()
    specs = tuple(
        ModelSpec(name, tiny_chat_path, settings=isolated_settings(session_cache_disk_bytes=0)) for name in "xy"
    )
    registry = ModelRegistry(ModelsConfig(specs, "x", 2), loader=lambda spec: tiny_service, intercept=doorman)
    requests = [ticket(1, f"{model} {i}", model=model) for i, model in enumerate("xyxyx")]
    with TestClient(create_app(tiny_settings(tiny_chat_path), registry=registry)) as client:
        results = batch(client, requests).json()["results"]
        assert len(results) == 5 and all("answers" in result for result in results)
        subjects = [state.split()[2] + state.split()[3] for state in doorman.wait_entered(5)]
        assert subjects == ["x0:", "x2:", "x4:", "y1:", "y3:"]
        assert [settled(result) for result in results] == [alone(client, body) for body in requests]


def test_the_batch_itself_is_checked_first(tiny_service: ModelService, tiny_chat_path: Path) -> None:
    with TestClient(app_with(tiny_service, tiny_chat_path, max_batch_items=3, max_body_bytes=4096)) as client:
        for requests, kind in (({"a": 1}, "list_type"), ([], "too_short"), ([ticket(i) for i in range(4)], "too_long")):
            response = batch(client, requests)
            assert response.status_code == 422
            detail = response.json()["detail"]
            assert [(d["loc"], d["type"]) for d in detail] == [(["body", "requests"], kind)]
        long = batch(client, [ticket(1, "x" * 5000)])
        assert long.status_code == 413 and long.json()["detail"]["error_type"] == "request_too_large"
        # with `state` or `questions` the body is one request, as ever: `requests` is a field it ignores
        single = client.post("/v1/systemone", json={**ticket(1), "requests": [ticket(2)]})
        assert single.status_code == 200 and "answers" in single.json()


def test_a_large_batch_runs_as_a_job_with_progress_then_results_in_order(
    tiny_service: ModelService, tiny_chat_path: Path
) -> None:
    doorman = Doorman()
    requests = [ticket(i, f"job {i}") for i in range(6)]
    requests[1] = ticket(1, "job 1", model="gpt-5")
    doorman.held.add("Ticket about job 3: please help.")
    with TestClient(
        app_with(tiny_service, tiny_chat_path, doorman, max_sync_batch_items=4, max_batch_jobs=1)
    ) as client:
        started = batch(client, requests)
        assert started.status_code == 202
        location = started.headers["location"]
        assert location == f"/v1/systemone/jobs/{started.json()['id']}"
        assert started.json()["total"] == 6 and started.json()["results"] is None
        assert doorman.wait_entered(3)[-1] == "Ticket about job 3: please help."
        progress = client.get(location).json()
        assert (progress["status"], progress["done"], progress["total"], progress["errors"]) == ("running", 3, 6, 1)
        assert progress["eta_s"] is not None and progress["results"] is None
        another = batch(client, requests)  # max_batch_jobs: one at a time
        assert another.status_code == 503 and another.json()["detail"]["error_type"] == "overloaded"
        doorman.open("Ticket about job 3: please help.")
        job = runtime_of(client).batch_jobs.get(started.json()["id"])
        assert job is not None
        job.thread.join(WAIT)
        finished = client.get(location).json()
        assert (finished["status"], finished["done"], finished["errors"], finished["eta_s"]) == ("done", 6, 1, None)
        assert [settled(result) for result in finished["results"]] == [alone(client, body) for body in requests]
        # a finished job is kept for its results only: none of its requests' bytes (images) stay with it
        assert [item.request for item in job.work.batch.items] == [None] * len(requests)
        assert client.get("/v1/systemone/jobs/nope").json()["detail"]["error_type"] == "not_found"


def test_cancelling_a_job_stops_it_and_keeps_what_was_answered(
    tiny_service: ModelService, tiny_chat_path: Path, llama_calls: LlamaCalls
) -> None:
    doorman = Doorman()
    requests = [ticket(i, f"cancel {i}") for i in range(5)]
    doorman.until_cancelled.add("Ticket about cancel 1: please help.")
    with (
        TestClient(app_with(tiny_service, tiny_chat_path, doorman, max_sync_batch_items=2)) as client,
        ThreadPoolExecutor(1) as pool,
    ):
        started = batch(client, requests).json()
        doorman.wait_entered(2)
        decodes = llama_calls.decodes
        cancelled = pool.submit(client.delete, f"/v1/systemone/jobs/{started['id']}").result(WAIT).json()
        assert llama_calls.decodes == decodes  # the held request stopped before any llama.cpp work
        assert cancelled["status"] == "cancelled" and cancelled["done"] == 1
        assert doorman.entered == ["Ticket about cancel 0: please help.", "Ticket about cancel 1: please help."]
        assert settled(cancelled["results"][0]) == alone(client, requests[0])
        assert cancelled["results"][1:] == [None, None, None, None]
        assert client.get(f"/v1/systemone/jobs/{started['id']}").json() == cancelled
        assert runtime_of(client).admission.held("tiny-chat") == 0


def test_a_batch_counts_as_its_size_against_admission(tiny_service: ModelService, tiny_chat_path: Path) -> None:
    doorman = Doorman()
    first = "Ticket about admission 0: please help."
    doorman.held.add(first)
    with (
        TestClient(app_with(tiny_service, tiny_chat_path, doorman, max_queue=3)) as client,
        ThreadPoolExecutor(2) as pool,
    ):
        runtime = runtime_of(client)  # contexts 1 + max_queue 3: four places
        single = pool.submit(client.post, "/v1/systemone", json=ticket(0, "admission 0"))
        doorman.wait_entered(1)
        four = batch(client, [ticket(i, f"admission {i}") for i in range(1, 5)])
        assert four.status_code == 503 and four.headers["retry-after"] == "1"  # four more do not fit in three
        assert four.json()["detail"]["error_type"] == "overloaded"
        three = pool.submit(batch, client, [ticket(i, f"admission {i}") for i in range(1, 4)])
        until(runtime, lambda: runtime.admission.held("tiny-chat") == 4)
        assert client.post("/v1/systemone", json=ticket(9, "admission 9")).status_code == 503  # all four taken
        # five can never fit in four places: a job, whose requests take their places as they run
        job = batch(client, [ticket(i, f"admission {i}") for i in range(5, 10)])
        assert job.status_code == 202
        doorman.open(first)
        assert single.result(WAIT).status_code == 200
        assert [len(r["answers"]) for r in three.result(WAIT).json()["results"]] == [3, 3, 3]
        running = runtime.batch_jobs.get(job.json()["id"])
        assert running is not None
        running.thread.join(WAIT)
        assert running.status == "done" and running.work.batch.errors() == 0
        assert runtime.admission.held("tiny-chat") == 0


def test_a_single_request_waits_for_the_batch_request_running_not_for_the_batch(
    tiny_service: ModelService, tiny_chat_path: Path
) -> None:
    doorman = Doorman()
    states = [f"Ticket about starve {i}: please help." for i in range(3)]
    single = "Ticket about starve single: please help."
    doorman.held |= {states[0], single}
    with TestClient(app_with(tiny_service, tiny_chat_path, doorman)) as client, ThreadPoolExecutor(2) as pool:
        runtime = runtime_of(client)
        answered = pool.submit(batch, client, [ticket(i, f"starve {i}") for i in range(3)])
        assert doorman.wait_entered(1) == states[:1]
        alone_answer = pool.submit(client.post, "/v1/systemone", json=ticket(0, "starve single"))
        assert doorman.wait_entered(2) == [states[0], single]  # admitted while the batch runs
        doorman.open(states[0])
        # the batch's next request waits for its turn: the single request has the context
        until(runtime, lambda: runtime.admission.waiting("tiny-chat") == 1)
        assert doorman.entered == [states[0], single]
        doorman.open(single)
        assert alone_answer.result(WAIT).status_code == 200
        assert len(answered.result(WAIT).json()["results"]) == 3
        assert doorman.entered == [states[0], single, states[1], states[2]]


def test_a_batch_out_of_time_answers_what_it_could_and_times_out_the_rest(
    tiny_service: ModelService, tiny_chat_path: Path
) -> None:
    doorman = Doorman()
    requests = [ticket(i, f"budget {i}") for i in range(3)]
    doorman.until_cancelled.add("Ticket about budget 1: please help.")
    with TestClient(app_with(tiny_service, tiny_chat_path, doorman, batch_timeout=2.0)) as client:
        first = alone(client, requests[0])  # answered again from the cache, well within the budget
        results = batch(client, requests).json()["results"]
        assert settled(results[0]) == first
        timeout = {"error_type": "timeout", "message": "not answered within the batch's 2 s"}
        assert results[1:] == [{"error": {"status": 504, "detail": timeout}}] * 2
        assert runtime_of(client).admission.held("tiny-chat") == 0


def test_openapi_describes_the_batch(client: TestClient) -> None:
    spec = client.get("/openapi.json").json()
    operation = spec["paths"]["/v1/systemone"]["post"]
    bodies = operation["requestBody"]["content"]["application/json"]["schema"]["anyOf"]
    assert {"$ref": "#/components/schemas/BatchRequest"} in bodies
    assert {"200", "202", "422", "503"} <= set(operation["responses"])
    assert set(spec["paths"]["/v1/systemone/jobs/{id}"]) == {"get", "delete"}
    schemas = spec["components"]["schemas"]
    items = schemas["BatchRequest"]["properties"]["requests"]["items"]
    assert items == {"$ref": "#/components/schemas/SystemOneRequest"}
    assert {"BatchResponse", "BatchItemError", "BatchJob"} <= set(schemas)


def test_a_batch_logs_one_line_with_its_size_and_errors(
    tiny_service: ModelService, tiny_chat_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO", logger="onepass.requests")
    with TestClient(app_with(tiny_service, tiny_chat_path)) as client:
        batch(client, [ticket(0, "logged"), ticket(1, "logged"), ticket(2, model="gpt-5")])
    [line] = [json.loads(r.getMessage()) for r in caplog.records if r.name == "onepass.requests"]
    assert (line["route"], line["status"], line["batch"], line["errors"]) == ("/v1/systemone", 200, 3, 1)
