"""The System One wire contract as pydantic models: validation and canonical text, no I/O.

Requests are validated here into typed questions; anything that fails becomes a 422 in
pydantic's own error shape (`errors_for_response`). Responses are built from the models below (the
same ones /openapi.json describes), each answer by `answer_of` with the contract's confidence formulas.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, StrictStr, ValidationError, field_validator

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


class SystemOneRequest(_Model):
    model: StrictStr
    state: Text
    questions: Annotated[dict[Annotated[str, Field(min_length=1)], Question], Field(min_length=1)]
    assets: Any = None

    @cached_property
    def state_text(self) -> str:
        """The state as the prompt, the cache key and the routing key see it (render_state): rendered
        once per request."""
        return render_state(self.state)

    @field_validator("assets")
    @classmethod
    def _no_assets(cls, assets: Any) -> Any:
        if assets is not None:
            raise ValueError("image assets need a vision model; onepass serves text-only models")
        return assets


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


# Responses: the service builds these, the wire is their JSON (fields that are None left out),
# and /openapi.json is generated from the same classes, so the three cannot drift apart.

Probability = Annotated[float, Field(ge=0, le=1)]


class CalibrationUsed(BaseModel):
    """A fit from the user's own examples answered this question (POST /v1/calibrations)."""

    id: str
    method: str
    examples: int


class NoulAnswer(BaseModel):
    type: Literal["noul"] = "noul"
    noul: Probability
    # the share of the next-token distribution on the answer labels; absent for a decision head
    x_label_mass: Probability | None = None
    x_raw: Probability | None = None  # before calibration (absent when calibration is off)
    x_calibration: CalibrationUsed | None = None


class ChoiceAnswer(BaseModel):
    type: Literal["choice"] = "choice"
    choice: str
    confidence: Probability
    probabilities: dict[str, Probability]
    x_label_mass: Probability | None = None
    x_raw: dict[str, Probability] | None = None
    x_calibration: CalibrationUsed | None = None


class ScoreAnswer(BaseModel):
    type: Literal["score"] = "score"
    score: float
    confidence: Probability
    legend: dict[str, Text]
    probabilities: dict[str, Probability]
    x_label_mass: Probability | None = None
    x_raw: dict[str, Probability] | None = None
    x_calibration: CalibrationUsed | None = None


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


class SystemOneResponse(BaseModel):
    model: str
    answers: dict[str, Answer]
    usage: Usage
    x_cache: Literal["hit", "disk", "miss", "off"]
    x_timing_ms: TimingMs
    # The prompt layout that answered: question-first answers depend on the set of questions asked.
    x_layout: Literal["state-first", "question-first"] | None = None
    # What this response's answers may depend on besides the state and each question (DependsOn), in
    # DEPENDS_ON's order; empty: nothing, to rounding.
    x_depends_on: list[DependsOn] | None = None

    def to_json(self) -> bytes:
        return self.model_dump_json(exclude_none=True).encode()

    def wire(self) -> dict[str, Any]:
        """What a client reads: the response as parsed JSON."""
        return self.model_dump(mode="json", exclude_none=True)


@dataclass(frozen=True)
class CatalogueEntry:
    """One name /v1/models lists: a model's own name or an alias, and the model it means."""

    name: str
    model: str
    file_name: str  # the GGUF's file name
    settings: dict[str, Any]  # the model's per-model settings as JSON values: each is reported as x_<name>
    loaded: bool
    error: str | None
    decision_type: str | None = None  # a decision GGUF's format (app/answering/decision.py); None: onepass's own prompt


# A setting shown on /v1/models under another name than x_<setting>: an answer's x_calibration is the fit it used.
SETTING_FIELDS = {"calibration": "calibration_mode"}


def models_listing(entries: list[CatalogueEntry]) -> dict[str, Any]:
    """GET /v1/models in both shapes clients expect: OpenAI's `data` and System One's `models`."""
    return {
        "object": "list",
        "data": [
            {
                "id": e.name,
                "object": "model",
                "owned_by": "onepass",
                "x_model": e.model,
                "x_loaded": e.loaded,
                "x_decision_type": e.decision_type,
            }
            for e in entries
        ],
        "models": [
            {
                "name": e.name,
                "description": f"{e.file_name} served by onepass"
                + ("" if e.name == e.model else f" (alias of {e.model})"),
                "release_date": "unknown",
                "x_model": e.model,
                "x_loaded": e.loaded,
                "x_error": e.error,
                "x_decision_type": e.decision_type,
                **{f"x_{SETTING_FIELDS.get(key, key)}": value for key, value in e.settings.items()},
            }
            for e in entries
        ],
    }


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
# validated and answered on its own. The results are built as the single answers and errors are; these
# classes validate the envelope and describe the results in /openapi.json.


class BatchRequest(_Model):
    """`requests`: each item a whole request, as POST /v1/systemone takes one; an item that is not
    valid fails alone, so items are validated one by one, not here."""

    requests: Annotated[list[Any], Field(min_length=1)]


class ItemError(BaseModel):
    status: int  # what the item would have been answered alone
    detail: list[ValidationDetail] | ErrorDetail  # that answer's detail: a 422's list, else the object


class BatchItemError(BaseModel):
    error: ItemError


class BatchResponse(BaseModel):
    results: list[SystemOneResponse | BatchItemError]  # one per request, in the request's order


class _Job(BaseModel):
    def wire(self) -> dict[str, Any]:
        """The job as a client reads it: each of its own fields, null ones too (every one is given when
        the job is built), and what it carries (a result, a report) with the fields it had when made."""
        return self.model_dump(mode="json", by_alias=True, exclude_unset=True)


class BatchJob(_Job):
    """A batch answered by a background job: its progress, and its results once it has ended."""

    id: str
    status: Literal["running", "done", "cancelled", "failed"]
    done: int  # requests with their result (those that failed validation count from the start)
    total: int
    errors: int  # results that are errors, so far
    eta_s: float | None  # seconds left at the pace so far, while running
    results: list[SystemOneResponse | BatchItemError | None] | None  # None while running; an item None: not run
    error: str | None  # why the job failed


# A fitting job (POST /v1/calibrations): its progress, then the fits it stored and a report per question.


class StoredFit(BaseModel):
    id: str
    key: str  # the question's content key
    method: str
    examples: int


class ReliabilityBin(BaseModel):
    from_: float = Field(alias="from")
    to: float
    n: int
    confidence: float
    accuracy: float


class FitScores(BaseModel):
    """Cross-validated scores of one way of calibrating a question."""

    n: int
    accuracy: float
    log_loss: float
    brier: float
    ece: float
    reliability: list[ReliabilityBin]


class FitReport(BaseModel):
    """What fitting one question (by content) found."""

    key: str
    name: str
    ids: list[str]
    question: dict[str, Any]
    labelled: int
    unlabelled: int
    method: str  # the method adopted; "contextual" when none was
    adopted: bool
    folds: int | None
    before: FitScores | None
    after: FitScores | None
    candidates: dict[str, float]  # each candidate's cross-validated log loss
    warning: str | None
    error: str | None


class FitError(BaseModel):
    """A question that could not be fitted or stored."""

    key: str
    name: str
    ids: list[str]
    error: str


class CalibrationJob(_Job):
    """A fitting job: its progress, then the fits it stored and its report."""

    id: str
    model: str  # the configured name of the model it fits
    status: Literal["running", "done", "done, with errors", "failed", "cancelled"]
    done: int  # examples done (reused ones included)
    total: int
    eta_s: float | None  # seconds left at the pace so far, while running
    reused: int  # examples whose evidence an earlier run had kept
    fits: list[StoredFit]
    report: list[FitReport] | None  # None while running
    error: str | None  # why the job failed
    errors: list[FitError]


# The answer for one question, from its probabilities ------------------------------------------------


def answer_of(
    question: Question,
    probabilities: list[float],
    mass: float | None,
    raw: list[float] | None = None,
    fit: CalibrationUsed | None = None,
) -> Answer:
    """The answer in `question`'s type; `raw` (before calibration) is reported as x_raw when given,
    `fit` (the user's fit that gave the probabilities) as x_calibration."""
    if isinstance(question, NoulQuestion):
        return NoulAnswer(
            noul=probabilities[0], x_label_mass=mass, x_raw=raw[0] if raw is not None else None, x_calibration=fit
        )
    if isinstance(question, ChoiceQuestion):
        by_name = dict(zip(question.criteria, probabilities, strict=True))
        # Ties go to the first name in sorted order, so option order never changes the choice.
        best = max(sorted(by_name), key=by_name.__getitem__)
        return ChoiceAnswer(
            choice=best,
            confidence=choice_confidence(probabilities),
            probabilities=by_name,
            x_label_mass=mass,
            x_raw=dict(zip(question.criteria, raw, strict=True)) if raw is not None else None,
            x_calibration=fit,
        )
    return ScoreAnswer(
        score=expected_score(probabilities),
        confidence=score_confidence(probabilities),
        legend={str(i): level for i, level in enumerate(question.criteria)},
        probabilities={str(i): p for i, p in enumerate(probabilities)},
        x_label_mass=mass,
        x_raw={str(i): p for i, p in enumerate(raw)} if raw is not None else None,
        x_calibration=fit,
    )


def choice_confidence(probabilities: Sequence[float]) -> float:
    """(max_p - 1/n) / (1 - 1/n): 0 for a uniform answer, 1 for a certain one."""
    n = len(probabilities)
    return _unit((max(probabilities) - 1 / n) / (1 - 1 / n))


def uniform_spread(n: int) -> float:
    """u(n) = sum_i |i - (n-1)/2| / n: the mean distance from the middle level of a uniform answer."""
    middle = (n - 1) / 2
    return math.fsum(abs(i - middle) for i in range(n)) / n


def score_confidence(probabilities: Sequence[float]) -> float:
    """1 - sum_i p_i |i - m| / u(n), clamped at 0, where m is the most likely level."""
    m = max(range(len(probabilities)), key=probabilities.__getitem__)
    spread = math.fsum(p * abs(i - m) for i, p in enumerate(probabilities))
    return _unit(1 - spread / uniform_spread(len(probabilities)))


def expected_score(probabilities: Sequence[float]) -> float:
    """sum_i i * p_i, added left to right as a client checking the answer would."""
    total = 0.0
    for i, p in enumerate(probabilities):
        total += i * p
    return total


def _unit(x: float) -> float:
    return min(1.0, max(0.0, x))
