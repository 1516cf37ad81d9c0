"""One step of the labelling loop, as `onepass label` takes it (session.py) and bench/labelling.py
replays it on stored evidence: each state answered from its kept evidence with the fits stored now, the
next states to label picked from those answers (ranking.py), and the refit on the labelled states.
Which states are offered at random is decided here too, by each state's content, so that the bench
draws the states the product would."""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from app.calibration import AnswerProbabilities, Calibration, Evidence, FitRecord
from app.fitting.examples import IMAGE_FIELDS, UserExample
from app.fitting.runner import QuestionReport, fit_all, store_all
from app.labelling.ranking import drawn, next_to_label, worths
from app.wire.contract import Question, canonical_json

CONTENT_KEYS = ("state", "questions", *IMAGE_FIELDS)  # what a label line repeats of its state


def content(item: Mapping[str, Any]) -> str:
    """A state's content as a label line repeats it: its state, questions and images."""
    return canonical_json({k: item[k] for k in CONTENT_KEYS if k in item})


def drawn_states(contents: Sequence[str]) -> list[int]:
    """The states offered at random (ranking.drawn), as indices into `contents`: each state's content(),
    made once by the caller (a state's images make it long)."""
    return drawn(contents)


def answered(
    calibration: Calibration, questions: Mapping[str, Question], row: Mapping[str, Evidence], same_set: bool
) -> dict[str, AnswerProbabilities]:
    """A state's answers from its kept evidence, with the fits its calibration's store holds now."""
    return calibration.answer_evidence(questions, row, calibration.fits_for(questions, same_set=same_set))


def picked(
    answers: Sequence[Mapping[str, AnswerProbabilities]],
    unit: NDArray[np.float32] | None,
    labelled: Sequence[int],
    count: int,
    offered: Sequence[int],
) -> list[int]:
    """Up to `count` states to label next, as indices into `answers` (every state's, as answered now):
    ranked by what a label would teach the fits, one in DRAWN_EVERY of the `offered` at random."""
    return next_to_label(worths(answers), unit, labelled, count, offered)


def refit(
    calibration: Calibration,
    examples: Sequence[UserExample],
    evidence: Sequence[dict[str, Evidence]],
    stop: threading.Event | None = None,
) -> tuple[list[FitRecord], list[QuestionReport]]:
    """Fit every question on the labelled states' evidence and store the adopted fits in the
    calibration's store: the stored records, and the reports. A question fitted without adopting a fit
    drops the fit stored for it, since the latest labels decide (`onepass calibrate` keeps it)."""
    store = calibration.store
    if store is None:
        raise RuntimeError("this model has no folder for fits")
    reports, records = fit_all(examples, evidence, calibration, False, stop)
    stored, reports = store_all(store, reports, records)
    for report in reports:
        if report.choice is not None and not report.choice.adopted and report.error is None:
            store.forget(report.key)
    return stored, reports
