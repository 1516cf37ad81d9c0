"""What calibration reads of one question about one state: its evidence, and an example (evidence with
the right answer) as fitting uses it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

Array = NDArray[np.float64]
TINY = 1e-300


@dataclass(frozen=True)
class Evidence:
    """One question's readout about one state, in the answer's label order."""

    labels: list[str]  # "true"/"false", the option names, or the level indices
    raw: list[float]  # the model's probabilities over the labels
    prior: list[float]  # the same question's about content-free states (contextual calibration)
    # the last hidden vector at its decision position, when asked (float32: thousands of them fit in memory)
    hidden: NDArray[np.float32] | None = field(default=None, compare=False)
    # a middle layer's output averaged over the state's rows (Snapshot.state_mean), where the engine reads it
    state_mean: NDArray[np.float32] | None = field(default=None, compare=False)
    # the share of the next token's probability on the answer labels (the answer's x_label_mass)
    mass: float | None = field(default=None, compare=False)


Ratio = tuple[tuple[str, ...], Array]  # a question's labels sorted by name, and their contextual log-ratios


@dataclass(frozen=True)
class SetRow:
    """Every question's ratios about one state, by question key: what a question-set fit reads."""

    ratios: Mapping[str, Ratio]


@dataclass(frozen=True)
class Example:
    """One question's evidence about one state as fitting reads it, its labels in sorted order, and the
    right label (None: unlabelled)."""

    labels: tuple[str, ...]
    raw: tuple[float, ...]
    prior: tuple[float, ...]
    right: int | None  # index into labels
    hidden: NDArray[np.float32] | None = field(default=None, compare=False)  # for the probe
    row: SetRow | None = field(default=None, compare=False)  # every question's ratios, for a question-set fit
    state_mean: NDArray[np.float32] | None = field(default=None, compare=False)  # for the state probe
    # What names the state (None: this example's own): cross-validation holds one state's examples out
    # together, so that a fit is scored on states it has not seen, as served answers are.
    state: str | None = None


def log_ratio(raw: Sequence[float] | Array, prior: Sequence[float] | Array) -> Array:
    return np.log(np.maximum(np.asarray(raw, dtype=np.float64), TINY)) - np.log(
        np.maximum(np.asarray(prior, dtype=np.float64), TINY)
    )


def ratio_of(evidence: Evidence) -> Ratio:
    """A question's evidence as a question-set fit reads it: its labels sorted by name, and their log-ratios."""
    names = tuple(sorted(evidence.labels))
    order = [list(evidence.labels).index(name) for name in names]
    return names, log_ratio([evidence.raw[i] for i in order], [evidence.prior[i] for i in order])


def example_of(
    evidence: Evidence, right: int | None, labels: Sequence[str], row: SetRow | None = None, state: str | None = None
) -> Example:
    """The evidence with its labels in `labels` order (sorted: a choice's options may come in any order);
    `right` indexes the evidence's own labels; `state` names the state it is about."""
    order = [list(evidence.labels).index(label) for label in labels]
    return Example(
        tuple(labels),
        tuple(evidence.raw[i] for i in order),
        tuple(evidence.prior[i] for i in order),
        None if right is None else order.index(right),
        evidence.hidden,
        row,
        evidence.state_mean,
        state,
    )
