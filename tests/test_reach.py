"""Where a fit cannot reach (app/fitting/reach.py): a question its fit leaves unsure is named with its
learning curve and the advice to ask its facts; one its fit answers well is not."""

from __future__ import annotations

from typing import Any

import numpy as np

from app.calibration import Calibration, Example, Priors, softmax
from app.fitting.reach import FACTS_ADVICE, LOW_ACCURACY, reach
from tests.support.examples import biased


def fitting() -> Calibration:
    def never(*_: Any) -> Any:
        raise AssertionError("fits from stored evidence measure no prior")

    return Calibration("contextual", 1.0, Priors([], never))


def test_a_question_the_readout_tells_nothing_about_is_named_with_its_curve() -> None:
    calibration = fitting()
    coin = biased(120, 5, (0.0, 0.0, 0.0), 0.0)  # scale 0: every answer the same, whatever is right
    choice = calibration.choose(coin, [], "coin", False)
    found = reach(calibration, choice, coin, [], "coin", False)
    assert found is not None and found["accuracy"] < LOW_ACCURACY and found["advice"] == FACTS_ADVICE
    assert set(found["curve"]) == {"60", "120"}
    assert found["more_labels"].startswith(("likely to help", "unlikely to help much"))


def clear(n: int) -> list[Example]:
    """The readout puts most of its probability on the right label, with a label bias to learn."""
    rng = np.random.default_rng(6)
    found = []
    for right in rng.integers(0, 3, n):
        evidence = rng.normal(0, 0.3, 3) + np.asarray([1.0, 0.0, -1.0])
        evidence[right] += 4.0
        found.append(Example(("A", "B", "C"), tuple(softmax(evidence.tolist())), (1 / 3,) * 3, int(right)))
    return found


def test_a_question_its_fit_answers_well_is_not_named() -> None:
    calibration = fitting()
    examples = clear(120)
    choice = calibration.choose(examples, [], "clear", False)
    assert choice.after.accuracy >= LOW_ACCURACY
    assert reach(calibration, choice, examples, [], "clear", False) is None
