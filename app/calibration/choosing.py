"""Choosing a question's fit: every candidate cross-validated on the user's examples, the one with the
lowest held-out log loss adopted if it beats contextual calibration on the same examples.

Cross-validated in 5 folds, fewer where the examples are few (at least MIN_FOLD_SIZE held out per
fold, at least MIN_FOLDS folds, so a question needs MIN_LABELLED labelled examples). The examples
of one state are held out together: a state asked twice would otherwise be scored by a fit that
learned its own label, which makes the answers look surer than on new states, and the answer sets
calibrated on them too narrow (on the guardrail pipeline, whose states repeat). The candidates
that learn a parameter per label are tried only when every label is the right answer of some
example: a label no example shows would be learned as never right, and no held-out fold could tell
whether it is.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from app.calibration import candidates, conformal
from app.calibration.candidates import Candidate
from app.calibration.evidence import TINY, Array, Example, log_ratio
from app.calibration.fit import Fit, sharpened, softmax
from app.calibration.metrics import Scores, scores

FOLDS = 5
MIN_FOLDS = 2
MIN_FOLD_SIZE = 2  # held-out examples per fold, at least: a fold of one scores a fit on a single answer
# Fewer, and the choice among the candidates would be decided by a handful of answers.
MIN_LABELLED = 8


class TooFewExamples(ValueError):
    """Fewer labelled examples than a cross-validated choice needs (MIN_LABELLED)."""


@dataclass(frozen=True)
class FitChoice:
    """What fitting one question decided: the fit to store (None: keep contextual) and its report."""

    fit: Fit | None
    method: str  # the adopted candidate's name, or "contextual"
    adopted: bool
    before: Scores  # contextual calibration, on every example
    after: Scores  # the chosen candidate, cross-validated
    candidates: dict[str, float]  # cross-validated log loss of each candidate
    folds: int = FOLDS
    not_tried: str | None = None  # why the per-label candidates were left out, if they were
    sets: dict[str, dict[str, float]] | None = None  # the adopted fit's answer sets, held out (conformal.py)


def fold_count(n: int) -> int:
    """How many folds `n` labelled states are cross-validated in; below MIN_FOLDS, none can be."""
    return min(FOLDS, n // MIN_FOLD_SIZE)


def states_of(examples: Sequence[Example]) -> list[str]:
    """Each example's state, as folds group them: its named state, else one of its own."""
    return [e.state if e.state is not None else f"\0{i}" for i, e in enumerate(examples)]


def folds(states: Sequence[str], count: int = FOLDS) -> list[list[int]]:
    """The examples (by index) in `count` folds, every example of one state (`states`) in one fold."""
    distinct = list(dict.fromkeys(states))
    if not MIN_FOLDS <= count <= len(distinct):
        raise ValueError(f"{len(distinct)} states cannot be split into {count} folds")
    order = np.random.default_rng(len(states)).permutation(len(distinct))
    fold_of = {distinct[j]: f % count for f, j in enumerate(order)}
    return [[i for i, state in enumerate(states) if fold_of[state] == f] for f in range(count)]


def cross_validated(candidate: Candidate, examples: Sequence[Example], count: int = FOLDS) -> Array:
    """Each example's probabilities from the candidate fitted on the other folds."""
    n = len(examples)
    found: Array | None = None
    for held in folds(states_of(examples), count):
        kept = set(held)
        fit = candidate.fit([examples[i] for i in range(n) if i not in kept])
        predicted = np.asarray([_applied(fit, examples[i]) for i in held])
        if found is None:
            found = np.zeros((n, predicted.shape[1]))
        found[held] = predicted
    assert found is not None
    return found


def uncovered(examples: Sequence[Example]) -> list[str]:
    """The labels no example has as its right answer."""
    seen = {e.right for e in examples}
    return [label for i, label in enumerate(examples[0].labels) if i not in seen]


def choose(
    examples: Sequence[Example],
    temperature: float,
    unlabelled: Sequence[Example] = (),
    key: str = "",
    ordered: bool = False,
    drawn: Sequence[bool] | None = None,
) -> FitChoice:
    """Fit every candidate (candidates.table), keep the one with the lowest cross-validated log loss if
    it beats contextual calibration's log loss on the same examples. Examples that carry their set
    row add the question-set candidates of the question `key`; `ordered`: its labels are a score's
    levels; `drawn`: the examples drawn like the traffic, whose held-out answers bound the answer sets
    (all of them when fewer than MIN_LABELLED are; None: all). Raises TooFewExamples below
    MIN_LABELLED examples."""
    n = len(examples)
    if n < MIN_LABELLED:
        raise TooFewExamples(f"{n} labelled examples: a cross-validated fit needs at least {MIN_LABELLED}")
    distinct = len(set(states_of(examples)))
    count = fold_count(distinct)
    if count < MIN_FOLDS:
        raise TooFewExamples(f"{n} labelled examples of {distinct} states: too few states to cross-validate a fit")
    missing = uncovered(examples)
    not_tried = None
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        not_tried = (
            f"no example's answer is {shown} ({len(examples[0].labels) - len(missing)} of "
            f"{len(examples[0].labels)} labels seen): the per-label fits (vector, probe, question set) were not tried"
        )
    right = np.asarray([e.right for e in examples], dtype=np.int64)
    before = scores(softmax(np.stack([log_ratio(e.raw, e.prior) for e in examples]) / temperature), right)
    sample = list(unlabelled) or [replace(e, right=None) for e in examples]
    tried = candidates.table(examples, temperature, sample, per_label=not missing, key=key, ordered=ordered)
    predicted = {c.name: cross_validated(c, examples, count) for c in tried}
    losses = {name: scores(p, right).log_loss for name, p in predicted.items()}
    best = min(losses, key=lambda name: (losses[name], name))
    if losses[best] >= before.log_loss:
        return FitChoice(None, "contextual", False, before, before, losses, count, not_tried)
    fit = next(c for c in tried if c.name == best).fit(examples)
    # The chosen fit's own confidence, corrected by one temperature on its held-out-fold answers.
    held_out = np.log(np.maximum(predicted[best], TINY))
    sharpen = float(candidates.newton(held_out[:, :, None], right, np.ones(1), np.full(1, 1e-6), np.ones(1))[0])
    held = sharpened(predicted[best], sharpen)
    after = scores(held, right)
    chosen = np.asarray(drawn if drawn is not None and sum(drawn) >= MIN_LABELLED else [True] * n, dtype=bool)
    held_drawn, right_drawn = held[chosen], right[chosen]
    conformity = tuple(
        sorted(conformal.nonconformity(p, y, ordered) for p, y in zip(held_drawn, right_drawn, strict=True))
    )
    sets = conformal.held_out_sets(held_drawn, right_drawn.tolist(), ordered)
    fitted = replace(fit, sharpen=sharpen, conformity=conformity)
    return FitChoice(fitted, best, True, before, after, losses, count, not_tried, sets)


def _applied(fit: Fit, example: Example) -> list[float]:
    ratios = example.row.ratios if example.row is not None else None
    return fit.apply(example.labels, example.raw, example.prior, example.hidden, ratios, example.state_mean)
