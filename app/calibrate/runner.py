"""Fitting a model's calibration to a user's examples: read them, answer them through the normal path,
fit each question (app/answering/fitting.py), store the adopted fits (app/answering/fits.py), and report.

An example is one state with questions and, optionally, the right answer per question id:
`true`/`false` for a noul, an option name for a choice, a level index for a score. Examples without
answers are unlabelled: they feed the label-free batch calibration only.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from app.answering.fits import question_key
from app.answering.fitting import Choice, Example, SetRow, choose, fit_batch, readout_ratios
from app.answering.service import Evidence, ModelService
from app.contract import ChoiceQuestion, NoulQuestion, Question, SystemOneRequest, canonical_json
from app.progress import Progress

# Below this many labelled examples a question's fit is reported as not to be trusted
# (docs/calibration.md: the held-out curve against the number of examples).
FEW_EXAMPLES = 50
# A question with states but no labels gets batch calibration where it measured better than contextual
# calibration on held-out pipeline data (docs/calibration.md), from this many states on.
LABEL_FREE_TYPES = ("noul", "score")
FEW_STATES = 20


class ExampleError(ValueError):
    """An example that cannot be used; the message names it and says why."""


@dataclass(frozen=True)
class Parsed:
    request: SystemOneRequest
    answers: dict[str, int]  # question id -> index of the right label (labelled questions only)


def right_index(question: Question, value: Any) -> int:
    if isinstance(question, NoulQuestion):
        if not isinstance(value, bool):
            raise ValueError(f"a noul's answer is true or false, not {value!r}")
        return 0 if value else 1
    if isinstance(question, ChoiceQuestion):
        if value not in question.criteria:
            raise ValueError(f"{value!r} is not one of the options {sorted(question.criteria)}")
        return list(question.criteria).index(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < len(question.criteria):
        raise ValueError(f"a score's answer is a level index from 0 to {len(question.criteria) - 1}, not {value!r}")
    return value


def parse_examples(items: Iterable[Any], model: str = "jev-latest") -> list[Parsed]:
    found = []
    for n, item in enumerate(items, 1):
        try:
            if not isinstance(item, dict):
                raise ValueError("an example is an object with state, questions and (optionally) answers")
            request = SystemOneRequest.model_validate({"model": model, **{k: item[k] for k in ("state", "questions")}})
            answers = item.get("answers") or {}
            if not isinstance(answers, dict) or set(answers) - set(request.questions):
                raise ValueError("answers must be an object keyed by the example's question ids")
            found.append(Parsed(request, {q: right_index(request.questions[q], v) for q, v in answers.items()}))
        except (KeyError, ValueError) as error:
            raise ExampleError(f"example {n}: {error}") from None
    if not found:
        raise ExampleError("no examples")
    return found


def read_jsonl(text: str) -> list[Any]:
    items = []
    for n, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                items.append(json.loads(line))
            except ValueError as error:
                raise ExampleError(f"line {n}: not JSON ({error})") from None
    return items


@dataclass(frozen=True)
class QuestionReport:
    key: str
    ids: list[str]  # the ids the examples gave it
    question: dict[str, Any]
    labelled: int
    unlabelled: int
    choice: Choice | None  # None: no labelled example
    warning: str | None
    label_free: str | None = None  # the label-free method adopted for a question without labels

    def to_json(self) -> dict[str, Any]:
        choice = self.choice
        return {
            "key": self.key,
            "ids": self.ids,
            "question": self.question,
            "labelled": self.labelled,
            "unlabelled": self.unlabelled,
            "method": choice.method if choice else self.label_free or "contextual",
            "adopted": bool(choice and choice.adopted) or self.label_free is not None,
            "before": choice.before.to_json() if choice else None,
            "after": choice.after.to_json() if choice else None,
            "candidates": choice.candidates if choice else {},
            "warning": self.warning,
        }


def answer_all(
    service: ModelService,
    examples: Sequence[Parsed],
    progress: Progress,
    stop: Callable[[], bool] = lambda: False,
) -> list[dict[str, Evidence]]:
    """Each example's evidence, through the answering path and its cache, counted in `progress`."""
    found = []
    for example in examples:
        if stop():
            raise InterruptedError("the fitting run was cancelled")
        found.append(service.evidence(example.request, hidden=True))  # hidden: for the probe candidate
        progress.step()
    return found


def fit_all(
    examples: Sequence[Parsed], evidence: Sequence[dict[str, Evidence]], temperature: float, question_set: bool
) -> tuple[list[QuestionReport], list[dict[str, Any]]]:
    """Per question content: the choice among the candidates, and the records of the adopted fits."""
    groups: dict[str, list[tuple[int, str]]] = {}
    for i, example in enumerate(examples):
        for qid, question in example.request.questions.items():
            groups.setdefault(question_key(question), []).append((i, qid))
    reports, records = [], []
    for key, members in groups.items():
        first_i, first_q = members[0]
        question = examples[first_i].request.questions[first_q]
        rows = [(i, qid, evidence[i][qid]) for i, qid in members]
        labelled = [(i, e, examples[i].answers[qid]) for i, qid, e in rows if qid in examples[i].answers]
        shown = json.loads(canonical_json(question.model_dump(mode="json")))
        choice, warning, label_free = None, None, None
        if not labelled and question.type in LABEL_FREE_TYPES and len(rows) >= FEW_STATES:
            canonical = sorted(tuple(rows[0][2].labels))
            fit = fit_batch([_canonical(e, None, canonical) for _, _, e in rows], temperature)
            label_free = "batch (label-free)"
            records.append(
                {
                    "key": key,
                    "question": shown,
                    "method": label_free,
                    "fit": fit.to_json(),
                    "examples": 0,
                    "states": len(rows),
                }
            )
        elif not labelled:
            warning = (
                f"no labels: label-free calibration applies to {' and '.join(LABEL_FREE_TYPES)} questions with at "
                f"least {FEW_STATES} states"
            )
        if labelled:
            canonical = sorted(tuple(labelled[0][1].labels))
            train = [_canonical(e, right, canonical) for _, e, right in labelled]
            sets = set_rows(examples, evidence, [i for i, _, _ in labelled]) if question_set else None
            if sets is not None and len({frozenset(row.readouts) for row in sets}) > 1:
                sets = None  # a question-set fit needs every example to ask the same set
            sample = [_canonical(e, None, canonical) for _, _, e in rows]  # every state, labelled or not
            choice = choose(train, temperature, sample, sets, key, ordered=question.type == "score")
            if len(labelled) < FEW_EXAMPLES:
                warning = f"only {len(labelled)} labelled examples: a fit needs about {FEW_EXAMPLES} to be trusted"
            if choice.adopted and choice.fit is not None:
                record = {
                    "key": key,
                    "question": shown,
                    "method": choice.method,
                    "fit": choice.fit.to_json(),
                    "examples": len(labelled),
                    "before": choice.before.to_json(),
                    "after": choice.after.to_json(),
                }
                if choice.fit.method == "question_set":
                    record["set"] = sorted({f[0] for f in choice.fit.features})
                records.append(record)
        reports.append(
            QuestionReport(
                key,
                sorted({qid for _, qid in members}),
                shown,
                len(labelled),
                len(rows) - len(labelled),
                choice,
                warning,
                label_free,
            )
        )
    return reports, records


def _canonical(evidence: Evidence, right: int | None, labels: list[str]) -> Example:
    """The readout with its labels in sorted order (a choice's options may come in any order)."""
    order = [list(evidence.labels).index(label) for label in labels]
    return Example(
        tuple(labels),
        tuple(evidence.raw[i] for i in order),
        tuple(evidence.prior[i] for i in order),
        None if right is None else order.index(right),
        evidence.hidden,
    )


def set_rows(examples: Sequence[Parsed], evidence: Sequence[dict[str, Evidence]], indices: list[int]) -> list[SetRow]:
    rows = []
    for i in indices:
        readouts = {}
        for qid, question in examples[i].request.questions.items():
            e = evidence[i][qid]
            readouts[question_key(question)] = readout_ratios(e.labels, e.raw, e.prior)
        rows.append(SetRow(readouts))
    return rows
