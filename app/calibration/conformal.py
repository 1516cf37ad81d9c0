"""Answer sets with a coverage guarantee: split conformal prediction on a fit's held-out answers.

A fit's examples were each answered by the fit cross-validated (fitted on the other folds), so each
one's answer is a held-out answer. For an answer p and its right label y the nonconformity is the
probability mass a set must take, in the set's own order, to reach y: the labels most probable first
(APS, Romano et al. 2020, without its randomisation, so an answer's set is a function of its
probabilities), or for a score's ordered levels an interval grown from the most probable level toward
its more probable neighbour, so the set is always a run of adjacent levels. With the n held-out
nonconformities sorted, a new answer's set at coverage c takes its labels, in that order, while their
mass stays within the ceil((n + 1) c)-th smallest of them (all labels when that rank exceeds n), and
always its most probable one. If the examples and the new states are exchangeable, the set holds the
right label with probability at least about c: the scores come from fits on 4/5 of the examples, not
the one served (cross-conformal, Vovk 2015), and docs/calibration.md gives the coverage measured on
held-out data.
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


def set_order(probabilities: Probabilities, ordered: bool) -> list[int]:
    """The labels in the order a set takes them. Ties go to the lower index, so the order is a
    function of the probabilities alone."""
    p = [float(x) for x in probabilities]
    top = min(range(len(p)), key=lambda i: (-p[i], i))
    if not ordered:
        return sorted(range(len(p)), key=lambda i: (-p[i], i))
    found, low, high = [top], top - 1, top + 1
    while low >= 0 or high < len(p):
        if high >= len(p) or (low >= 0 and p[low] >= p[high]):
            found.append(low)
            low -= 1
        else:
            found.append(high)
            high += 1
    return found


def nonconformity(probabilities: Probabilities, right: int, ordered: bool) -> float:
    """The mass of the labels a set takes up to and including the right one."""
    mass = 0.0
    for label in set_order(probabilities, ordered):
        mass += float(probabilities[label])
        if label == right:
            return mass
    raise ValueError(f"label {right} is not among the {len(probabilities)} labels")


def checked_coverage(coverage: float) -> float:
    if not 0 < coverage < 1:
        raise ValueError(f"a coverage is between 0 and 1, not {coverage!r}")
    return coverage


def threshold(scores: Sequence[float], coverage: float) -> float:
    """The set's mass bound at `coverage` from the sorted held-out nonconformities: their
    ceil((n + 1) coverage)-th smallest, or infinity (every label) when n is too few for that rank."""
    rank = math.ceil((len(scores) + 1) * checked_coverage(coverage))
    return math.inf if rank > len(scores) else float(scores[rank - 1])


def answer_set(probabilities: Probabilities, bound: float, ordered: bool) -> list[int]:
    """The labels of an answer's set under the mass bound `bound`, in the set's order: the most
    probable label, then each next one while the mass taken stays within the bound."""
    order = set_order(probabilities, ordered)
    found, mass = [order[0]], float(probabilities[order[0]])
    for label in order[1:]:
        mass += float(probabilities[label])
        if mass > bound:
            break
        found.append(label)
    return found


def held_out_sets(
    predicted: NDArray[np.float64], right: Sequence[int], ordered: bool, coverages: Sequence[float] = COVERAGES
) -> dict[str, dict[str, float]]:
    """How the sets did on the held-out answers: over CHECK_SPLITS random splits, CHECK_SHARE of the
    answers calibrate the bound and the rest are the new states; per coverage, the share of those
    whose set held the right label and the mean set size. Keys "0.9" and so on."""
    n = len(right)
    scores = np.asarray([nonconformity(p, y, ordered) for p, y in zip(predicted, right, strict=True)])
    rng = np.random.default_rng(n)
    n_calibrate = max(1, int(n * CHECK_SHARE))
    found: dict[str, dict[str, float]] = {}
    for coverage in coverages:
        covered, sizes = [], []
        for _ in range(CHECK_SPLITS):
            order = rng.permutation(n)
            bound = threshold(np.sort(scores[order[:n_calibrate]]).tolist(), coverage)
            for i in order[n_calibrate:]:
                labels = answer_set(predicted[i], bound, ordered)
                covered.append(right[i] in labels)
                sizes.append(len(labels))
        found[f"{coverage:g}"] = {"coverage": float(np.mean(covered)), "size": float(np.mean(sizes))}
    return found
