"""Answers depend on the state and the question alone: not on ids, order, or the other questions."""

from __future__ import annotations

import random
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.contract import SystemOneRequest
from app.service import ModelService

POOL: list[dict[str, Any]] = [
    {"type": "noul", "instructions": "Is the customer upset?"},
    {"type": "noul", "instructions": "Does it mention money?", "criteria": {"true": "a price or refund"}},
    {"type": "choice", "instructions": "Which team?", "criteria": {"Billing": "money", "Shipping": None, "Tech": None}},
    {"type": "choice", "criteria": {"yes": None, "no": None}},
    {"type": "score", "instructions": "How urgent?", "criteria": ["later", "soon", "now"]},
    {"type": "score", "criteria": ["1 star", "2 stars", "3 stars", "4 stars", "5 stars"]},
]
STATE = "My parcel never arrived and support has ignored me for two weeks."
# Other questions in the same batch shift the KV cells a question's suffix lands in, which changes
# the floating-point summation order inside attention (not what it attends to). On the tiny F32
# model that moves probabilities by far less than this bound; see the README on batch invariance.
BATCH_TOLERANCE = 1e-4

ids = st.text(min_size=1, max_size=12)
subsets = st.lists(st.integers(0, len(POOL) - 1), min_size=1, max_size=len(POOL), unique=True)


def ask(service: ModelService, questions: dict[str, dict[str, Any]]) -> dict[str, Any]:
    request = SystemOneRequest.model_validate({"model": "m", "state": STATE, "questions": questions})
    return service.answer(request)["answers"]  # type: ignore[no-any-return]


def reorder_options(question: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    if question["type"] != "choice":
        return question
    names = list(question["criteria"])
    rng.shuffle(names)
    return question | {"criteria": {name: question["criteria"][name] for name in names}}


def same_answer(a: dict[str, Any], b: dict[str, Any], tolerance: float = 0.0) -> bool:
    if a.keys() != b.keys() or a["type"] != b["type"]:
        return False
    for field in ("noul", "score", "confidence", "x_label_mass"):
        if field in a and abs(a[field] - b[field]) > tolerance:
            return False
    if "probabilities" in a:
        if set(a["probabilities"]) != set(b["probabilities"]):
            return False
        if any(abs(a["probabilities"][k] - b["probabilities"][k]) > tolerance for k in a["probabilities"]):
            return False
    return a.get("choice") == b.get("choice") or tolerance > 0


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    chosen=subsets,
    new_ids=st.lists(ids, min_size=len(POOL), max_size=len(POOL), unique=True),
    seed=st.integers(0, 2**32 - 1),
)
def test_renaming_ids_and_reordering_questions_and_options_changes_nothing(
    tiny_service: ModelService, chosen: list[int], new_ids: list[str], seed: int
) -> None:
    rng = random.Random(seed)
    original = ask(tiny_service, {f"q{i}": POOL[i] for i in chosen})
    shuffled = list(chosen)
    rng.shuffle(shuffled)
    renamed = ask(tiny_service, {new_ids[i]: reorder_options(POOL[i], rng) for i in shuffled})
    for i in chosen:
        assert renamed[new_ids[i]] == original[f"q{i}"]  # bit-identical


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(chosen=subsets)
def test_an_answer_does_not_change_when_other_questions_are_added(
    tiny_service: ModelService, chosen: list[int]
) -> None:
    together = ask(tiny_service, {f"q{i}": POOL[i] for i in chosen})
    for i in chosen:
        alone = ask(tiny_service, {"only": POOL[i]})["only"]
        assert same_answer(alone, together[f"q{i}"], BATCH_TOLERANCE), (alone, together[f"q{i}"])
