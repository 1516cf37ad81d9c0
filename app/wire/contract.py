"""The System One wire contract: the request, response and error shapes as pydantic models, no I/O.

Requests are validated here into typed questions; anything that fails becomes a 422 in
pydantic's own error shape (`errors_for_response`). Responses are the models below (the same ones
/openapi.json describes); app/answering/answers.py builds each answer from its probabilities, and
app/wire/limits.py checks a request against the server's limits. What else is here is how the
shapes read: a text's canonical form, a question's labels and texts, which rooms below answering/
(calibration, fitting, fleet) read too.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from functools import cached_property
from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, StrictFloat, StrictStr, ValidationError

from app.wire.images import MAX_IMAGES, NO_MEDIA, Media

# A text field may be a string, an object or an array; the last two are rendered as canonical JSON.
Text = StrictStr | dict[str, Any] | list[Any]
# A choice's options, at most: llama.cpp's limit, which every prompt onepass builds keeps too.
MAX_OPTIONS = 255


def canonical_json(value: Any) -> str:
    """Sorted keys, no insignificant whitespace, UTF-8 (not ASCII-escaped): equal values, equal text."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def render_text(value: Text) -> str:
    return value if isinstance(value, str) else canonical_json(value)


def render_state(state: Text) -> str:
    """The state as it enters the prompt, the cache key and the routing key: canonical JSON for
    structures, surrounding space trimmed."""
    return render_text(state).strip()


class _Model(BaseModel):
    # Unknown fields are ignored, as the hosted API does.
    model_config = ConfigDict(extra="ignore", frozen=True)


class NoulCriteria(_Model):
    true: Text | None = None
    false: Text | None = None


class NoulQuestion(_Model):
    type: Literal["noul"]
    instructions: Text | None = None
    criteria: NoulCriteria | None = None


class ChoiceQuestion(_Model):
    type: Literal["choice"]
    instructions: Text | None = None
    criteria: Annotated[dict[str, Text | None], Field(min_length=2, max_length=MAX_OPTIONS)]


class ScoreQuestion(_Model):
    type: Literal["score"]
    instructions: Text | None = None
    criteria: Annotated[list[Text], Field(min_length=2, max_length=10)]


Question = Annotated[NoulQuestion | ChoiceQuestion | ScoreQuestion, Field(discriminator="type")]


class ImageAsset(_Model):
    """Jev's image asset: its bytes as base64 (`format` is then required, though the bytes decide), or
    the multipart part holding them (`data_base64` is then ignored)."""

    type: Literal["image"] = "image"
    format: Literal["png", "jpg", "jpeg"] | None = None
    data_base64: StrictStr | None = None
    part: StrictStr | None = None


class SystemOneRequest(_Model):
    """A request; once app/wire/assets.py has read its images, `media` holds them, the fields that carried
    them are gone (image parts of a chat-message state too), and the texts keep their placeholders."""

    model: StrictStr
    state: Text
    questions: Annotated[dict[Annotated[str, Field(min_length=1)], Question], Field(min_length=1)]
    assets: Annotated[dict[str, ImageAsset], Field(min_length=1, max_length=MAX_IMAGES)] | None = None  # Jev's
    images: list[StrictStr] | None = None  # data URLs, before the state (llama.cpp's; `files` is its alias)
    files: list[StrictStr] | None = None
    # How often a fitted answer's x_set is to hold the right label (None: the model's default).
    x_coverage: Annotated[StrictFloat, Field(gt=0, lt=1)] | None = None
    _media: Media = PrivateAttr(default=NO_MEDIA)

    @cached_property
    def state_text(self) -> str:
        """The state as the prompt, the cache key and the routing key see it (render_state): rendered
        once per request. Image placeholders are kept as sent."""
        return render_state(self.state)

    @property
    def media(self) -> Media:
        """The images, in prompt order, and the placeholders the texts refer to them by."""
        return self._media

    def carrying(self, state: Text, media: Media) -> SystemOneRequest:
        """This request with its images read: `state` without its image parts, `media` holding them."""
        request = SystemOneRequest(model=self.model, state=state, questions=self.questions, x_coverage=self.x_coverage)
        request._media = media
        return request

    def texts(self) -> Iterator[Text]:
        """Where placeholders are looked for, in the order that decides the images' order: the state,
        then each question's texts (question_texts)."""
        yield self.state
        for question in self.questions.values():
            yield from (text for _, text in question_texts(question) if text is not None)

    def render(self, value: Text, marker: Callable[[int], str]) -> str:
        """A text as render_text has it, each image placeholder replaced by marker(its image's index)
        (a media marker, or "" where the images go before the state)."""
        return render_text(self.media.substitute(value, marker))


def label_keys(question: Question) -> list[str]:
    """A question's labels by name, in the order its probabilities come: "true"/"false", the option
    names as sent, the level indices. What a fit's parameters are keyed by."""
    if isinstance(question, NoulQuestion):
        return ["true", "false"]
    if isinstance(question, ChoiceQuestion):
        return list(question.criteria)
    return [str(i) for i in range(len(question.criteria))]


def question_set_key(questions: Mapping[str, Question]) -> str:
    """A request's questions as a set, by content: ids, order and repeats aside. Requests with the same
    key and state share one question-first prefix (the prompt numbers each distinct question once)."""
    return canonical_json(sorted({canonical_json(q.model_dump(mode="json")) for q in questions.values()}))


# Jev 1.14's box question locates a thing in an image: no head here answers that.
NO_BOX = "onepass has no box head: no model here reads a box; ask a noul, choice or score question"


def errors_for_response(error: ValidationError, prefix: tuple[str | int, ...] = ("body",)) -> list[dict[str, Any]]:
    """pydantic's errors in the FastAPI shape: loc starts with "body"; everything JSON-safe. A box
    question gets its own type and message."""
    details = []
    for item in error.errors(include_url=False):
        if item["type"] == "union_tag_invalid" and item.get("ctx", {}).get("tag") == "box":
            loc = [*prefix, *item["loc"]]
            details.append({"loc": loc, "msg": NO_BOX, "type": "box_unsupported", "input": item["input"]})
            continue
        detail: dict[str, Any] = {
            "loc": [*prefix, *item["loc"]],
            "msg": item["msg"],
            "type": item["type"],
            "input": item.get("input"),
        }
        if "ctx" in item:
            detail["ctx"] = {key: _json_safe(value) for key, value in item["ctx"].items()}
        details.append(detail)
    return details


def _json_safe(value: Any) -> Any:
    return value if isinstance(value, str | int | float | bool | type(None)) else str(value)


def validation_error(loc: tuple[str | int, ...], msg: str, type_: str, input_: Any) -> list[dict[str, Any]]:
    """A single 422 detail entry for checks made outside pydantic (e.g. the token budget)."""
    return [{"loc": ["body", *loc], "msg": msg, "type": type_, "input": input_}]


def question_texts(question: Question) -> list[tuple[tuple[str | int, ...], Text | None]]:
    """A question's texts, each with where it is, in order: its instructions, then its criteria (a
    choice's option names, then their descriptions)."""
    texts: list[tuple[tuple[str | int, ...], Text | None]] = [(("instructions",), question.instructions)]
    if isinstance(question, NoulQuestion) and question.criteria is not None:
        texts += [(("criteria", "true"), question.criteria.true), (("criteria", "false"), question.criteria.false)]
    elif isinstance(question, ChoiceQuestion):
        texts += [(("criteria", name), name) for name in question.criteria]
        texts += [(("criteria", name), text) for name, text in question.criteria.items()]
    elif isinstance(question, ScoreQuestion):
        texts += [(("criteria", i), level) for i, level in enumerate(question.criteria)]
    return texts


# Responses: the service builds these, the wire is their JSON (fields that are None left out),
# and /openapi.json is generated from the same classes, so the three cannot drift apart.

Probability = Annotated[float, Field(ge=0, le=1)]


class CalibrationUsed(BaseModel):
    """A fit from the user's own examples answered this question (POST /v1/calibrations)."""

    id: str
    method: str
    examples: int


class AnswerSet(BaseModel):
    """The labels that hold the right one with probability `coverage`, by split conformal prediction on
    the held-out answers of the fit that answered (docs/calibration.md): a noul's true/false, a
    choice's option names (most probable first), a score's levels (a run of adjacent ones, in order);
    none where no label is probable enough at that coverage."""

    labels: list[bool] | list[str]
    coverage: Probability


class NoulAnswer(BaseModel):
    type: Literal["noul"] = "noul"
    noul: Probability
    # the share of the next-token distribution on the answer labels; absent for a decision head
    x_label_mass: Probability | None = None
    x_raw: Probability | None = None  # before calibration (absent when calibration is off)
    x_calibration: CalibrationUsed | None = None
    x_set: AnswerSet | None = None


class ChoiceAnswer(BaseModel):
    type: Literal["choice"] = "choice"
    choice: str
    confidence: Probability
    probabilities: dict[str, Probability]
    x_label_mass: Probability | None = None
    x_raw: dict[str, Probability] | None = None
    x_calibration: CalibrationUsed | None = None
    x_set: AnswerSet | None = None


class ScoreAnswer(BaseModel):
    type: Literal["score"] = "score"
    score: float
    confidence: Probability
    legend: dict[str, Text]
    probabilities: dict[str, Probability]
    x_label_mass: Probability | None = None
    x_raw: dict[str, Probability] | None = None
    x_calibration: CalibrationUsed | None = None
    x_set: AnswerSet | None = None


Answer = Annotated[NoulAnswer | ChoiceAnswer | ScoreAnswer, Field(discriminator="type")]


class Usage(BaseModel):
    input_tokens: int
    output_tokens: int


class TimingMs(BaseModel):
    prefill: float
    restore: float
    decode: float
    calibrate: float
    total: float


# What, besides the state and a question itself, an answer may depend on: the question ids, the order
# of the questions, the order of a choice's options, which other questions are asked (more than by
# rounding). docs/exactness.md's table says which prompt, layout and decision type depends on which.
DependsOn = Literal["ids", "question_order", "option_order", "other_questions"]
DEPENDS_ON: tuple[DependsOn, ...] = get_args(DependsOn)
# Besides those of its prompt: the other requests decoded in the same llama_decode (the setting
# batch_requests), which move an answer by the spread docs/exactness.md measured.
OTHER_REQUESTS: Literal["other_requests"] = "other_requests"
# One enum in the schema: what a prompt may depend on, then the decode's company.
ResponseDependsOn = Literal["ids", "question_order", "option_order", "other_questions", "other_requests"]


class SystemOneResponse(BaseModel):
    model: str
    answers: dict[str, Answer]
    usage: Usage
    x_cache: Literal["hit", "disk", "miss", "off"]
    x_timing_ms: TimingMs
    # The prompt layout that answered: question-first answers depend on the set of questions asked.
    x_layout: Literal["state-first", "question-first"] | None = None
    # What this response's answers may depend on besides the state and each question (DependsOn), in
    # DEPENDS_ON's order, then OTHER_REQUESTS when other requests shared its decode; empty: nothing, to
    # rounding.
    x_depends_on: list[ResponseDependsOn] | None = None

    def to_json(self) -> bytes:
        return self.model_dump_json(exclude_none=True).encode()

    def wire(self) -> dict[str, Any]:
        """What a client reads: the response as parsed JSON."""
        return self.model_dump(mode="json", exclude_none=True)


class ValidationDetail(BaseModel):
    loc: list[str | int]
    msg: str
    type: str
    input: Any = None
    ctx: dict[str, Any] | None = None


class ValidationErrorResponse(BaseModel):
    detail: list[ValidationDetail]


class ErrorDetail(BaseModel):
    error_type: str
    message: str


class ErrorResponse(BaseModel):
    detail: ErrorDetail


# A batch (onepass's own, in the shape Ollama passes through): several requests in one body, each
# validated and answered on its own. What it answers, and what its job and a fitting job report:
# app/wire/contract_jobs.py.


class BatchRequest(_Model):
    """`requests`: each item a whole request, as POST /v1/systemone takes one; an item that is not
    valid fails alone, so items are validated one by one, not here."""

    requests: Annotated[list[Any], Field(min_length=1)]
