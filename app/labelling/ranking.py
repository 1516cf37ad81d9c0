"""Which states to label next: those whose answers the fits are least sure of, spread over the states.

A state's worth is the mean, over its questions, of how unsure its answer is: for a question answered
by a fit with answer sets, the share of the other labels its set takes (one label: 0, every label or
none: 1), plus a small part of the probability left off its top label, so that among equal sets the
less sure answer comes first; for a question without one, the probability left off the top label. States
are taken greedily by worth times distance: the distance (1 - cosine similarity of the states' mean
vectors, Snapshot.state_mean) to the nearest state already labelled or taken, so that fifty labels
are not fifty near-copies of one ticket (a core-set with uncertainty, as in Ash et al. 2020's BADGE,
without its gradients). Without mean vectors the worth alone decides. One label in four goes to a
state drawn at random instead (by a hash of its content): the answer sets are calibrated on those
alone, since states chosen for being unsure would set their bound too loose. Before any fit answers, every
state is worth the same and the spread alone chooses: on development splits of the pipelines (seed 0
only; docs/calibration.md), ranking the first labels by the model's own unsureness did no better
than drawing them at random, and choosing them for spread did.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import blake3
import numpy as np
from numpy.typing import NDArray

from app.calibration import AnswerProbabilities

# How much of "probability off the top label" breaks ties between answers with sets of one size.
TIE_SHARE = 0.1
# One state in this many is offered at random rather than by worth: the labels the answer sets are
# calibrated on, which must be drawn like the traffic for their coverage to hold (conformal.py).
DRAWN_EVERY = 4


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


def drawn(keys: Sequence[str]) -> list[int]:
    """The states offered at random, in the order they are offered: the 1 in DRAWN_EVERY whose content
    (`keys`) hashes lowest, so that which they are depends on nothing a model answered or a user said."""
    order = sorted(range(len(keys)), key=lambda i: blake3.blake3(keys[i].encode()).digest())
    return order[: -(-len(keys) // DRAWN_EVERY)]


def directions(vectors: Sequence[NDArray[np.float32] | None]) -> NDArray[np.float32] | None:
    """What the spread compares: each state's mean vector less the states' mean (their mean vectors are
    otherwise all alike), at unit length; None where a state has no vector. Made once per set of states."""
    if not vectors or any(v is None for v in vectors):
        return None
    unit = np.stack([np.asarray(v, dtype=np.float32) for v in vectors])
    unit -= unit.mean(axis=0)
    unit /= np.maximum(np.sqrt(np.einsum("ij,ij->i", unit, unit)), 1e-12)[:, None]
    return unit


def next_to_label(
    worths: Sequence[float],
    unit: NDArray[np.float32] | None,
    labelled: Sequence[int],
    count: int,
    drawn: Sequence[int] = (),
) -> list[int]:
    """Up to `count` state indices to label next, none of them in `labelled`: one label in DRAWN_EVERY
    (by the count of labels) the next of the `drawn` states, the others the best ranked of the rest.
    `unit`: the states' directions(), None to rank by worth alone."""
    done = set(labelled)
    left = [i for i in drawn if i not in done]
    ranked = _ranked(worths, unit, labelled, [*labelled, *left], count)
    found: list[int] = []
    while len(found) < count and (left or ranked):
        turn = (len(labelled) + len(found)) % DRAWN_EVERY == 0
        found.append(left.pop(0) if left and (turn or not ranked) else ranked.pop(0))
    return found


def _ranked(
    worths: Sequence[float],
    unit: NDArray[np.float32] | None,
    labelled: Sequence[int],
    excluded: Sequence[int],
    count: int,
) -> list[int]:
    """Up to `count` states not in `excluded`, best first: worth times distance to the labelled and taken."""
    n = len(worths)
    out = set(excluded)
    left = [i for i in range(n) if i not in out]
    if not left:
        return []
    value = np.asarray(worths, dtype=np.float64)
    if unit is None:
        return sorted(left, key=lambda i: (-value[i], i))[:count]
    nearest = np.full(n, 2.0)  # the largest cosine distance
    if labelled:  # one product for all the labelled states: thousands of states, hundreds of labels
        nearest = np.minimum(nearest, 1.0 - (unit @ unit[list(labelled)].T).max(axis=1).astype(np.float64))
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
        nearest = np.minimum(nearest, 1.0 - (unit @ unit[best]).astype(np.float64))
    return taken
