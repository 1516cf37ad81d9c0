"""The default model converted to a decision GGUF (make model-decision), served through the decision
path: the format read from its metadata, the model answering with the format's letters, the cache
bit-identical, and its answers agreeing with the default model's where the text is clear."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.answering.decision import DecisionPrompter
from app.answering.service import ModelService
from app.serving.known_models import default_model_path
from app.wire.contract import SystemOneRequest
from tests.support.loading import load_model
from tests.support.settings import isolated_settings

pytestmark = pytest.mark.real_model

DEFAULT_MODEL = default_model_path()
DECISION_MODEL = DEFAULT_MODEL.with_name(DEFAULT_MODEL.stem + "-decision.gguf")
TICKET = json.loads((Path(__file__).resolve().parent.parent / "examples" / "ticket.json").read_text())


@pytest.fixture(scope="module")
def decision_path(real_model_path: Path) -> Path:
    if not DECISION_MODEL.is_file():
        pytest.fail(f"{DECISION_MODEL} is missing: run `make model-decision` (make test does)")
    return DECISION_MODEL


def serve(path: Path, **settings: object) -> ModelService:
    return load_model(isolated_settings(model=path, n_ctx=4096, session_cache_disk_bytes=0, **settings))


@pytest.fixture(scope="module")
def decision_service(decision_path: Path) -> Iterator[ModelService]:
    service = serve(decision_path)
    yield service
    service.close()


def test_the_converted_model_is_read_as_an_openjev_decision_model(decision_service: ModelService) -> None:
    prompter = decision_service.prompter
    assert isinstance(prompter, DecisionPrompter)
    assert (prompter.decision_type, prompter.state_first, prompter.max_options) == ("openjev", True, 52)
    assert prompter.format.temperatures == {"noul": 0.45, "choice": 0.45, "score": 0.45}
    assert prompter.format.temperature("choice", 3) == 0.45


def test_the_model_answers_with_the_formats_letters(decision_service: ModelService) -> None:
    """The readout is at the tokens the model actually emits: most next-token mass on the labels (a
    wrong readout, such as " A" with a space, gets almost none)."""
    answers = decision_service.answer(SystemOneRequest.model_validate(TICKET)).wire()["answers"]
    for qid, answer in answers.items():
        assert answer["x_label_mass"] > 0.5, (qid, answer)


def test_hit_miss_and_cache_off_answer_bit_for_bit_on_the_real_model(
    decision_service: ModelService, decision_path: Path
) -> None:
    request = SystemOneRequest.model_validate({**TICKET, "state": TICKET["state"] + " (order 77)"})
    miss, hit = decision_service.answer(request), decision_service.answer(request)
    off_service = serve(decision_path, session_cache_entries=0)
    try:
        off = off_service.answer(request)
    finally:
        off_service.close()
    assert (miss.x_cache, hit.x_cache, off.x_cache) == ("miss", "hit", "off")
    assert miss.wire()["answers"] == hit.wire()["answers"] == off.wire()["answers"]


def test_its_answers_agree_with_the_default_models_where_the_text_is_clear(
    decision_service: ModelService, real_service: ModelService
) -> None:
    request = SystemOneRequest.model_validate(TICKET)
    ours, theirs = (s.answer(request).wire()["answers"] for s in (decision_service, real_service))
    assert ours["refund"]["noul"] > 0.8 and theirs["refund"]["noul"] > 0.8
    assert ours["team"]["choice"] == theirs["team"]["choice"] == "Billing"


def test_where_both_paths_render_the_same_tokens_the_raw_answer_is_the_same_bit_for_bit(
    decision_path: Path, real_model_path: Path
) -> None:
    """A choice whose options come in sorted order is the same prompt in onepass's layout and in the
    converted model's template: the decision path (template, prefix discovery, letters, readout)
    then reads exactly the numbers onepass's own path reads.

    The two paths cut the same tokens at different places (onepass's prefix ends with the state; the
    template's probe prefix runs on into "Question:"), so this holds with the plain kernels only:
    repacked weights and flash attention round a token's numbers by its row in the batch. "auto"
    would also time each file on its own and could choose differently for the two."""
    request = SystemOneRequest.model_validate(
        {
            "model": "m",
            "state": "I've been charged twice for my March subscription, two charges of $14.99 on March 3.",
            "questions": {
                "issue": {
                    "type": "choice",
                    "instructions": "What is the main issue in this ticket?",
                    "criteria": {"duplicate charge": "billed more than once", "login problem": None, "shipping": None},
                }
            },
        }
    )
    services = [serve(path, repack="off", flash_attn="off") for path in (decision_path, real_model_path)]
    try:
        ours, theirs = (s.plan(request) for s in services)
        assert len(ours.prefix.tokens) != len(theirs.prefix.tokens)
        assert [*ours.prefix.tokens, *ours.suffixes()[0].tokens] == [
            *theirs.prefix.tokens,
            *theirs.suffixes()[0].tokens,
        ]
        raw = [s.answer(request).wire()["answers"]["issue"]["x_raw"] for s in services]
    finally:
        for service in services:
            service.close()
    assert raw[0] == raw[1]
