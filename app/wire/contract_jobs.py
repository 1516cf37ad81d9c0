"""The wire form of what onepass's own batch and job routes answer, as /openapi.json publishes it: a
batch's results (each a single request's answer or its error), a batch job, and a fitting job (POST
/v1/calibrations) with its fits and its report. The batch's request is app/wire/contract.py's BatchRequest.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from app.wire.contract import ErrorDetail, SystemOneResponse, ValidationDetail


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
