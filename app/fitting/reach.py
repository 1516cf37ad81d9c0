"""Where a fit cannot reach: the questions whose fitted answers stay unsure, and what their data says.

A question is named when its fit's cross-validated accuracy stays below LOW_ACCURACY, or its 90%
answer sets stay wider than WIDE_SET labels on average. For each, the learning curve decides whether
more labels of the same kind are likely to help: the same choice of fit on the first half of its
examples, against all of them. A rise of more than the half's binomial standard error is a rise; a
smaller one is not told apart from noise. And a policy that decides on several facts may be reached
by asking each fact as a noul beside it and fitting the set (`--question-set`): the question-set
fit reads every answer about the state (docs/calibration.md measures this on the support priority).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from app.calibration import Calibration, Example, FitChoice, TooFewExamples

LOW_ACCURACY = 0.8
WIDE_SET = 1.5
FACTS_ADVICE = (
    "if its answer follows from several facts of the state (a policy), ask each fact as a noul in the same "
    "requests and fit with --question-set: the question-set fit reads every answer about the state"
)


def reach(
    calibration: Calibration,
    choice: FitChoice,
    examples: Sequence[Example],
    unlabelled: Sequence[Example],
    key: str,
    ordered: bool,
) -> dict[str, Any] | None:
    """What the report says of a question its fit leaves unsure; None for a question it does not."""
    accuracy = choice.after.accuracy
    width = (choice.sets or {}).get("0.9", {}).get("size")
    if accuracy >= LOW_ACCURACY and (width is None or width <= WIDE_SET):
        return None
    found: dict[str, Any] = {"accuracy": accuracy, "set_size": width, "advice": FACTS_ADVICE}
    half = list(examples[: len(examples) // 2])
    try:
        at_half = calibration.choose(half, unlabelled, key, ordered).after.accuracy
    except TooFewExamples:
        found["more_labels"] = f"too few examples ({len(examples)}) to draw a learning curve"
        return found
    noise = math.sqrt(max(at_half * (1 - at_half), 1e-12) / len(half))
    found["curve"] = {str(len(half)): at_half, str(len(examples)): accuracy}
    found["more_labels"] = (
        f"likely to help: accuracy rose from {at_half:.3f} with {len(half)} examples to {accuracy:.3f} with "
        f"{len(examples)}, more than its noise ({noise:.3f})"
        if accuracy - at_half > noise
        else f"unlikely to help much: accuracy went from {at_half:.3f} with {len(half)} examples to {accuracy:.3f} "
        f"with {len(examples)}, within its noise ({noise:.3f})"
    )
    return found
