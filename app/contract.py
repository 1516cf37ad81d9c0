"""The System One wire contract as pydantic models: validation and canonical text, no I/O.

Requests are validated here into typed questions; anything that fails becomes a 422 in
pydantic's own error shape (`errors_for_response`). Responses are plain dicts built by
the service, because their keys (option names, question ids) are user data.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictStr, ValidationError, field_validator

# A text field may be a string, an object or an array; the last two are rendered as canonical JSON.
Text = StrictStr | dict[str, Any] | list[Any]


def canonical_json(value: Any) -> str:
    """Sorted keys, no insignificant whitespace, UTF-8 (not ASCII-escaped): equal values, equal text."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def render_text(value: Text) -> str:
    return value if isinstance(value, str) else canonical_json(value)


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
    criteria: Annotated[dict[str, Text | None], Field(min_length=2, max_length=255)]


class ScoreQuestion(_Model):
    type: Literal["score"]
    instructions: Text | None = None
    criteria: Annotated[list[Text], Field(min_length=2, max_length=10)]


Question = Annotated[NoulQuestion | ChoiceQuestion | ScoreQuestion, Field(discriminator="type")]


class SystemOneRequest(_Model):
    model: StrictStr
    state: Text
    questions: Annotated[dict[Annotated[str, Field(min_length=1)], Question], Field(min_length=1)]
    assets: Any = None

    @field_validator("assets")
    @classmethod
    def _no_assets(cls, assets: Any) -> Any:
        if assets is not None:
            raise ValueError("image assets need a vision model; onepass serves text-only models")
        return assets


def errors_for_response(error: ValidationError, prefix: tuple[str | int, ...] = ("body",)) -> list[dict[str, Any]]:
    """pydantic's errors in the FastAPI shape: loc starts with "body"; everything JSON-safe."""
    details = []
    for item in error.errors(include_url=False):
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


def limit_errors(request: SystemOneRequest, max_questions: int, max_text_chars: int) -> list[dict[str, Any]]:
    """422 details for a request beyond the server's limits, found before any inference."""
    errors: list[dict[str, Any]] = []
    if len(request.questions) > max_questions:
        errors += validation_error(
            ("questions",),
            f"{len(request.questions)} questions; the limit is {max_questions}",
            "too_long",
            len(request.questions),
        )
    for qid, question in request.questions.items():
        texts: list[tuple[tuple[str | int, ...], Text | None]] = [(("instructions",), question.instructions)]
        if isinstance(question, NoulQuestion) and question.criteria is not None:
            texts += [(("criteria", "true"), question.criteria.true), (("criteria", "false"), question.criteria.false)]
        elif isinstance(question, ChoiceQuestion):
            texts += [(("criteria", name), name) for name in question.criteria]
            texts += [(("criteria", name), text) for name, text in question.criteria.items()]
        elif isinstance(question, ScoreQuestion):
            texts += [(("criteria", i), level) for i, level in enumerate(question.criteria)]
        for loc, text in texts:
            length = len(render_text(text)) if text is not None else 0
            if length > max_text_chars:
                errors += validation_error(
                    ("questions", qid, question.type, *loc),
                    f"text of {length} characters; the limit is {max_text_chars}",
                    "string_too_long",
                    length,
                )
    return errors


# Response shapes, for /openapi.json (the service builds plain dicts; extra x_ fields are allowed).


class _Answer(BaseModel):
    model_config = ConfigDict(extra="allow")
    x_label_mass: float | None = None


class NoulAnswer(_Answer):
    type: Literal["noul"]
    noul: Annotated[float, Field(ge=0, le=1)]


class ChoiceAnswer(_Answer):
    type: Literal["choice"]
    choice: str
    confidence: Annotated[float, Field(ge=0, le=1)]
    probabilities: dict[str, Annotated[float, Field(ge=0, le=1)]]


class ScoreAnswer(_Answer):
    type: Literal["score"]
    score: float
    confidence: Annotated[float, Field(ge=0, le=1)]
    legend: dict[str, Text]
    probabilities: dict[str, Annotated[float, Field(ge=0, le=1)]]


class Usage(BaseModel):
    input_tokens: int
    output_tokens: int


class SystemOneResponse(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: str
    answers: dict[str, Annotated[NoulAnswer | ChoiceAnswer | ScoreAnswer, Field(discriminator="type")]]
    usage: Usage


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
