"""max_prompt_tokens: a request whose prompts would have its model read more tokens than the budget is
refused with a 413 before any inference, a single request and each item of a batch alike."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from app.answering.service import ModelService, prompt_tokens
from app.http.server import create_app
from app.serving.registry import ModelRegistry
from app.wire.contract import SystemOneRequest
from tests.support.loading import load_model
from tests.support.settings import tiny_settings

LATE = {"type": "noul", "instructions": "Was it late?"}
UNDER: dict[str, Any] = {"model": "jev-latest", "state": "The parcel arrived late.", "questions": {"late": LATE}}
OVER = {**UNDER, "questions": {"late": LATE, "box": {"type": "noul", "instructions": "Was the box hurt?"}}}


def needed(service: ModelService, body: dict[str, Any]) -> int:
    return prompt_tokens(service.plan(SystemOneRequest.model_validate(body)))


@pytest.fixture(scope="module")
def budgeted(tiny_chat_path: Path, tiny_service: ModelService) -> Iterator[TestClient]:
    """A server whose model may read exactly what UNDER needs."""
    budget = needed(tiny_service, UNDER)
    assert needed(tiny_service, OVER) > budget
    settings = tiny_settings(tiny_chat_path, max_prompt_tokens=budget)
    service = load_model(settings)
    try:
        with TestClient(create_app(settings, registry=ModelRegistry.serving(service))) as client:
            yield client
    finally:
        service.close()


def test_a_request_over_the_budget_is_413_and_one_within_it_is_answered(budgeted: TestClient) -> None:
    refused = budgeted.post("/v1/systemone", json=OVER)
    assert refused.status_code == 413
    assert refused.json()["detail"]["error_type"] == "request_too_large"
    assert "over the budget of" in refused.json()["detail"]["message"]
    answered = budgeted.post("/v1/systemone", json=UNDER)
    assert answered.status_code == 200
    assert answered.json()["x_cache"] == "miss"  # nothing was prefilled for the refused one's state either


def test_the_budget_is_what_usage_counts(budgeted: TestClient, tiny_service: ModelService) -> None:
    answered = budgeted.post("/v1/systemone", json={**UNDER, "state": "Another parcel."})
    assert answered.json()["usage"]["input_tokens"] == needed(tiny_service, {**UNDER, "state": "Another parcel."})


def test_each_batch_item_gets_its_own_413(budgeted: TestClient) -> None:
    response = budgeted.post("/v1/systemone", json={"requests": [OVER, {**UNDER, "state": "A third parcel."}]})
    assert response.status_code == 200
    over, under = response.json()["results"]
    assert over["error"]["status"] == 413
    assert over["error"]["detail"]["error_type"] == "request_too_large"
    assert "answers" in under
