"""What every prompter gives the service: a request's prefix, each question's suffixes, and how they
are read. onepass's own prompt (app/answering/prompting.py) and a decision GGUF's
(app/answering/decision.py) both make these.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from app.contract import Question, SystemOneRequest


class Tokenizer(Protocol):
    """The model's tokenizer (app/engine/llama.py's Engine)."""

    @property
    def add_bos(self) -> bool: ...  # whether a prompt begins with the BOS token

    def tokenize(self, text: str, *, add_bos: bool = False, special: bool = True) -> list[int]: ...


@dataclass(frozen=True)
class Suffix:
    """One question's suffix: what follows the prefix, up to where its answer label goes."""

    text: str  # the question block (user text); empty where the template renders the whole prompt
    tokens: tuple[int, ...]
    label_ids: tuple[int, ...]  # in answer order: yes/no, options in request order, levels 0..n-1


@dataclass(frozen=True)
class Reading:
    """How one question is asked and read: its suffixes (one per variant of its prompt; onepass's own
    prompt has one) and how their label probabilities, each in label_keys order, make the answer's."""

    variants: tuple[Suffix, ...]
    combine: Literal["one", "mean", "rating"] = "one"
    # A decision model's temperature for this question, from its file; None: the model's calibration
    # temperature applies (app/calibration/policy.py).
    temperature: float | None = None

    def read(self, per_variant: Sequence[Sequence[float]]) -> list[float]:
        """ "mean": the variants averaged; "rating": a 9-point rating (0 certainly no .. 8 certainly
        yes) read as p(true), then p(false)."""
        if self.combine == "one":
            return list(per_variant[0])
        if self.combine == "mean":
            return [math.fsum(ps) / len(ps) for ps in zip(*per_variant, strict=True)]
        rating = per_variant[0]
        yes = math.fsum(i * p for i, p in enumerate(rating)) / (len(rating) - 1)
        return [yes, 1.0 - yes]


@dataclass(frozen=True)
class QuestionSet:
    """The question-first layout's middle of the prefix: every question of a request, numbered in a
    canonical order, between the system prompt and the state."""

    text: str
    tokens: tuple[int, ...]  # "Questions: ..." up to the state's lead, as they follow the head
    number: dict[str, int]  # question id -> its number in the block (identical questions share one)
    suffixes: dict[str, Suffix]  # question id -> its suffix: which question to answer, the tail
    key: tuple[str, ...]  # what besides the model and the KV settings shapes its snapshot


@dataclass(frozen=True)
class Plan:
    """A request as its prompter renders it, checked before any inference."""

    prefix: tuple[int, ...]  # everything before the suffixes: what the state's snapshot holds
    key: tuple[str | bytes, ...]  # what besides the model and the KV settings shapes that snapshot
    questions: list[tuple[str, Question, Reading]]  # in the request's order
    question_set: QuestionSet | None = None  # the question-first layout's (None: state-first)

    def suffixes(self) -> list[Suffix]:
        return [variant for _, _, reading in self.questions for variant in reading.variants]


class Prompter(Protocol):
    """Renders a model's prompts; built once at load time."""

    @property
    def decision_type(self) -> str | None: ...  # a decision GGUF's type; None: onepass's own prompt

    @property
    def head_tokens(self) -> tuple[int, ...]: ...  # what every prompt starts with: the base snapshot

    @property
    def identity(self) -> str: ...  # what a fit depends on besides the model: the prompt around the state

    def state_tokens(self, state: str) -> tuple[int, ...]:
        """A state's part of its prefix, after the head (the content-free stand-ins' too)."""
        ...

    def plan(self, request: SystemOneRequest) -> Plan:
        """The request's prefix and readings; raises TooManyOptions or TemplateRefused."""
        ...


class TooManyOptions(ValueError):
    """A question has more options (or levels) than the model has labels for."""

    def __init__(self, qid: str, field: str, count: int, limit: int, message: str) -> None:
        super().__init__(message)
        self.qid, self.field, self.count, self.limit = qid, field, count, limit


class TemplateRefused(ValueError):
    """A model's own template would not render a request (its raise_exception, a type it cannot
    print): the request's fault, at `loc`, never the server's."""

    def __init__(self, loc: tuple[str, ...], message: str) -> None:
        super().__init__(message)
        self.loc = loc
