"""The question-first layout: system + questions, then the state, then a short readout per question.

Many states asked the same questions prefill the question block once; answers stay
bit-identical across hit, miss and cache off, and never depend on ids or question order.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from app.answering.service import ModelService
from app.config_sources import ConfigError, SettingsSource, load_settings
from app.http.server import create_app
from app.serving.specs import read_models_config
from app.wire.contract import SystemOneRequest
from tests.support.llama_calls import LlamaCalls
from tests.support.loading import load_model, own_prompter
from tests.support.settings import tiny_settings

QUESTIONS: dict[str, Any] = {
    "queue": {
        "type": "choice",
        "instructions": "Which team should take it?",
        "criteria": {"Billing": "charges and refunds", "Shipping": "parcels", "Tech": "the app"},
    },
    "angry": {"type": "noul", "instructions": "Is the customer angry?"},
    "priority": {"type": "score", "instructions": "How urgent?", "criteria": ["later", "soon", "now"]},
}


def request(state: str, questions: dict[str, Any] = QUESTIONS) -> SystemOneRequest:
    return SystemOneRequest.model_validate({"model": "m", "state": state, "questions": questions})


@pytest.fixture
def pipeline(tiny_chat_path: Path) -> Iterator[ModelService]:
    service = load_model(tiny_settings(tiny_chat_path, layout="question-first", calibration="none"))
    yield service
    service.close()


def test_the_prompt_is_system_then_every_question_then_the_state_then_a_readout(pipeline: ModelService) -> None:
    plan = pipeline.plan(request("My parcel is late."))
    assert plan.question_set is not None
    text = plan.question_set.text
    assert text.startswith("Questions:\nQuestion 1: ") and text.endswith("\n\nText:\n")
    assert text.count("Question ") == 3 and "Options:\nA. Billing: charges and refunds" in text
    readouts = {qid: reading.variants[0].text for qid, _, reading in plan.questions}
    number = plan.question_set.number
    assert readouts["angry"] == f"Question {number['angry']}: Is the customer angry?\nAnswer Yes or No"
    assert readouts["queue"] == (  # the option names again, their descriptions only in the block
        f"Question {number['queue']}: Which team should take it?\nOptions:\nA. Billing\nB. Shipping\nC. Tech\n"
        "Answer with the label of one option"
    )
    # the prefix is base + question set + state; each suffix is its readout and the tail
    assert plan.prefix.tokens[: pipeline.base.n_tokens] == pipeline.base.tokens
    assert plan.prefix.tokens[pipeline.base.n_tokens :][: len(plan.question_set.tokens)] == plan.question_set.tokens
    # options and levels stay in the shared block: those readouts are shorter than state-first suffixes
    for qid, question, reading in plan.questions:
        if qid != "angry":
            assert len(reading.variants[0].tokens) < len(own_prompter(pipeline).question(question).tokens)


@pytest.mark.parametrize("flash_attn", ["off", "on"])
def test_hit_miss_and_cache_off_answer_bit_identically(tiny_chat_path: Path, flash_attn: str) -> None:
    cached = load_model(tiny_settings(tiny_chat_path, layout="question-first", flash_attn=flash_attn))
    off = load_model(
        tiny_settings(tiny_chat_path, layout="question-first", flash_attn=flash_attn, session_cache_entries=0)
    )
    # long enough that ggml's flash attention takes its tiled path (64 rows or more) for the state
    state = "A parcel never came, and the invoice was wrong twice. " * 12
    try:
        miss = cached.answer(request(state)).wire()
        hit = cached.answer(request(state)).wire()
        disabled = off.answer(request(state)).wire()
        assert (miss["x_cache"], hit["x_cache"], disabled["x_cache"]) == ("miss", "hit", "off")
        assert miss["answers"] == hit["answers"] == disabled["answers"]
        assert off.question_sets.ram.stats()["enabled"] is False  # no snapshot of the questions kept either
    finally:
        cached.close()
        off.close()


def test_ids_and_question_order_change_nothing(pipeline: ModelService) -> None:
    forward = pipeline.answer(request("I was charged twice.")).wire()["answers"]
    renamed = {f"x-{qid}": QUESTIONS[qid] for qid in reversed(list(QUESTIONS))}
    backward = pipeline.answer(request("I was charged twice.", renamed)).wire()["answers"]
    assert {qid: backward[f"x-{qid}"] for qid in QUESTIONS} == forward
    twice = pipeline.answer(request("I was charged twice.", QUESTIONS | {"again": QUESTIONS["angry"]})).wire()
    assert twice["answers"]["again"] == twice["answers"]["angry"] == forward["angry"]  # one block, one number


def test_a_new_state_with_the_same_questions_prefills_only_the_state(
    pipeline: ModelService, llama_calls: LlamaCalls
) -> None:
    first = request("The first ticket of the pipeline.")
    pipeline.answer(first)
    sets = pipeline.question_sets.ram.stats()
    assert (sets["misses"], sets["entries"]) == (1, 1)
    before_calls, before_tokens = llama_calls.decodes, pipeline.prefilled_tokens
    second = request("A second, different ticket.")
    response = pipeline.answer(second).wire()
    plan = pipeline.plan(second)
    assert plan.question_set is not None
    state_tokens = len(plan.prefix.tokens) - pipeline.base.n_tokens - len(plan.question_set.tokens)
    assert llama_calls.decodes - before_calls == 2  # the state's prefill, one batched readout decode
    assert pipeline.prefilled_tokens - before_tokens == state_tokens  # not the question block again
    assert pipeline.question_sets.ram.stats()["hits"] == 1
    assert response["x_cache"] == "miss"
    timing = response["x_timing_ms"]
    parts = timing["prefill"] + timing["restore"] + timing["decode"] + timing["calibrate"]
    assert 0 < parts <= timing["total"]


def test_priors_are_measured_through_the_question_set(tiny_chat_path: Path) -> None:
    service = load_model(tiny_settings(tiny_chat_path, layout="question-first", calibration="contextual"))
    try:
        one = {"angry": QUESTIONS["angry"]}
        two = {"angry": QUESTIONS["angry"], "queue": QUESTIONS["queue"]}
        answered = service.answer(request("Where is my refund?", one)).wire()["answers"]["angry"]
        assert "x_raw" in answered
        service.answer(request("Where is my refund?", two))
        # the same readout text after two different question sets: two priors, not one shared
        assert len(service.calibration.priors) == 1 + 2
    finally:
        service.close()


def test_one_gguf_served_under_two_names_with_two_layouts(tiny_chat_path: Path, tmp_path: Path) -> None:
    config = tmp_path / "onepass.toml"
    config.write_text(
        "[server]\nthreads = 1\nsession_cache_disk_bytes = 0\n\n"
        f'[[models]]\nname = "tickets"\npath = "{tiny_chat_path}"\n\n'
        f'[[models]]\nname = "tickets-pipeline"\npath = "{tiny_chat_path}"\nlayout = "question-first"\n'
    )
    source = SettingsSource(("--config", str(config)))
    app = create_app(source.load(), source=source)
    with TestClient(app) as client:
        assert app.state.runtime.loaded.wait(30)
        body = {"state": "Please refund me.", "questions": QUESTIONS}
        plain = client.post("/v1/systemone", json=body | {"model": "tickets"}).json()
        pipelined = client.post("/v1/systemone", json=body | {"model": "tickets-pipeline"}).json()
        again = client.post("/v1/systemone", json=body | {"model": "tickets-pipeline"}).json()
        assert pipelined["answers"] == again["answers"] != plain["answers"]  # deterministic per layout
        assert (plain["x_layout"], pipelined["x_layout"]) == ("state-first", "question-first")  # which answered
        stats = client.get("/v1/cache").json()
        assert stats["tickets-pipeline"]["question_set"]["entries"] == 1
        assert stats["tickets"]["question_set"]["entries"] == 0
        assert 'onepass_cache_entries{model="tickets-pipeline",tier="question_set"} 1.0' in client.get("/metrics").text


def test_a_layout_outside_the_two_is_a_config_error(tiny_chat_path: Path, tmp_path: Path) -> None:
    config = tmp_path / "bad.toml"
    config.write_text(f'[[models]]\nname = "m"\npath = "{tiny_chat_path}"\nlayout = "sideways"\n')
    with pytest.raises(ConfigError, match="layout must be one of"):
        read_models_config(load_settings(["--config", str(config)], {}))
    with pytest.raises(ValueError, match="layout must be one of"):
        load_settings([], {"ONEPASS_LAYOUT": "sideways"})
