"""How well probabilities answer labelled examples: accuracy, log loss, Brier score, ECE and the
reliability bins."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from app.calibration.evidence import TINY, Array

BINS = 10


@dataclass(frozen=True)
class Scores:
    n: int
    accuracy: float
    log_loss: float
    brier: float
    ece: float
    reliability: list[dict[str, float]] = field(default_factory=list)  # per bin: from, to, n, confidence, accuracy

    def to_json(self) -> dict[str, Any]:
        return {
            "n": self.n,
            "accuracy": self.accuracy,
            "log_loss": self.log_loss,
            "brier": self.brier,
            "ece": self.ece,
            "reliability": self.reliability,
        }


def scores(probabilities: Array, right: NDArray[np.int64]) -> Scores:
    n, k = probabilities.shape
    onehot = np.zeros((n, k))
    onehot[np.arange(n), right] = 1.0
    confidence = probabilities.max(1)
    correct = probabilities.argmax(1) == right
    bins = []
    ece = 0.0
    for b in range(BINS):
        low, high = b / BINS, (b + 1) / BINS
        inside = (confidence > low) & (confidence <= high) if b else (confidence <= high)
        if inside.any():
            gap = abs(float(correct[inside].mean()) - float(confidence[inside].mean()))
            ece += gap * inside.sum() / n
            bins.append(
                {
                    "from": low,
                    "to": high,
                    "n": int(inside.sum()),
                    "confidence": float(confidence[inside].mean()),
                    "accuracy": float(correct[inside].mean()),
                }
            )
    return Scores(
        n=n,
        accuracy=float(correct.mean()),
        log_loss=float(-np.log(np.maximum(probabilities[np.arange(n), right], TINY)).mean()),
        brier=float(((probabilities - onehot) ** 2).sum(1).mean()),
        ece=float(ece),
        reliability=bins,
    )
