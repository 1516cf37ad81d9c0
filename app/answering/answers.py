"""An answer in its question's type, from its label probabilities: the contract's confidence formulas
applied, the raw probabilities, the fit and the answer set shown as its x_ fields."""

from __future__ import annotations

from app.confidence import choice_confidence, expected_score, score_confidence
from app.wire.contract import (
    Answer,
    AnswerSet,
    CalibrationUsed,
    ChoiceAnswer,
    ChoiceQuestion,
    NoulAnswer,
    NoulQuestion,
    Question,
    ScoreAnswer,
)


def answer_of(
    question: Question,
    probabilities: list[float],
    mass: float | None,
    raw: list[float] | None = None,
    fit: CalibrationUsed | None = None,
    answer_set: tuple[list[int], float] | None = None,
) -> Answer:
    """The answer in `question`'s type; `raw` (before calibration) is reported as x_raw when given,
    `fit` (the user's fit that gave the probabilities) as x_calibration, `answer_set` (its label
    indices in the set's order, and its coverage) as x_set."""
    shown = None if answer_set is None else _answer_set(question, *answer_set)
    if isinstance(question, NoulQuestion):
        return NoulAnswer(
            noul=probabilities[0],
            x_label_mass=mass,
            x_raw=raw[0] if raw is not None else None,
            x_calibration=fit,
            x_set=shown,
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
            x_set=shown,
        )
    return ScoreAnswer(
        score=expected_score(probabilities),
        confidence=score_confidence(probabilities),
        legend={str(i): level for i, level in enumerate(question.criteria)},
        probabilities={str(i): p for i, p in enumerate(probabilities)},
        x_label_mass=mass,
        x_raw={str(i): p for i, p in enumerate(raw)} if raw is not None else None,
        x_calibration=fit,
        x_set=shown,
    )


def _answer_set(question: Question, labels: list[int], coverage: float) -> AnswerSet:
    if isinstance(question, NoulQuestion):
        return AnswerSet(labels=[i == 0 for i in labels], coverage=coverage)
    if isinstance(question, ChoiceQuestion):
        names = list(question.criteria)
        return AnswerSet(labels=[names[i] for i in labels], coverage=coverage)
    return AnswerSet(labels=[str(i) for i in sorted(labels)], coverage=coverage)
