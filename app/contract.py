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
    questions: Annotated[dict[str, Question], Field(min_length=1)]
    assets: Any = None

    @field_validator("questions")
    @classmethod
    def _ids_are_not_empty(cls, questions: dict[str, Question]) -> dict[str, Question]:
        if "" in questions:
            raise ValueError("question ids must be non-empty strings")
        return questions

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
