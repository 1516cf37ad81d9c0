"""The official Python SDK (typesafe-sdk) against a real onepass HTTP server running the tiny model.

The server is uvicorn in a background thread, serving a socket this module binds and listens on
itself, so requests queue in the listen backlog until uvicorn accepts them: no sleeps, no polling.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from backports.zstd import decompress as zstd_decompress
from typesafe_sdk import (
    Choice,
    ChoiceAnswer,
    ListModelsResponse,
    ModelMetadata,
    Noul,
    NoulAnswer,
    RetryPolicy,
    Score,
    ScoreAnswer,
    SystemOneResponse,
    TypeSafeAuthenticationError,
    TypeSafeClient,
    TypeSafeError,
    TypeSafeNotFoundError,
    TypeSafeUnprocessableEntityError,
)

from app.answering.service import ModelService
from app.serving.registry import ModelRegistry
from tests.support.live import RunningServer
from tests.support.settings import tiny_settings

TEAM_OPTIONS = ("Billing", "Técnico ✓", "Ventas")
QUESTIONS: dict[str, Any] = {
    "refund": Noul(instructions="Does the customer ask for money back?"),
    "team": Choice(
        instructions="Which team handles it?",
        criteria={"Billing": "Payments and refunds", "Técnico ✓": None, "Ventas": "New purchases"},
    ),
    "anger": Score(instructions="How frustrated is the customer?", criteria=["Calm", "Annoyed", "Furious"]),
}
# The same questions as they must appear on the wire (what a raw HTTP client posts).
RAW_QUESTIONS: dict[str, Any] = {
    "refund": {"type": "noul", "instructions": "Does the customer ask for money back?"},
    "team": {
        "type": "choice",
        "instructions": "Which team handles it?",
        "criteria": {"Billing": "Payments and refunds", "Técnico ✓": None, "Ventas": "New purchases"},
    },
    "anger": {
        "type": "score",
        "instructions": "How frustrated is the customer?",
        "criteria": ["Calm", "Annoyed", "Furious"],
    },
}
STATES: list[Any] = [
    "I was charged twice for March and want my money back.",
    {"subject": "Doppelte Abbuchung", "messages": ["charged twice", "refund please"], "priority": 2},
]
NO_RETRY = RetryPolicy(max_retries=0)


@pytest.fixture(scope="module")
def tiny_registry(tiny_service: ModelService) -> ModelRegistry:
    return ModelRegistry.serving(tiny_service)


@pytest.fixture(scope="module")
def base_url(tiny_chat_path: Path, tiny_registry: ModelRegistry) -> Iterator[str]:
    running = RunningServer(tiny_settings(tiny_chat_path), tiny_registry)
    try:
        yield running.base_url
    finally:
        running.stop()


@pytest.fixture(scope="module")
def auth_base_url(tiny_chat_path: Path, tiny_registry: ModelRegistry) -> Iterator[str]:
    running = RunningServer(tiny_settings(tiny_chat_path, api_key="k1"), tiny_registry)
    try:
        yield running.base_url
    finally:
        running.stop()


@pytest.fixture(autouse=True)
def no_sdk_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("TYPESAFE_API_KEY", "TYPESAFE_BASE_URL", "TYPESAFE_DEFAULT_MODEL"):
        monkeypatch.delenv(name, raising=False)


def sdk(base_url: str, api_key: str = "unused", **options: Any) -> TypeSafeClient:
    return TypeSafeClient(api_key=api_key, base_url=base_url, retry=NO_RETRY, timeout=60.0, **options)


def raw_post(base_url: str, body: dict[str, Any], api_key: str | None = None) -> dict[str, Any]:
    headers = {} if api_key is None else {"Authorization": f"Bearer {api_key}"}
    response = httpx.post(base_url + "/v1/systemone", json=body, headers=headers, timeout=60.0)
    assert response.status_code == 200, response.text
    data: dict[str, Any] = response.json()
    return data


def sent_body(result: SystemOneResponse) -> Any:
    """The JSON body the SDK actually sent, decompressed when it was compressed."""
    request = result.raw_http_response.request
    content = request.content
    if request.headers.get("content-encoding") == "zstd":
        content = zstd_decompress(content)
    return json.loads(content)


def assert_matches_raw(result: SystemOneResponse, raw: dict[str, Any]) -> None:
    assert isinstance(result, SystemOneResponse)
    assert result.model == raw["model"] == "tiny-chat"
    assert (result.usage.input_tokens, result.usage.output_tokens) == (
        raw["usage"]["input_tokens"],
        raw["usage"]["output_tokens"],
    )
    assert list(result.answers) == list(raw["answers"]) == ["refund", "team", "anger"]
    # Whole answers: the typed SDK objects serialize back to exactly what the server sent, less the
    # contract's `x_` extension fields (e.g. x_label_mass), which the SDK ignores.
    contract_answers = {
        name: {key: value for key, value in answer.items() if not key.startswith("x_")}
        for name, answer in raw["answers"].items()
    }
    assert {name: answer.model_dump(mode="json") for name, answer in result.answers.items()} == contract_answers

    assert set(result.nouls) == {"refund"} and set(result.choices) == {"team"} and set(result.scores) == {"anger"}
    refund, team, anger = result.nouls["refund"], result.choices["team"], result.scores["anger"]
    assert isinstance(refund, NoulAnswer) and isinstance(team, ChoiceAnswer) and isinstance(anger, ScoreAnswer)

    assert refund.noul == raw["answers"]["refund"]["noul"] and 0.0 <= refund.noul <= 1.0

    assert team.choice in TEAM_OPTIONS
    assert list(team.probabilities) == list(TEAM_OPTIONS)
    assert team.probabilities == raw["answers"]["team"]["probabilities"]
    assert team.choice == max(team.probabilities, key=team.probabilities.__getitem__)
    assert team.confidence == raw["answers"]["team"]["confidence"]
    assert sum(team.probabilities.values()) == pytest.approx(1.0)

    # The SDK turns the score maps' JSON string keys into integer levels.
    assert anger.legend == {0: "Calm", 1: "Annoyed", 2: "Furious"}
    assert anger.probabilities == {int(k): v for k, v in raw["answers"]["anger"]["probabilities"].items()}
    assert anger.score == raw["answers"]["anger"]["score"]
    assert anger.score == pytest.approx(sum(level * p for level, p in anger.probabilities.items()))
    assert anger.confidence == raw["answers"]["anger"]["confidence"]


@pytest.mark.parametrize("state", STATES, ids=["text-state", "object-state"])
def test_sdk_parses_every_answer_type_as_the_server_sent_it(base_url: str, state: Any) -> None:
    with sdk(base_url, compression=False) as client:
        result = client.system_one(state=state, questions=QUESTIONS, model="jev-latest")
    body = {"state": state, "model": "jev-latest", "questions": RAW_QUESTIONS}
    assert "content-encoding" not in result.raw_http_response.request.headers
    assert sent_body(result) == body  # the raw request below is the very same request
    assert_matches_raw(result, raw_post(base_url, body))


@pytest.mark.parametrize("state", STATES, ids=["text-state", "object-state"])
def test_sdk_zstd_compressed_bodies_are_decoded_by_the_server(base_url: str, state: Any) -> None:
    padding = "Further context, repeated to pass the SDK's compression threshold. " * 20
    big_state = state + " " + padding if isinstance(state, str) else {**state, "history": padding}
    body = {"state": big_state, "model": "jev-latest", "questions": RAW_QUESTIONS}
    assert len(json.dumps(body, ensure_ascii=False).encode()) > 1024
    with sdk(base_url, compression="zstd") as client:
        result = client.system_one(state=big_state, questions=QUESTIONS, model="jev-latest")
    request = result.raw_http_response.request
    assert request.headers["content-encoding"] == "zstd"
    assert len(request.content) < 1024  # really compressed, not merely labelled
    assert sent_body(result) == body
    assert_matches_raw(result, raw_post(base_url, body))


def test_sdk_below_the_threshold_sends_identity_even_with_zstd(base_url: str) -> None:
    with sdk(base_url, compression="zstd") as client:
        result = client.system_one(state="short", questions={"refund": QUESTIONS["refund"]})
    assert "content-encoding" not in result.raw_http_response.request.headers
    assert set(result.nouls) == {"refund"} and result.model == "tiny-chat"


def test_sdk_default_model_is_jev_latest_and_served_by_the_default_model(base_url: str) -> None:
    with sdk(base_url, compression=False) as client:
        result = client.system_one(state=STATES[0], questions=QUESTIONS)
    assert sent_body(result)["model"] == "jev-latest"
    assert_matches_raw(
        result, raw_post(base_url, {"state": STATES[0], "model": "tiny-chat", "questions": RAW_QUESTIONS})
    )


def test_sdk_lists_the_served_models(base_url: str) -> None:
    with sdk(base_url) as client:
        listing = client.models.list()
    assert isinstance(listing, ListModelsResponse)
    raw = httpx.get(base_url + "/v1/models", timeout=30.0).json()
    system_one_fields = [{k: v for k, v in entry.items() if not k.startswith("x_")} for entry in raw["models"]]
    assert [model.model_dump() for model in listing.models] == system_one_fields
    assert all(isinstance(model, ModelMetadata) for model in listing.models)
    assert [model.name for model in listing.models] == ["tiny-chat", "jev-latest"]


def test_sdk_with_the_right_key_is_served(auth_base_url: str) -> None:
    with sdk(auth_base_url, api_key="k1", compression=False) as client:
        result = client.system_one(state=STATES[0], questions=QUESTIONS, model="jev-latest")
        listing = client.models.list()
    body = {"state": STATES[0], "model": "jev-latest", "questions": RAW_QUESTIONS}
    assert_matches_raw(result, raw_post(auth_base_url, body, api_key="k1"))
    assert "jev-latest" in [model.name for model in listing.models]


def test_sdk_with_a_wrong_key_raises_its_authentication_error(auth_base_url: str) -> None:
    with sdk(auth_base_url, api_key="k2") as client:
        with pytest.raises(TypeSafeAuthenticationError) as answered:
            client.system_one(state=STATES[0], questions=QUESTIONS)
        with pytest.raises(TypeSafeAuthenticationError) as listed:
            client.models.list()
    for error in (answered.value, listed.value):
        assert error.status == 401
        assert error.body == {
            "detail": {
                "error_type": "authentication_error",
                "message": "a valid 'Authorization: Bearer <key>' header is required",
            }
        }
        assert "a valid 'Authorization: Bearer <key>' header is required" in str(error)


def test_sdk_unknown_model_raises_its_not_found_error(base_url: str) -> None:
    with sdk(base_url) as client, pytest.raises(TypeSafeNotFoundError) as raised:
        client.system_one(state=STATES[0], questions=QUESTIONS, model="gpt-5")
    error = raised.value
    assert error.status == 404
    assert error.body["detail"]["error_type"] == "model_not_found"
    assert str(error) == (
        f"POST {base_url}/v1/systemone: 404 model 'gpt-5' is not served here; known models: tiny-chat, jev-latest"
    )


@pytest.mark.parametrize(
    "question",
    [
        {"type": "choice", "instructions": "Which team?", "criteria": {"Billing": None}},
        Choice(instructions="Which team?", criteria={"Billing": None}),
    ],
    ids=["raw-dict", "choice-object"],
)
def test_sdk_one_option_choice_reaches_the_server_and_raises_unprocessable(base_url: str, question: Any) -> None:
    with sdk(base_url) as client, pytest.raises(TypeSafeUnprocessableEntityError) as raised:
        client.system_one(state=STATES[0], questions={"team": question})
    error = raised.value
    assert error.status == 422
    [detail] = error.body["detail"]
    assert detail["loc"] == ["body", "questions", "team", "choice", "criteria"]
    assert detail["type"] == "too_short"
    assert f"questions.team.choice.criteria: {detail['msg']}" in str(error)


def test_sdk_one_level_score_reaches_the_server_and_raises_unprocessable(base_url: str) -> None:
    # The SDK's Score accepts one level (min_length=1); onepass needs at least two.
    with sdk(base_url) as client, pytest.raises(TypeSafeUnprocessableEntityError) as raised:
        client.system_one(state=STATES[0], questions={"anger": Score(criteria=["Calm"])})
    assert [d["loc"] for d in raised.value.body["detail"]] == [["body", "questions", "anger", "score", "criteria"]]


def test_sdk_rejects_empty_questions_before_sending(base_url: str) -> None:
    with sdk(base_url) as client, pytest.raises(TypeSafeError) as raised:
        client.system_one(state=STATES[0], questions={})
    assert type(raised.value) is TypeSafeError
    assert str(raised.value) == "At least one question is required."
