"""A decision GGUF's format: what its metadata declares (its type, its `systemone` template, its
temperatures) and the order each type shows a question's options in. Both decision prompters read
it: app/answering/decision.py the causal types, app/answering/encoders.py the types read whole.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from app.wire.contract import ChoiceQuestion, NoulQuestion, Question, ScoreQuestion

# decision.py prompts the causal types (a state's prefix is kept), encoders.py those read whole.
CAUSAL = ("openjev", "lev", "nimble", "pplx-decider", "lfm2-d1", "kev")
WHOLE = ("laya", "lfm2-d1-omni", "clef")
SERVED = (*CAUSAL, *WHOLE)
TEMPLATE_KEY = "tokenizer.chat_template.systemone"


class DecisionError(ValueError):
    """A decision GGUF onepass cannot serve correctly: refused at load, never served wrong."""


@dataclass(frozen=True)
class DecisionFormat:
    kind: str  # one of SERVED
    template: str
    temperatures: dict[str, float]  # "<question type>[.<bucket>]" -> T
    max_head_tokens: int = 0  # laya: the question and its options' token budget

    def temperature(self, question_type: str, n_options: int) -> float:
        bucket = _bucket(self.kind, n_options)
        return self.temperatures.get(f"{question_type}.{bucket}", self.temperatures.get(question_type, 1.0))


def _bucket(kind: str, n: int) -> str:
    if kind == "lev":
        return "small" if n <= 8 else "mid" if n <= 26 else "large"
    return "2" if n <= 2 else "3_5" if n <= 5 else "6_10" if n <= 10 else "11"


def read_format(metadata: Callable[[str], str | None], keys: Sequence[str]) -> DecisionFormat | None:
    """The file's decision format; None for an ordinary model. Raises DecisionError for a decision
    model onepass cannot serve (a type it does not read, no template, a bad temperature)."""
    arch = metadata("general.architecture") or ""
    prefix = f"{arch}.decision."
    declared = metadata(prefix + "type")
    if declared is None:
        return None
    kind = declared.strip().lower().replace("_", "-")
    if kind not in SERVED:
        raise DecisionError(f"unknown decision type {declared!r}; onepass serves {', '.join(SERVED)}")
    template = metadata(TEMPLATE_KEY)
    if not template:
        raise DecisionError(f"a {kind} decision model needs a 'systemone' template ({TEMPLATE_KEY})")
    temperatures = {}
    for key in keys:
        if key.startswith(prefix + "temperature."):
            text = metadata(key) or ""
            try:
                value = float(text)
            except ValueError:
                value = math.nan
            if not math.isfinite(value) or value <= 0:
                raise DecisionError(f"invalid decision temperature: {key} = {text!r}")
            temperatures[key.removeprefix(prefix + "temperature.")] = value
    max_head_tokens = 0
    if kind == "laya":
        text = metadata(prefix + "max_head_tokens") or ""
        max_head_tokens = int(text) if text.isdigit() else 0
        if max_head_tokens <= 0:
            raise DecisionError(f"a laya decision model needs a positive {prefix}max_head_tokens, not {text!r}")
    return DecisionFormat(kind, template, temperatures, max_head_tokens)


@dataclass(frozen=True)
class Option:
    key: str  # the answer's label key: "true"/"false", an option name, a level index
    description: Any  # the raw JSON value, or None


TRUE_FIRST = ("openjev", "clef", "lfm2-d1")  # the types whose noul lists true, then false


def options_of(question: Question, kind: str) -> list[Option]:
    """A question's options in the order a `kind` model is shown them (clef sorts a choice's by key)."""
    if isinstance(question, NoulQuestion):
        criteria = question.criteria
        true = Option("true", criteria.true if criteria is not None else None)
        false = Option("false", criteria.false if criteria is not None else None)
        return [true, false] if kind in TRUE_FIRST else [false, true]
    if isinstance(question, ChoiceQuestion):
        found = [Option(name, description) for name, description in question.criteria.items()]
        return sorted(found, key=lambda o: o.key.encode()) if kind == "clef" else found
    assert isinstance(question, ScoreQuestion)
    return [Option(str(i), level) for i, level in enumerate(question.criteria)]
