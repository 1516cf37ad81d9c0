"""Which states to label next: those whose answers the fits are least sure of, spread over the states.

A state's worth is the mean, over its questions, of how unsure its answer is: for a question answered
by a fit with answer sets, the share of the other labels its set takes (one label: 0, every label or
none: 1), plus a small part of the probability left off its top label, so that among equal sets the
less sure answer comes first; for a question without one, the probability left off the top label. States
are taken greedily by worth times distance: the distance (1 - cosine similarity of the states' mean
vectors, Snapshot.state_mean) to the nearest state already labelled or taken, so that fifty labels
are not fifty near-copies of one ticket (a core-set with uncertainty, as in Ash et al. 2020's BADGE,
without its gradients). Without mean vectors the worth alone decides. Before any fit answers, every
state is worth the same and the spread alone chooses: on development splits of the pipelines (seed 0
only; docs/calibration.md), ranking the first labels by the model's own unsureness did no better
than drawing them at random, and choosing them for spread did.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from numpy.typing import NDArray

from app.calibration import AnswerProbabilities

# How much of "probability off the top label" breaks ties between answers with sets of one size.
TIE_SHARE = 0.1


def unsureness(answer: AnswerProbabilities) -> float:
    """0 for an answer certain of one label, up to 1."""
    off_top = 1.0 - max(answer.probabilities)
    if answer.answer_set is None:
        return off_top
    others = len(answer.probabilities) - 1
    taken = len(answer.answer_set) - 1 if answer.answer_set else others  # none: no label is probable enough
    return (1 - TIE_SHARE) * taken / others + TIE_SHARE * off_top


def worth(answers: Mapping[str, AnswerProbabilities]) -> float:
    """A state's worth of a label: its questions' mean unsureness."""
    return float(np.mean([unsureness(answer) for answer in answers.values()]))


def worths(states: Sequence[Mapping[str, AnswerProbabilities]]) -> list[float]:
    """Each state's worth of a label: its questions' unsureness once a fit answers any of them, else
    the same for every state."""
    if not any(answer.fit is not None for answers in states for answer in answers.values()):
        return [1.0] * len(states)
    return [worth(answers) for answers in states]


def next_to_label(
    worths: Sequence[float],
    vectors: Sequence[NDArray[np.float32] | None],
    labelled: Sequence[int],
    count: int,
) -> list[int]:
    """Up to `count` state indices to label next, best first, none of them in `labelled`."""
    n = len(worths)
    left = [i for i in range(n) if i not in set(labelled)]
    if not left:
        return []
    value = np.asarray(worths, dtype=np.float64)
    if any(v is None for v in vectors):
        return sorted(left, key=lambda i: (-value[i], i))[:count]
    unit = np.asarray(vectors, dtype=np.float64)
    unit -= unit.mean(axis=0)  # what the states do not share: their mean vectors are otherwise all alike
    unit /= np.maximum(np.linalg.norm(unit, axis=1, keepdims=True), 1e-12)
    nearest = np.full(n, 2.0)  # the largest cosine distance
    for i in labelled:
        nearest = np.minimum(nearest, 1.0 - unit @ unit[i])
    taken: list[int] = []
    open_ = np.zeros(n, dtype=bool)
    open_[left] = True
    while len(taken) < count and open_.any():
        score = np.where(open_, value * np.maximum(nearest, 0.0), -np.inf)
        best = int(np.argmax(score))  # the lowest index among equals
        if score[best] <= 0:  # every state left is worth nothing, or a copy of one taken: by worth
            rest = sorted(np.flatnonzero(open_).tolist(), key=lambda i: (-value[i], i))
            taken += rest[: count - len(taken)]
            break
        taken.append(best)
        open_[best] = False
        nearest = np.minimum(nearest, 1.0 - unit @ unit[best])
    return taken
