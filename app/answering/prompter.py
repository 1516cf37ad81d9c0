"""What every prompter gives the service: a request's prefix, each question's suffixes, and how they
are read. onepass's own prompt (app/answering/prompting.py) and a decision GGUF's
(app/answering/decision.py) both make these.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

import numpy as np

from app.engine.engine import Readout
from app.engine.snapshot import ImageSpan, Prefix
from app.wire.contract import DEPENDS_ON, ChoiceQuestion, DependsOn, Question, SystemOneRequest


@dataclass(frozen=True)
class Dependence:
    """What one loaded model's answers depend on: its row of app/answering/dependence.py's table, with
    its template's part found."""

    row: str
    found: frozenset[DependsOn]
    options_from: int
    why: str  # the row's reason

    def of(self, questions: Sequence[Question], *, question_set_fit: bool = False) -> list[DependsOn]:
        """What a request's answers may depend on (x_depends_on): the model's, where the request can
        show it (an order of two questions or more, of a choice's options_from options or more), and
        `other_questions` where a question-set fit answered (app/calibration/policy.py)."""
        shown = {
            "ids": True,
            "question_order": len(questions) > 1,
            "option_order": any(
                isinstance(q, ChoiceQuestion) and len(q.criteria) >= self.options_from for q in questions
            ),
            "other_questions": True,
        }
        found = {what for what in self.found if shown[what]}
        if question_set_fit:
            found.add("other_questions")
        return [what for what in DEPENDS_ON if what in found]

    def describe(self) -> str:
        if not self.found:
            return f"answers depend on nothing but the state and the question ({self.row})"
        names = ", ".join(what.replace("_", " ") for what in DEPENDS_ON if what in self.found)
        return f"answers may depend on: {names} ({self.row}: {self.why})"


class Tokenizer(Protocol):
    """The model's tokenizer (app/engine/vocab.py's Vocabulary)."""

    @property
    def add_bos(self) -> bool: ...  # whether a prompt begins with the BOS token

    def tokenize(self, text: str, *, add_bos: bool = False, special: bool = True) -> list[int]: ...


@dataclass(frozen=True)
class Suffix:
    """One question's suffix: what follows the prefix, up to where its answer label goes. For a
    model without memory the prefix is empty: the suffix is the whole prompt."""

    text: str  # the question block (user text); empty where the template renders the whole prompt
    tokens: tuple[int, ...]
    label_ids: tuple[int, ...]  # in answer order: yes/no, options in request order, levels 0..n-1
    marks: tuple[int, ...] = ()  # positions in `tokens` whose output vectors a decision head reads
    order: tuple[int, ...] = ()  # each token's decision order, for a joint decision head (clef)
    # a whole prompt's images among its cells (IMAGE_CELL), in order; their files are the plan's prefix's
    spans: tuple[ImageSpan, ...] = ()


Head = Literal["labels", "groups", "pointer", "column", "rows"]


@dataclass(frozen=True)
class Reading:
    """How one question is asked and read: its suffixes (one per variant of its prompt; onepass's own
    prompt has one), how a readout gives each label's score (`head`), and how their probabilities,
    each in label_keys order, make the answer's (`combine`).

    Heads: "labels", the label tokens' logits; "groups", the largest logit of each label's group of
    tokens (`groups`: each label's count of label ids, in order); "pointer", q at the last mark
    against each option's k at its own mark, q.k / sqrt(n / 2) (the first and second half of a
    vector n wide); "column", the `column`th value of each option's vector at its mark; "rows",
    the first value of each of the question's vectors (a joint head scores option j in row j)."""

    variants: tuple[Suffix, ...]
    combine: Literal["one", "mean", "rating"] = "one"
    # A decision model's temperature for this question, from its file; None: the model's calibration
    # temperature applies (app/calibration/policy.py).
    temperature: float | None = None
    head: Head = "labels"
    groups: tuple[int, ...] = ()
    column: int = 0

    @property
    def one_logit_per_label(self) -> bool:
        """Each label is one token's logit: what contextual priors and fits read."""
        return self.head == "labels"

    def scores(self, readout: Readout) -> list[float]:
        """Each label's score from one variant's readout."""
        if self.head == "labels":
            return readout.label_logits
        if self.head == "groups":
            found, start = [], 0
            for size in self.groups:
                found.append(max(readout.label_logits[start : start + size]))
                start += size
            return found
        vectors = [np.asarray(v, dtype=np.float64) for v in readout.marked]
        if self.head == "pointer":
            half = len(vectors[-1]) // 2
            q = vectors[-1][:half]
            return [float(q @ k[half:]) / math.sqrt(half) for k in vectors[:-1]]
        if self.head == "column":
            return [float(v[self.column]) for v in vectors]
        return [float(v[0]) for v in vectors]

    def mass(self, readouts: Sequence[Readout]) -> float | None:
        """The share of the next-token distribution on the labels, over the variants; None where the
        answer is not read from next-token logits."""
        if self.head not in ("labels", "groups"):
            return None
        return math.fsum(r.label_mass for r in readouts) / len(readouts)

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

    # everything before the suffixes, what the state's snapshot holds: its tokens, its images among
    # them, and the images' files (a model without memory: no cells, the files its whole prompts read)
    prefix: Prefix
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
    def layout(self) -> str: ...  # "state-first" or "question-first" (app/config.py's parse_layout)

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
    print), or its projector would not read an image: the request's fault, at `loc`, a 422 of type
    `kind`, never the server's."""

    def __init__(self, loc: tuple[str, ...], message: str, kind: str = "value_error") -> None:
        super().__init__(message)
        self.loc, self.kind = loc, kind


# What str.isspace() holds for: a special token that strips the space beside it may take any run of it.
_SPACES = range(0x2000, 0x200B)  # en quad to hair space
_WHITESPACE = "\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f \x85\xa0\u1680\u2028\u2029\u202f\u205f\u3000" + "".join(map(chr, _SPACES))
_UTF8_MOST = 4  # bytes of the longest UTF-8 character


class TooLongForContext(TemplateRefused):
    """A text of more bytes than the context's tokens can stand for: refused without tokenizing it, as
    the state's fault (the one text of a request whose length no other limit bounds)."""

    def __init__(self, size: int, bound: ContextBound) -> None:
        message = (
            f"the prompt's text is {size} bytes (whitespace aside), more than the model context of "
            f"{bound.tokens} tokens can hold (no token of its vocabulary stands for more than "
            f"{bound.longest_token_bytes} bytes)"
        )
        super().__init__(("state",), message, "too_long")
        self.size, self.bound = size, bound


@dataclass(frozen=True)
class ContextBound:
    """The most tokens a prompt may have (the model's context), and the most bytes of text one token of
    the model's vocabulary stands for (Vocabulary.longest_token_bytes; None: no such bound holds)."""

    tokens: int
    longest_token_bytes: int | None = None

    def check(self, text: str) -> None:
        """TooLongForContext where `text` cannot fit in `tokens`. Whitespace is not counted (a special token
        may strip it); it is counted only for a text that would be refused counting it."""
        if self.longest_token_bytes is None:
            return
        most = self.tokens * self.longest_token_bytes
        if len(text) * _UTF8_MOST <= most:  # fits even if every character took the most bytes
            return
        size = _utf8_size(text)
        if size <= most:
            return
        size -= sum(text.count(space) * _utf8_size(space) for space in _WHITESPACE)
        if size > most:
            raise TooLongForContext(size, self)

    def holds(self, tokens: Sequence[int]) -> bool:
        return len(tokens) <= self.tokens


def _utf8_size(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))
