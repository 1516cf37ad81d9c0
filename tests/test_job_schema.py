"""Every job response is what /openapi.json publishes for its route: a large batch's job and a fitting
job, in each state either can be in (running, done, failed, cancelled; a fit's "done, with errors"),
checked against that document as schemathesis reads it (tiny model, real llama.cpp)."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from starlette.testclient import TestClient

from app.answering.service import ModelService
from app.calibration import question_key
from app.http.server import create_app
from app.serving.registry import ModelRegistry
from app.wire.contract import NoulQuestion, SystemOneRequest
from tests.support.batches import WAIT, alone, batch, runtime_of, settled, ticket
from tests.support.fit_examples import URGENT, examples, served
from tests.support.fit_faults import fail_fitting
from tests.support.interceptors import Doorman
from tests.support.settings import tiny_settings


class Published:
    """The routes' responses as /openapi.json describes them."""

    def __init__(self, client: TestClient) -> None:
        self.schema = schemathesis.openapi.from_dict(client.get("/openapi.json").json())

    def check(self, path: str, response: Any) -> dict[str, Any]:
        """The JSON of a TestClient's response, once it is shown to match the schema of `path` (a
        route's template) for the response's method and status."""
        self.schema[path][response.request.method].validate_response(response)
        body: dict[str, Any] = response.json()
        return body


class Breakable(ModelRegistry):
    """The registry, until `broken`: then asking how many contexts a model has raises, a fault below
    the requests' own error handling that ends a batch job as failed."""

    broken = False

    def contexts_of(self, name: str) -> int:
        if self.broken:
            raise RuntimeError("a fault injected into the registry")
        return super().contexts_of(name)


def test_a_batch_job_matches_the_schema_running_done_failed_and_cancelled(
    tiny_service: ModelService, tiny_chat_path: Path
) -> None:
    doorman = Doorman()
    registry = Breakable.serving(tiny_service, intercept=doorman)
    settings = tiny_settings(tiny_chat_path, max_sync_batch_items=1)
    job_path, post_path = "/v1/systemone/jobs/{id}", "/v1/systemone"
    with TestClient(create_app(settings, registry=registry)) as client, ThreadPoolExecutor(1) as pool:
        published = Published(client)
        # an answer, a model not served (404) and a request the contract refuses (422) among the results
        requests = [ticket(0, "schema 0"), ticket(1, model="gpt-5"), {"model": "jev-latest"}, ticket(3, "schema 3")]
        doorman.held.add("Ticket about schema 3: please help.")
        started = published.check(post_path, batch(client, requests))
        location = f"/v1/systemone/jobs/{started['id']}"
        doorman.wait_entered(2)
        running = published.check(job_path, client.get(location))
        assert (started["status"], running["status"], running["done"]) == ("running", "running", 3)
        doorman.open("Ticket about schema 3: please help.")
        job = runtime_of(client).batch_jobs.get(started["id"])
        assert job is not None
        job.thread.join(WAIT)
        done = published.check(job_path, client.get(location))
        assert (done["status"], done["errors"]) == ("done", 2)
        assert ["answers" in result for result in done["results"]] == [True, False, False, True]
        assert [settled(result) for result in done["results"]] == [alone(client, body) for body in requests]

        first = "Ticket about schema 4: please help."
        doorman.held.add(first)
        failing = batch(client, [ticket(4, "schema 4"), ticket(5, "schema 5")]).json()
        doorman.wait_for(first)  # its turn taken: the fault strikes the request after it
        registry.broken = True
        doorman.open(first)
        failing_job = runtime_of(client).batch_jobs.get(failing["id"])
        assert failing_job is not None
        failing_job.thread.join(WAIT)
        registry.broken = False
        failed = published.check(job_path, client.get(f"/v1/systemone/jobs/{failing['id']}"))
        assert (failed["status"], failed["error"]) == ("failed", "a fault injected into the registry")
        assert failed["results"][1] is None and "answers" in failed["results"][0]

        doorman.until_cancelled.add("Ticket about schema 6: please help.")
        stopping = batch(client, [ticket(6, "schema 6"), ticket(7, "schema 7")]).json()
        doorman.wait_for("Ticket about schema 6: please help.")
        cancelling = pool.submit(client.delete, f"/v1/systemone/jobs/{stopping['id']}")
        cancelled = published.check(job_path, cancelling.result(WAIT))
        assert (cancelled["status"], cancelled["results"]) == ("cancelled", [None, None])


class Gate:
    """An intercept (app/serving/registry.py): every lease waits while the gate is shut, so that a
    fitting job stays running there."""

    def __init__(self) -> None:
        self.open = threading.Event()
        self.open.set()  # shut once the registry has loaded its model

    def __call__(self, service: ModelService, request: SystemOneRequest | None) -> None:
        assert self.open.wait(WAIT)


def test_a_fitting_job_matches_the_schema_running_done_failed_and_cancelled(
    tiny_chat_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    service = served(tiny_chat_path, tmp_path)
    gate = Gate()
    registry = ModelRegistry.serving(service, intercept=gate)
    gate.open.clear()
    settings = tiny_settings(tiny_chat_path, calibration_dir=tmp_path)
    job_path, post_path = "/v1/calibrations/jobs/{id}", "/v1/calibrations"
    fitting = {"model": "jev-latest", "examples": examples(40)}
    with TestClient(create_app(settings, registry=registry)) as client, ThreadPoolExecutor(1) as pool:
        published, runtime = Published(client), runtime_of(client)

        def ended(body: dict[str, Any]) -> dict[str, Any]:
            job = runtime.fit_jobs.get(body["id"])
            assert job is not None
            job.thread.join(120)
            return published.check(job_path, client.get(f"/v1/calibrations/jobs/{body['id']}"))

        started = published.check(post_path, client.post(post_path, json=fitting))
        running = published.check(job_path, client.get(f"/v1/calibrations/jobs/{started['id']}"))
        assert (started["status"], running["status"], running["report"]) == ("running", "running", None)
        job = runtime.fit_jobs.get(started["id"])
        assert job is not None
        cancelling = pool.submit(runtime.fit_jobs.cancel, job, WAIT)  # as the server does at shutdown
        gate.open.set()
        cancelling.result(WAIT)
        assert ended(started)["status"] == "cancelled"

        done = ended(published.check(post_path, client.post(post_path, json=fitting)))
        assert done["status"] == "done" and done["fits"] and done["errors"] == []
        assert any(report["after"] is not None for report in done["report"])  # scores and reliability bins

        broken = question_key(NoulQuestion.model_validate(URGENT))
        fail_fitting(monkeypatch, broken)
        partly = ended(published.check(post_path, client.post(post_path, json=fitting)))
        assert partly["status"] == "done, with errors" and [error["key"] for error in partly["errors"]] == [broken]

        too_long = {"state": "word " * 20000, "questions": {"urgent": URGENT}, "answers": {"urgent": True}}
        failed = ended(client.post(post_path, json={"model": "jev-latest", "examples": [too_long]}).json())
        assert failed["status"] == "failed" and "the model context holds" in failed["error"]
    service.close()
