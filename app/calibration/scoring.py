"""Label logits to probabilities.

Every result is finite: logits are shifted by their max before exp, so the largest term is
exactly 1 and the normaliser is at least 1.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def softmax(logits: Sequence[float]) -> list[float]:
    if not logits or not all(math.isfinite(x) for x in logits):
        raise ValueError(f"label logits must be finite and non-empty, got {list(logits)!r}")
    top = max(logits)
    weights = [math.exp(x - top) for x in logits]
    total = math.fsum(weights)
    return [w / total for w in weights]
