"""onepass's decision path against llama.cpp's own /v1/systemone (the reference implementation of
the format) on the same decision GGUFs: the same labels, readouts and temperatures, so the same
answers to within the rounding of two llama.cpp builds.

Runs where ONEPASS_NATIVE_SERVER names a llama-server with /v1/systemone: `make test-native`
builds one (`make native-server`) and runs these; `make test` skips them, saying so."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.answering.decision_media import PromptImages
from app.answering.prompter import Reading
from app.engine.engine import Readout
from app.platform.tiny_projector import Projector
from app.wire.assets import request_of
from app.wire.contract import SystemOneRequest
from bench.native_decision import agreement, onepass_service, probabilities
from bench.peer import llama_server
from tests.support.decision_cases import QUESTIONS, STATE, TEMPERATURES, TEMPLATES, decision_gguf
from tests.support.loading import load_model
from tests.support.settings import tiny_settings
from tests.support.skip_groups import skip_if
from tests.support.tiny_decision import BUILDERS
from tests.support.vision_decision import (
    PAIRS,
    llama_server_with_mmproj,
    mmproj,
    photo,
    vision_decision_gguf,
    with_images,
)

NATIVE = os.environ.get("ONEPASS_NATIVE_SERVER", "")
pytestmark = skip_if(
    not NATIVE,
    "native-server",
    "ONEPASS_NATIVE_SERVER unset: make test-native builds llama.cpp's server and runs these",
)

# llama.cpp's own test allows this much between two batch layouts of one build (test_systemone.py);
# two builds of different releases round at least as differently.
TOLERANCE = 0.01

MORE: dict[str, Any] = {  # a larger choice (another temperature bucket) and a noul without criteria
    "team": {
        "type": "choice",
        "instructions": "Which team owns this?",
        "criteria": {f"team {c}": (f"handles {c}" if i % 2 else None) for i, c in enumerate("uvwxyz")},
    },
    "plain": {"type": "noul", "instructions": "Does the text mention money?"},
}
STATES: list[Any] = [STATE, "I was charged twice for my order last week and nobody has replied. Café, 東京."]


def ask(client: httpx.Client, url: str, state: Any, questions: dict[str, Any]) -> dict[str, Any]:
    response = client.post(url + "/v1/systemone", json={"state": state, "questions": questions})
    assert response.status_code == 200, response.text
    answers: dict[str, Any] = response.json()["answers"]
    return answers


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("native-server")


@pytest.mark.parametrize("kind", list(TEMPLATES))
def test_each_type_answers_as_llama_cpp_answers(folder: Path, kind: str) -> None:
    model = decision_gguf(folder, kind, TEMPLATES[kind], TEMPERATURES)
    service = onepass_service(model, threads=1)
    try:
        with llama_server(Path(NATIVE), model, 1024, 1, False, False) as peer, httpx.Client(timeout=120) as client:
            for state in STATES:
                for questions in (QUESTIONS, MORE):
                    theirs = ask(client, peer.url, state, questions)
                    body = {"model": "m", "state": state, "questions": questions}
                    ours = service.answer(SystemOneRequest.model_validate(body)).wire()["answers"]
                    assert list(theirs) == list(ours)
                    for qid, question in questions.items():
                        found = agreement(question["type"], ours[qid], theirs[qid])
                        assert found.largest_gap < TOLERANCE, (kind, qid, probabilities(ours[qid]), theirs[qid])
    finally:
        service.close()


def largest_gaps(model: Path) -> dict[str, float]:
    """Per question, over both states and both question sets, the largest gap between onepass's
    probability of a label and llama-server's."""
    service = onepass_service(model, threads=1)
    gaps: dict[str, float] = {}
    try:
        # clef's one prompt for every question is longer than llama-server's default micro-batch
        native = llama_server(Path(NATIVE), model, 2048, 1, False, False, batch=2048)
        with native as peer, httpx.Client(timeout=120) as client:
            for state in STATES:
                for questions in (QUESTIONS, MORE):
                    theirs = ask(client, peer.url, state, questions)
                    body = {"model": "m", "state": state, "questions": questions}
                    ours = service.answer(SystemOneRequest.model_validate(body)).wire()["answers"]
                    assert list(theirs) == list(ours)
                    for qid, question in questions.items():
                        gap = agreement(question["type"], ours[qid], theirs[qid]).largest_gap
                        gaps[qid] = max(gaps.get(qid, 0.0), gap)
    finally:
        service.close()
    return gaps


@pytest.mark.parametrize("kind", sorted(BUILDERS))
def test_each_type_read_from_a_head_or_label_groups_answers_as_llama_cpp_answers(folder: Path, kind: str) -> None:
    gaps = largest_gaps(BUILDERS[kind](folder / f"{kind}.gguf"))
    assert max(gaps.values()) < TOLERANCE, (kind, gaps)


SCORES = Reading.scores  # the readout as it is, for the alterations below to start from


def swap_q_and_k(reading: Reading, readout: Readout) -> list[float]:
    flipped = tuple(v[::-1].copy() for v in readout.marked)  # each vector's halves trade places
    return SCORES(reading, Readout(readout.label_logits, readout.label_mass, readout.hidden, flipped))


def wrong_marker(reading: Reading, readout: Readout) -> list[float]:
    shifted = (*readout.marked[1:], readout.marked[0])  # each option reads the next one's mask
    return SCORES(reading, Readout(readout.label_logits, readout.label_mass, readout.hidden, shifted))


def labels_reversed(reading: Reading, readout: Readout) -> list[float]:
    return readout.label_logits[::-1]


def wrong_column(reading: Reading, readout: Readout) -> list[float]:
    return [float(v[(reading.column + 1) % len(v)]) for v in readout.marked]


def one_spelling(reading: Reading, readout: Readout) -> list[float]:
    """Each group's first token only: the other spellings dropped."""
    starts = [sum(reading.groups[:i]) for i in range(len(reading.groups))]
    return [readout.label_logits[start] for start in starts]


def rows_reversed(reading: Reading, readout: Readout) -> list[float]:
    return [float(v[0]) for v in readout.marked[::-1]]


ALTERED = {
    **dict.fromkeys(TEMPLATES, labels_reversed),
    "kev": swap_q_and_k,
    "clef": rows_reversed,
    "laya": wrong_column,
    "lfm2-d1": one_spelling,
    "lfm2-d1-omni": wrong_marker,
}


@pytest.mark.parametrize("kind", sorted(ALTERED))
def test_a_readout_read_wrong_is_caught(folder: Path, kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The comparison above can fail: with the readout altered, some answer moves past the tolerance."""
    if kind in BUILDERS:
        model = BUILDERS[kind](folder / f"altered-{kind}.gguf")
    else:
        model = decision_gguf(folder, kind, TEMPLATES[kind], TEMPERATURES)
    monkeypatch.setattr(Reading, "scores", ALTERED[kind])
    assert max(largest_gaps(model).values()) >= TOLERANCE


IMAGE_STATE = "The paper on the table, and what it says."
IMAGE_CASES = [(form, n) for form in ("images", "parts") for n in (1, 8)]  # llama.cpp takes at most 8


def image_gaps(
    model: Path, projector: Path, questions: dict[str, Any]
) -> tuple[list[tuple[str, int, str, float]], list[tuple[int, int]]]:
    """For each image request (1 and 8 images, as `images` data URLs and as chat-message parts), each
    question's largest gap between onepass's probabilities and llama-server's --mmproj ones, and the
    input tokens each counts. llama-server counts every prompt whole, onepass the prefix the prompts
    share once (docs/api.md): llama-server's count is onepass's plus that prefix once more for every
    prompt after the first, which is what the counts pair."""
    service = load_model(tiny_settings(model, mmproj=projector, n_ctx=4096, calibration="none"))
    gaps, counts = [], []
    try:
        batch = 2048 if model.stem.split("-")[0] in ("clef", "lfm2") else 512  # a prompt read whole: one batch
        peer = llama_server_with_mmproj(Path(NATIVE), model, projector, batch=batch)
        with peer as url, httpx.Client(timeout=120) as client:
            for form, n in IMAGE_CASES:
                body = with_images(IMAGE_STATE, questions, [photo(seed) for seed in range(n)], form)
                response = client.post(url + "/v1/systemone", json=body)
                assert response.status_code == 200, response.text
                theirs = response.json()
                request = request_of({"model": "m", **body})
                ours = service.answer(request).wire()
                plan = service.plan(request)
                n_prompts = len(plan.suffixes()) if plan.prefix.tokens else 1  # clef: one joint prompt
                counted = ours["usage"]["input_tokens"] + (n_prompts - 1) * len(plan.prefix.tokens)
                counts.append((counted, theirs["usage"]["input_tokens"]))
                for qid, question in questions.items():
                    gap = agreement(question["type"], ours["answers"][qid], theirs["answers"][qid]).largest_gap
                    gaps.append((form, n, qid, gap))
    finally:
        service.close()
    return gaps, counts


@pytest.mark.parametrize(("kind", "projector"), PAIRS)
def test_each_type_that_takes_images_answers_them_as_llama_server_with_mmproj(
    folder: Path, kind: str, projector: Projector
) -> None:
    gaps, counts = image_gaps(vision_decision_gguf(folder, kind, projector), mmproj(folder, projector), QUESTIONS)
    assert all(ours == theirs for ours, theirs in counts), counts
    assert max(gap for *_, gap in gaps) < TOLERANCE, gaps


def test_images_without_the_bos_rule_are_caught(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The comparison above can fail: with no BOS before an image prompt (the tiny llama vocabulary
    adds one, as libmtmd does then), the counts differ and the answers move past the tolerance."""
    init = PromptImages.__init__

    def without_bos(self: PromptImages, kind: str, vision: Any, tokenize: Any, bos: Any, eos: Any) -> None:
        init(self, kind, vision, tokenize, None, eos)

    monkeypatch.setattr(PromptImages, "__init__", without_bos)
    gaps, counts = image_gaps(vision_decision_gguf(folder, "openjev", "mlp"), mmproj(folder, "mlp"), QUESTIONS)
    assert all(ours < theirs for ours, theirs in counts), counts
    assert max(gap for *_, gap in gaps) >= TOLERANCE, gaps


@pytest.mark.real_model
def test_the_converted_default_model_answers_each_question_as_llama_cpp_does(real_model_path: Path) -> None:
    """One question a request, as llama-server with one slot decodes each question anyway: with the
    plain kernels the two give the same numbers to float precision. (Several questions in one
    request share onepass's one decode, which moves the last digits: docs/exactness.md.) Measured
    on the development machine: equal to 1e-8; the bound is llama.cpp's own, as above."""
    model = real_model_path.with_name(real_model_path.stem + "-decision.gguf")
    ticket = json.loads((Path(__file__).resolve().parent.parent / "examples" / "ticket.json").read_text())
    threads = os.cpu_count() or 1
    service = onepass_service(model, threads)
    try:
        with (
            llama_server(Path(NATIVE), model, 4096, threads, False, False) as peer,
            httpx.Client(timeout=600) as client,
        ):
            for qid, question in ticket["questions"].items():
                theirs = ask(client, peer.url, ticket["state"], {qid: question})[qid]
                body = {"model": "m", "state": ticket["state"], "questions": {qid: question}}
                ours = service.answer(SystemOneRequest.model_validate(body)).wire()["answers"][qid]
                found = agreement(question["type"], ours, theirs)
                assert found.same_answer and found.largest_gap < TOLERANCE, (qid, ours, theirs)
    finally:
        service.close()
