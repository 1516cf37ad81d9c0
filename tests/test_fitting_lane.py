"""Fitting is background work with bounds: at most max_fitting_jobs jobs run (503 beyond), a model's
fits are listed and deleted without loading it, and a refit on known evidence stops when cancelled."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from starlette.testclient import TestClient

from app.answering.service import ModelService
from app.calibration import Fit, FitRecord
from app.fitting.examples import parse_examples
from app.fitting.jobs import FitWork
from app.http.server import create_app
from app.jobs import JobRegistry
from app.serving.loading import load_spec
from app.serving.registry import ModelRegistry
from app.serving.specs import ModelsConfig, ModelSpec
from tests.support.loading import load_model
from tests.support.settings import isolated_settings, tiny_settings

WAIT = 60  # seconds: every wait in these tests is bounded
URGENT = {"type": "noul", "instructions": "Is it urgent?"}


def examples(n: int) -> list[dict[str, Any]]:
    return [
        {"state": f"Ticket {i}: the printer on floor {i} is out of paper.", "questions": {"urgent": URGENT}}
        | {"answers": {"urgent": i % 3 == 0}}
        for i in range(n)
    ]


def spec(name: str, path: Path, fits: Path) -> ModelSpec:
    settings = isolated_settings(n_ctx=1024, threads=1, session_cache_disk_bytes=0, calibration_dir=fits)
    return ModelSpec(name, path, settings=settings)


def test_a_models_fits_are_listed_and_deleted_without_loading_it(
    tiny_chat_path: Path, tiny_plain_path: Path, tmp_path: Path
) -> None:
    loads: list[str] = []

    def loader(spec: ModelSpec) -> ModelService:
        loads.append(spec.name)
        return load_spec(spec)

    specs = (spec("chat", tiny_chat_path, tmp_path), spec("plain", tiny_plain_path, tmp_path))
    registry = ModelRegistry(ModelsConfig(specs, "chat", models_max=1), loader=loader)
    fit = Fit("probe", ("false", "true"), weights=((1.0, 0.0), (0.0, 1.0)))
    with registry.lease("plain") as plain:
        assert plain.calibration.store is not None
        stored = plain.calibration.store.put(FitRecord("0" * 32, URGENT, "probe/0.001", fit, examples=12))
    registry.load("chat")  # one model at most: "plain" is unloaded
    assert list(registry.loaded()) == ["chat"] and loads == ["plain", "chat"]
    with TestClient(create_app(tiny_settings(tiny_chat_path), registry=registry)) as client:
        listed = client.get("/v1/calibrations?model=plain")
        assert list(registry.loaded()) == ["chat"] and loads == ["plain", "chat"]  # nothing loaded nor evicted
        assert listed.json() == {"model": "plain", "loaded": False, "fits": [stored.to_json()]}
        assert client.get("/v1/calibrations?model=chat").json() == {"model": "chat", "loaded": True, "fits": []}
        deleted = client.delete(f"/v1/calibrations/{stored.id}?model=plain")
        assert deleted.json() == {"model": "plain", "deleted": stored.id}
        assert client.get("/v1/calibrations?model=plain").json()["fits"] == []
    assert list(registry.loaded()) == ["chat"] and loads == ["plain", "chat"]
    registry.close()


@contextlib.contextmanager
def gated_registry(path: Path, fits: Path) -> Iterator[tuple[ModelRegistry, threading.Event, threading.Event]]:
    """A registry whose model loads only once `release` is set (`loading` says it has begun): a fitting
    job waits in its lease meanwhile, running."""
    loading, release = threading.Event(), threading.Event()

    def loader(spec: ModelSpec) -> ModelService:
        loading.set()
        assert release.wait(WAIT)
        return load_spec(spec)

    registry = ModelRegistry(ModelsConfig((spec("chat", path, fits),), "chat", models_max=1), loader=loader)
    try:
        yield registry, loading, release
    finally:
        release.set()
        registry.close()


def test_fitting_jobs_beyond_max_fitting_jobs_are_refused_503_until_one_ends(
    tiny_chat_path: Path, tmp_path: Path
) -> None:
    settings = tiny_settings(tiny_chat_path, max_fitting_jobs=1)
    body = {"model": "chat", "examples": examples(8)}
    with (
        gated_registry(tiny_chat_path, tmp_path) as (registry, loading, release),
        TestClient(create_app(settings, registry=registry)) as client,
    ):
        first = client.post("/v1/calibrations", json=body)
        assert first.status_code == 202 and loading.wait(WAIT)  # running: waiting for its model
        refused = client.post("/v1/calibrations", json=body)
        assert refused.status_code == 503 and refused.headers["retry-after"] == "10"
        assert refused.json()["detail"] == {
            "error_type": "overloaded",
            "message": "1 fitting jobs are running; try again when one has ended",
        }
        release.set()
        job = client.app.state.runtime.fit_jobs.get(first.json()["id"])  # type: ignore[attr-defined]
        job.thread.join(WAIT)
        assert job.status == "done"
        again = client.post("/v1/calibrations", json=body)
        assert again.status_code == 202
        client.app.state.runtime.fit_jobs.get(again.json()["id"]).thread.join(WAIT)  # type: ignore[attr-defined]


def test_a_refit_on_known_evidence_stops_when_cancelled(tiny_chat_path: Path, tmp_path: Path) -> None:
    """As a labelling session's refit at shutdown: its evidence is known, so fitting is all it does."""
    service = load_model(tiny_settings(tiny_chat_path, calibration_dir=tmp_path))
    parsed = parse_examples(examples(12))
    evidence = [service.evidence(example.request) for example in parsed]
    work = FitWork("chat", lambda: cancelled_while_leased(work, service), parsed, False, evidence=evidence)
    jobs: JobRegistry[FitWork] = JobRegistry("fitting")
    job = jobs.start(work)
    job.thread.join(WAIT)
    assert not job.thread.is_alive() and job.status == "cancelled"
    assert service.calibration.store is not None and service.calibration.store.records() == []  # none stored
    service.close()


@contextlib.contextmanager
def cancelled_while_leased(work: FitWork, service: ModelService) -> Iterator[ModelService]:
    """The model, and the job cancelled as it starts to fit (cancel_all at shutdown)."""
    work.stop()
    yield service
