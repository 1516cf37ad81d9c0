"""The decision types read from a head or from groups of labels (kev, lfm2-d1, laya, lfm2-d1-omni,
clef), served through HTTP on tiny GGUFs of each (tests/support/tiny_decision.py) with real llama.cpp. What
their answers are is compared with llama.cpp's own /v1/systemone in tests/test_native_server.py; here:
the cache, the disk tier, the limits and the errors."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from app.answering.prompter import Reading
from app.engine import bindings
from app.engine.bindings import EngineError
from app.engine.engine import Readout
from app.http.server import create_app
from app.serving.registry import ModelRegistry
from tests.support.loading import load_model
from tests.support.settings import tiny_settings
from tests.support.tiny_decision import BUILDERS

QUESTIONS: dict[str, Any] = {
    "angry": {"type": "noul", "instructions": "Is the customer angry?", "criteria": {"true": "upset", "false": None}},
    "queue": {
        "type": "choice",
        "instructions": "Which queue?",
        "criteria": {"Billing": "money", "Tech": None, "Ship": {"k": 1}},
    },
    "level": {"type": "score", "instructions": "How urgent?", "criteria": ["low", "mid", "high", "now"]},
}
STATE = {"ticket": "My refund never came.", "plan": "Pro"}
CACHED = ("kev", "lfm2-d1")  # causal: their states' prefixes are snapshots
WHOLE = ("laya", "lfm2-d1-omni", "clef")  # no memory: every prompt is read whole


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("decision-types")
    return {kind: build(folder / f"{kind}.gguf") for kind, build in BUILDERS.items()}


def client_for(path: Path, **settings: Any) -> Iterator[TestClient]:
    service = load_model(tiny_settings(path, **({"n_ctx": 1024, "calibration": "none"} | settings)))
    with TestClient(create_app(tiny_settings(path), registry=ModelRegistry.serving(service))) as client:
        yield client


def ask(client: TestClient, state: Any = STATE, questions: dict[str, Any] = QUESTIONS) -> dict[str, Any]:
    response = client.post("/v1/systemone", json={"model": "jev-latest", "state": state, "questions": questions})
    assert response.status_code == 200, response.text
    answered: dict[str, Any] = response.json()
    return answered


@pytest.mark.parametrize("kind", sorted(BUILDERS))
def test_every_type_answers_and_says_what_it_is(models: dict[str, Path], kind: str) -> None:
    for client in client_for(models[kind]):
        listed = client.get("/v1/models").json()["models"]
        assert {entry.get("x_decision_type") for entry in listed} == {kind}
        answers = ask(client)["answers"]
        assert math.isclose(sum(answers["queue"]["probabilities"].values()), 1.0, abs_tol=1e-9)
        assert 0.0 <= answers["angry"]["noul"] <= 1.0
        # a head's answer is no next-token distribution: no label mass is claimed for it
        assert ("x_label_mass" in answers["angry"]) == (kind == "lfm2-d1")


@pytest.mark.parametrize("kind", CACHED)
def test_a_cached_type_answers_a_hit_as_a_miss_and_as_with_the_cache_off_bit_for_bit(
    models: dict[str, Path], kind: str, tmp_path: Path
) -> None:
    disk = {"session_cache_disk_bytes": 1 << 30, "session_cache_dir": tmp_path}
    for client in client_for(models[kind], **disk):
        miss, hit = ask(client), ask(client)
    for client in client_for(models[kind], **disk):  # a restart: the state's snapshot comes from disk
        restarted = ask(client)
    for client in client_for(models[kind], session_cache_entries=0):
        off = ask(client)
    assert (miss["x_cache"], hit["x_cache"], restarted["x_cache"], off["x_cache"]) == ("miss", "hit", "disk", "off")
    assert miss["answers"] == hit["answers"] == restarted["answers"] == off["answers"]


@pytest.mark.parametrize("kind", WHOLE)
def test_a_type_without_memory_reads_each_prompt_whole_and_the_same_each_time(
    models: dict[str, Path], kind: str
) -> None:
    for client in client_for(models[kind]):
        first, again = ask(client), ask(client)
        assert first["x_cache"] == again["x_cache"] == "off"
        assert first["answers"] == again["answers"]
        (stats,) = client.get("/v1/cache").json().values()
        assert stats["entries"] == 0


@pytest.mark.parametrize("kind", WHOLE)
def test_a_prompt_longer_than_the_model_reads_is_a_422_and_the_server_keeps_answering(
    models: dict[str, Path], kind: str
) -> None:
    for client in client_for(models[kind]):
        long = "the refund is late " * 100
        refused = client.post("/v1/systemone", json={"model": "jev-latest", "state": long, "questions": QUESTIONS})
        assert refused.status_code == 422, refused.text
        detail = refused.json()["detail"][0]
        assert detail["loc"] == ["body", "state"] and detail["type"] == "too_long"
        assert "the model context holds 1024" in detail["msg"]
        assert ask(client)["answers"]  # alive, and answering


def test_nan_scores_are_an_error_the_user_sees_never_a_probability(
    models: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    def nan(reading: Reading, readout: Readout) -> list[float]:
        return [float("nan")] * len(readout.marked)

    for client in client_for(models["clef"]):
        first = ask(client)
        monkeypatch.setattr(Reading, "scores", nan)
        failed = client.post("/v1/systemone", json={"model": "jev-latest", "state": STATE, "questions": QUESTIONS})
        assert failed.status_code == 500
        assert failed.json()["detail"] == {
            "error_type": "internal_error",
            "message": f"{first['model']} could not evaluate question 'angry': NaN scores",
        }
        monkeypatch.undo()
        assert ask(client)["answers"]


def test_clef_is_refused_at_load_by_a_build_without_its_decision_order(
    models: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    from app.answering.decision_format import DecisionError
    from app.serving import loading

    monkeypatch.setattr(loading, "decision_order_setter", lambda: None)
    with pytest.raises(DecisionError, match=r"clef needs llama_batch_ext_set_decision_order, which this llama\.cpp"):
        load_model(tiny_settings(models["clef"], n_ctx=1024))


def test_bindings_that_misread_the_context_parameters_stop_the_engine(
    models: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A struct declared otherwise than the library fills it in (one field missing before the flags)
    reads shifted bytes: the engine refuses to start rather than compute with settings nobody chose."""
    bindings.init()
    import llama_cpp

    made = llama_cpp.llama_context_default_params

    def shifted() -> Any:
        params = made()
        params.offload_kqv, params.embeddings = False, False  # what a struct read 8 bytes off shows
        return params

    monkeypatch.setattr(llama_cpp, "llama_context_default_params", shifted)
    with pytest.raises(EngineError, match=r"does not match its llama\.cpp library .*offload_kqv"):
        load_model(tiny_settings(models["kev"], n_ctx=1024))


def test_a_fitting_run_on_a_head_stops_at_once_saying_the_model_takes_no_fit(
    models: dict[str, Path], tmp_path: Path
) -> None:
    from app.fitting.examples import ExampleError, parse_examples
    from app.fitting.runner import answer_all
    from app.progress import Progress

    service = load_model(tiny_settings(models["kev"], n_ctx=1024, calibration_dir=tmp_path))
    try:
        examples = parse_examples([{"state": STATE, "questions": QUESTIONS, "answers": {"angry": True}}])
        with pytest.raises(ExampleError, match="answers are not one token's logit per label: it takes no fit"):
            answer_all(service, examples, Progress(1, "examples", show=False))
    finally:
        service.close()
