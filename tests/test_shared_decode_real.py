"""On the real default model, requests decoded side by side (`batch_requests`) answer within the spread
docs/exactness.md states, and each response decoded beside others says so; one alone is unchanged."""

from __future__ import annotations

import math
import threading
from pathlib import Path
from typing import Any

import pytest

from app.engine.caller import Caller, Signal, working_for
from app.wire.contract import SystemOneRequest
from tests.support.loading import load_model
from tests.support.settings import isolated_settings
from tests.support.shared_decodes import context_lent, queued
from tests.support.waiting import until

pytestmark = pytest.mark.real_model

WAIT_S = 300  # four requests of the real model on a busy CPU take seconds
# docs/exactness.md: side by side, a label probability moved by up to 0.04 on the 2-core EPYC, in every
# kernel setting; the promise is under 0.1.
SPREAD = 0.1
STATES = [
    "I was charged twice for March and want my money back. This is the third time!",
    "The app crashes every time I open the settings page, since the last update.",
    "Thanks for the quick delivery, the chair is great and was easy to build.",
    "Please cancel my subscription at the end of this month and confirm by email.",
]
QUESTIONS: dict[str, Any] = {
    "refund": {"type": "noul", "instructions": "Does the customer ask for money back?"},
    "team": {
        "type": "choice",
        "instructions": "Which team handles it?",
        "criteria": {"Billing": "Payments and refunds", "Technical": "Bugs and outages", "Sales": "Purchases"},
    },
}


def body(state: str) -> SystemOneRequest:
    return SystemOneRequest.model_validate({"model": "m", "state": state, "questions": QUESTIONS})


def probabilities(answer: dict[str, Any]) -> list[float]:
    found = answer.get("probabilities")
    return list(found.values()) if found else [answer["noul"]]


def test_requests_side_by_side_answer_within_the_stated_spread(real_model_path: Path) -> None:
    settings = isolated_settings(
        model=real_model_path, n_ctx=4096, session_cache_disk_bytes=0, batch_requests=True, calibration="none"
    )
    service = load_model(settings)
    try:
        alone = [service.answer(body(state)).wire() for state in STATES]  # also caches every state
        assert all("other_requests" not in found["x_depends_on"] for found in alone)
        results: list[dict[str, Any] | None] = [None] * len(STATES)

        def answer(i: int) -> None:
            with working_for(Caller("interactive", Signal())):
                results[i] = service.answer(body(STATES[i])).wire()

        askers = [threading.Thread(target=answer, args=(i,), daemon=True) for i in range(len(STATES))]
        with context_lent(service.engine, WAIT_S):
            for asker in askers:
                asker.start()
            until(lambda: queued(service.engine) == len(STATES), WAIT_S)
        for asker in askers:
            asker.join(WAIT_S)
        assert all(found is not None for found in results)
        for before, found in zip(alone, results, strict=True):
            assert found is not None
            assert found["x_depends_on"][-1] == "other_requests"
            for qid, given in found["answers"].items():
                was = probabilities(before["answers"][qid])
                gaps = [abs(a - b) for a, b in zip(probabilities(given), was, strict=True)]
                assert max(gaps) < SPREAD, (qid, gaps)
                assert all(math.isfinite(p) for p in probabilities(given))
    finally:
        service.close()
