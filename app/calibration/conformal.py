"""Answer sets with a coverage guarantee: split conformal prediction on a fit's held-out answers.

A fit's examples were each answered by the fit cross-validated (fitted on the other folds), so each
one's answer is a held-out answer. For an answer p and its right label y the nonconformity is how
little probability the set must reach down to, to take y: 1 - p_y for a noul or a choice (the least
ambiguous sets of Sadinle, Lei and Wasserman 2019, the smallest on average for a given coverage),
and for a score 1 - the least probability on the levels from the most probable one to y, so that a
score's set is always a run of adjacent levels. With the n held-out nonconformities sorted, a new
answer's set at coverage c is every label whose nonconformity is within the ceil((n + 1) c)-th
smallest of them (every label when that rank exceeds n). If the examples and the new states are
exchangeable, the set holds the right label with probability at least c, and at most about
c + 1/(n + 1): each label's nonconformity is a function of the answer alone, so a set is too (no
randomisation, unlike APS), and it grows where the answer spreads its probability. A set may be
empty: no label is probable enough at that coverage, which marks an answer to check as a wide set
does. The scores come from fits on 4/5 of the examples, not the one served (cross-conformal, Vovk
2015), so the coverage is measured on held-out data too (docs/calibration.md).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

COVERAGES = (0.8, 0.9, 0.95)  # the levels `onepass calibrate` reports
Probabilities = Sequence[float] | NDArray[np.float64]  # one answer's, in its labels' order

# The share of a fit's held-out answers that calibrates the sets when their coverage is measured, and
# how many random splits that measure averages.
CHECK_SHARE, CHECK_SPLITS = 0.5, 200


def _top(probabilities: Probabilities) -> int:
    """The most probable label; ties to the lower index."""
    return min(range(len(probabilities)), key=lambda i: (-float(probabilities[i]), i))


def nonconformity(probabilities: Probabilities, label: int, ordered: bool) -> float:
    """How little probability a set must take to hold `label`: 1 - its probability, or for a score's
    levels 1 - the least probability between the most probable level and it."""
    if not 0 <= label < len(probabilities):
        raise ValueError(f"label {label} is not among the {len(probabilities)} labels")
    if not ordered:
        return 1.0 - float(probabilities[label])
    low, high = sorted((_top(probabilities), label))
    return 1.0 - min(float(p) for p in probabilities[low : high + 1])


def checked_coverage(coverage: float) -> float:
    if not 0 < coverage < 1:
        raise ValueError(f"a coverage is between 0 and 1, not {coverage!r}")
    return coverage


def threshold(scores: Sequence[float], coverage: float) -> float:
    """The sets' bound at `coverage` from the sorted held-out nonconformities: their
    ceil((n + 1) coverage)-th smallest, or infinity (every label) when n is too few for that rank."""
    rank = math.ceil((len(scores) + 1) * checked_coverage(coverage))
    return math.inf if rank > len(scores) else float(scores[rank - 1])


def answer_set(probabilities: Probabilities, bound: float, ordered: bool) -> list[int]:
    """The labels whose nonconformity is within `bound`: most probable first, or a score's levels in order."""
    found = [i for i in range(len(probabilities)) if nonconformity(probabilities, i, ordered) <= bound]
    return found if ordered else sorted(found, key=lambda i: (-float(probabilities[i]), i))


def held_out_sets(
    predicted: NDArray[np.float64], right: Sequence[int], ordered: bool, coverages: Sequence[float] = COVERAGES
) -> dict[str, dict[str, float]]:
    """How the sets did on the held-out answers: over CHECK_SPLITS random splits, CHECK_SHARE of the
    answers calibrate the bound and the rest are the new states; per coverage, the share of those
    whose set held the right label and the mean set size. Keys "0.9" and so on."""
    n = len(right)
    # each answer's nonconformity for every label, once: a set at a bound is the labels within it
    table = np.asarray([[nonconformity(p, label, ordered) for label in range(len(p))] for p in predicted])
    rights = np.asarray(right)
    scores = table[np.arange(n), rights]
    rng = np.random.default_rng(n)
    n_calibrate = max(1, int(n * CHECK_SHARE))
    found: dict[str, dict[str, float]] = {}
    for coverage in coverages:
        covered, sizes = [], []
        for _ in range(CHECK_SPLITS):
            order = rng.permutation(n)
            bound = threshold(np.sort(scores[order[:n_calibrate]]).tolist(), coverage)
            rest = order[n_calibrate:]
            covered.append(table[rest, rights[rest]] <= bound)
            sizes.append((table[rest] <= bound).sum(axis=1))
        found[f"{coverage:g}"] = {
            "coverage": float(np.mean(np.concatenate(covered))),
            "size": float(np.mean(np.concatenate(sizes))),
        }
    return found
