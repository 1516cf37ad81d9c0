"""What an answer may depend on besides the state and its question: the question ids, the order of the
questions, the order of a choice's options, the other questions asked (contract.DependsOn).

TABLE declares it for each prompt: onepass's own in its two layouts, and the nine decision formats as
llama.cpp's server defines them (tools/server/server-decision.cpp). docs/exactness.md shows the same
table (a test keeps the two equal), and the property tests observe each row's behaviour.

A decision template is given the question's `id`, and nimble's every question of the request: whether
its answers depend on them is the template's choice, not the format's. That is found at load by
planning probe requests that differ in that one thing and comparing what each question is read from,
as the state's prefix is found by rendering probes (app/answering/decision.py).
"""

from __future__ import annotations

import logging
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any, Literal

from app.answering.prompter import Dependence, Plan, Prompter, TemplateRefused, TooManyOptions
from app.wire.contract import DEPENDS_ON, DependsOn, SystemOneRequest

log = logging.getLogger("onepass.dependence")

# holds: bit-identical; rounding: equal but for the batch's floating-point rounding (docs/exactness.md);
# breaks: the prompt the answer is read from changes.
Cell = Literal["holds", "rounding", "breaks"]


@dataclass(frozen=True)
class Invariances:
    """One prompt's row: each DependsOn's cell, and why the breaking ones break. `template`: the ones
    its template decides (it is given what they change); they break where the template prints it,
    else their cell applies. `options_from`: the fewest options whose order changes an answer."""

    ids: Cell
    question_order: Cell
    option_order: Cell
    other_questions: Cell
    why: str
    template: frozenset[DependsOn] = frozenset()
    options_from: int = 2

    def cell(self, what: DependsOn) -> Cell:
        found: Cell = getattr(self, what)
        return found


_GIVEN_ID = frozenset[DependsOn]({"ids"})
_LETTERED = "options lettered by position"
_READ_ALONE = Invariances(
    "holds",
    "holds",
    "breaks",
    "holds",
    "options read in the request's order; each question's prompt read alone",
    _GIVEN_ID,
)
TABLE: dict[str, Invariances] = {
    # onepass's own prompt, by layout: options labelled in sorted name order, ids never in the prompt
    "state-first": Invariances(
        "holds",
        "holds",
        "holds",
        "rounding",
        "options labelled in sorted order; each question read after the state alone",
    ),
    "question-first": Invariances(
        "holds",
        "holds",
        "holds",
        "breaks",
        "every question of the request, numbered in sorted order, is read before the state",
    ),
    "openjev": Invariances("holds", "holds", "breaks", "rounding", "the i-th option gets the i-th letter", _GIVEN_ID),
    "lev": Invariances(
        "holds",
        "holds",
        "breaks",
        "rounding",
        "a choice is read in its order and reversed, averaged: two options read alike either way",
        _GIVEN_ID,
        options_from=3,
    ),
    "nimble": Invariances(
        "holds",
        "holds",
        "breaks",
        "rounding",
        f"{_LETTERED}; the template is given every question of the request",
        frozenset({"ids", "question_order", "other_questions"}),
    ),
    "pplx-decider": Invariances("holds", "holds", "breaks", "rounding", _LETTERED, _GIVEN_ID),
    "lfm2-d1": Invariances("holds", "holds", "breaks", "rounding", "options shown in the request's order", _GIVEN_ID),
    "kev": Invariances("holds", "holds", "breaks", "rounding", "options read in the request's order", _GIVEN_ID),
    "laya": _READ_ALONE,
    "lfm2-d1-omni": _READ_ALONE,
    "clef": Invariances(
        "holds",
        "breaks",
        "holds",
        "breaks",
        "every question read in one prompt, in the request's order; options sorted by name",
        _GIVEN_ID,
    ),
}


def dependence_of(prompter: Prompter) -> Dependence:
    """The prompter's row, its template's part found by probes."""
    row = prompter.decision_type or prompter.layout
    declared = TABLE[row]
    found = {what for what in DEPENDS_ON if declared.cell(what) == "breaks"}
    found |= {what for what in declared.template if _template_uses(prompter, what)}
    return Dependence(row, frozenset(found), declared.options_from, declared.why)


_NOUL: dict[str, Any] = {"type": "noul", "instructions": "Is the text about the weather?", "criteria": {"true": "rain"}}
_CHOICE: dict[str, Any] = {"type": "choice", "instructions": "Which colour?", "criteria": {"red": None, "blue": "sky"}}
# Pairs of requests that differ in one thing, and which question of the first is which of the second.
_PROBES: dict[str, list[tuple[dict[str, Any], dict[str, Any], dict[str, str]]]] = {
    "ids": [({"first": _NOUL, "second": _CHOICE}, {"x": _NOUL, "y": _CHOICE}, {"first": "x", "second": "y"})],
    "question_order": [
        (
            {"first": _NOUL, "second": _CHOICE},
            {"second": _CHOICE, "first": _NOUL},
            {"first": "first", "second": "second"},
        )
    ],
    "other_questions": [
        ({"first": _NOUL}, {"first": _NOUL, "second": _CHOICE}, {"first": "first"}),
        ({"second": _CHOICE}, {"first": _NOUL, "second": _CHOICE}, {"second": "second"}),
    ],
}


def _template_uses(prompter: Prompter, what: DependsOn) -> bool:
    """Whether a question's prompt changes with `what` (one that will not plan is assumed to)."""
    for first, second, same in _PROBES[what]:
        try:
            one, other = (_plan(prompter, questions) for questions in (first, second))
        except (TemplateRefused, TooManyOptions) as error:
            log.warning("the %s probe did not plan (%s): answers are taken to depend on it", what, error)
            return True
        if any(_read_from(one, a) != _read_from(other, b) for a, b in same.items()):
            return True
    return False


def _plan(prompter: Prompter, questions: dict[str, Any]) -> Plan:
    state = "A probe text about the weather."
    return prompter.plan(SystemOneRequest.model_validate({"model": "probe", "state": state, "questions": questions}))


def _read_from(plan: Plan, qid: str) -> Hashable:
    """Everything one question's answer is read from: each variant's whole prompt (the prefix and its
    suffix), the labels and places read in it, and how they are read."""
    (reading,) = [reading for found, _, reading in plan.questions if found == qid]
    variants = tuple(
        ((*plan.prefix.tokens, *v.tokens), v.label_ids, tuple(len(plan.prefix.tokens) + m for m in v.marks), v.order)
        for v in reading.variants
    )
    return (variants, reading.combine, reading.temperature, reading.head, reading.groups, reading.column)
