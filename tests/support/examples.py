"""Labelled examples for the tests of fitting, drawn from a seeded generator: a model whose raw answers
rank the right label up, but with a bias and a confidence of their own."""

from __future__ import annotations

import numpy as np

from app.calibration.evidence import Example
from app.calibration.fit import softmax

LABELS = ("A", "B", "C")


def biased(n: int, seed: int, bias: tuple[float, ...], scale: float) -> list[Example]:
    """A model that ranks the right label up but prefers some labels and is over- or under-confident."""
    rng = np.random.default_rng(seed)
    found = []
    for _ in range(n):
        right = int(rng.integers(3))
        evidence = rng.normal(0, 1, 3)
        evidence[right] += 1.5
        raw = softmax(scale * evidence + np.asarray(bias))
        found.append(Example(LABELS, tuple(float(p) for p in raw), (1 / 3, 1 / 3, 1 / 3), right))
    return found
