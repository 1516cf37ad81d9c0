"""The contract's confidence formulas and expected score (../shared/CONTRACT.md), from one answer's
probabilities in its labels' order."""

from __future__ import annotations

import math
from collections.abc import Sequence


def choice_confidence(probabilities: Sequence[float]) -> float:
    """(max_p - 1/n) / (1 - 1/n): 0 for a uniform answer, 1 for a certain one."""
    n = len(probabilities)
    return _unit((max(probabilities) - 1 / n) / (1 - 1 / n))


def uniform_spread(n: int) -> float:
    """u(n) = sum_i |i - (n-1)/2| / n: the mean distance from the middle level of a uniform answer."""
    middle = (n - 1) / 2
    return math.fsum(abs(i - middle) for i in range(n)) / n


def score_confidence(probabilities: Sequence[float]) -> float:
    """1 - sum_i p_i |i - m| / u(n), clamped at 0, where m is the most likely level."""
    m = max(range(len(probabilities)), key=probabilities.__getitem__)
    spread = math.fsum(p * abs(i - m) for i, p in enumerate(probabilities))
    return _unit(1 - spread / uniform_spread(len(probabilities)))


def expected_score(probabilities: Sequence[float]) -> float:
    """sum_i i * p_i, added left to right as a client checking the answer would."""
    total = 0.0
    for i, p in enumerate(probabilities):
        total += i * p
    return total


def _unit(x: float) -> float:
    return min(1.0, max(0.0, x))
