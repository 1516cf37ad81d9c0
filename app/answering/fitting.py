"""Calibration fitted to a user's own examples: candidates, cross-validated choice, and the metrics.

Every candidate maps a question's readout to logits over its labels; the answer is their softmax.
With r = log p_raw - log q (q: a label prior to divide out, as in contextual calibration):

- contextual (what a question gets without a fit): r / T0, q the content-free prior, T0 the model's
  calibration temperature;
- batch (label-free, Zhou et al. 2023, "Batch Calibration"): r / T0 with q the mean of the raw
  probabilities over a sample of real states, which needs no labels;
- temperature: a * r (q content-free), a fitted;
- vector: a * r + b, a bias per label, both regularised towards contextual (a = 1/T0, b = 0);
- question set (opt-in only): W x + c, where x holds the contextual r of every question asked about
  the same state, so an answer depends on the other questions (the System One contract forbids that by default);
- probe: a * r + b + W h, h the question's own last hidden state (what the model's output layer
  reads at the decision position, standardised), W penalised towards zero: a readout of the model's
  own representation learned from the examples, where the label tokens' fixed readout applies
  the policy badly. It reads nothing but this question about this state.

Fitted by Newton's method on the cross-entropy (convex in each candidate's parameters), chosen by
cross-validated log loss (5 folds, fewer where the examples are few: at least MIN_FOLD_SIZE held
out per fold, at least MIN_FOLDS folds, so a question needs MIN_LABELLED labelled examples), and
adopted only when that beats contextual calibration on the same examples. The candidates that learn
a parameter per label (vector, probe, question set) are tried only when every label is the right
answer of some example: a label no example shows would be learned as never right, and no held-out
fold could tell whether it is. Parameters are kept by label name, so a fit applies whatever the
options' order.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from numpy.typing import NDArray

Array = NDArray[np.float64]
FOLDS = 5
MIN_FOLDS = 2
MIN_FOLD_SIZE = 2  # held-out examples per fold, at least: a fold of one scores a fit on a single answer
# Fewer, and the choice among the candidates would be decided by a handful of answers.
MIN_LABELLED = 8
BINS = 10
TINY = 1e-300
VECTOR_PENALTIES = (0.0003, 0.003, 0.03, 0.3)
SET_PENALTIES = (0.001, 0.01, 0.1, 1.0)
PROBE_PENALTIES = (0.00001, 0.00003, 0.0001, 0.0003, 0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1.0)
PROBE_ANCHOR = 0.003  # the probe's penalty on its scale and biases (towards contextual calibration)
# A probe has a weight per label and direction of the examples' hidden states: bounded so that its
# Newton steps stay small matrices (a choice of many options keeps the other candidates).
PROBE_MAX_LABELS = 10
PROBE_MAX_DIRECTIONS = 100


@dataclass(frozen=True)
class Example:
    """One question's readout about one state, as ModelService.evidence gives it, and the right label."""

    labels: tuple[str, ...]
    raw: tuple[float, ...]
    prior: tuple[float, ...]
    right: int | None  # index into labels; None: unlabelled
    hidden: NDArray[np.float32] | None = field(default=None, compare=False)  # the last hidden state, for the probe


@dataclass(frozen=True)
class Fit:
    """A question's fitted calibration. `prior` None: the content-free prior measured at answer time.
    For a question-set fit, `features` names the (question, label) each weight column reads; a probe's
    weight columns read the hidden state's dimensions, standardised by `centre` and `spread`."""

    method: str
    labels: tuple[str, ...]
    scale: float = 1.0
    bias: tuple[float, ...] = ()
    prior: tuple[float, ...] | None = None
    features: tuple[tuple[str, str], ...] = ()
    centre: tuple[float, ...] = ()
    spread: tuple[float, ...] = ()
    weights: tuple[tuple[float, ...], ...] = ()  # one row per label, one column per feature
    penalty: float = 0.0
    sharpen: float = (
        1.0  # a last temperature, fitted on the cross-validated answers (the fit's own over- or under-confidence)
    )

    def to_json(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "labels": list(self.labels),
            "scale": self.scale,
            "bias": list(self.bias),
            "prior": None if self.prior is None else list(self.prior),
            "features": [list(f) for f in self.features],
            "centre": list(self.centre),
            "spread": list(self.spread),
            "weights": [list(row) for row in self.weights],
            "penalty": self.penalty,
            "sharpen": self.sharpen,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Fit:
        return cls(
            method=str(data["method"]),
            labels=tuple(str(x) for x in data["labels"]),
            scale=float(data["scale"]),
            bias=tuple(float(x) for x in data["bias"]),
            prior=None if data["prior"] is None else tuple(float(x) for x in data["prior"]),
            features=tuple((str(q), str(label)) for q, label in data["features"]),
            centre=tuple(float(x) for x in data["centre"]),
            spread=tuple(float(x) for x in data["spread"]),
            weights=tuple(tuple(float(x) for x in row) for row in data["weights"]),
            penalty=float(data["penalty"]),
            sharpen=float(data.get("sharpen", 1.0)),
        )


def log_ratio(raw: Sequence[float] | Array, prior: Sequence[float] | Array) -> Array:
    return np.log(np.maximum(np.asarray(raw, dtype=np.float64), TINY)) - np.log(
        np.maximum(np.asarray(prior, dtype=np.float64), TINY)
    )


def softmax(logits: Array) -> Array:
    shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
    result: Array = shifted / shifted.sum(axis=-1, keepdims=True)
    return result


def apply(fit: Fit, labels: Sequence[str], raw: Sequence[float], prior: Sequence[float]) -> list[float]:
    """A single-question fit's probabilities, in `labels` order (the request's)."""
    order = [fit.labels.index(label) for label in labels]
    q = prior if fit.prior is None else [fit.prior[i] for i in order]
    logits = fit.scale * log_ratio(raw, q)
    if fit.bias:
        logits = logits + np.asarray([fit.bias[i] for i in order])
    return [float(p) for p in _sharpened(softmax(logits), fit.sharpen)]


Readouts = Mapping[str, tuple[Sequence[str], Array]]  # every question's about one state, by question key


def readout_ratios(
    labels: Sequence[str], raw: Sequence[float], prior: Sequence[float]
) -> tuple[tuple[str, ...], Array]:
    """A readout as a question-set fit reads it: its labels sorted by name, and their contextual r."""
    names = tuple(sorted(labels))
    order = [list(labels).index(name) for name in names]
    return names, log_ratio([raw[i] for i in order], [prior[i] for i in order])


def apply_fit(
    fit: Fit,
    labels: Sequence[str],
    raw: Sequence[float],
    prior: Sequence[float],
    readouts: Readouts,
    hidden: NDArray[np.float32] | None = None,
) -> list[float]:
    """Any fit's probabilities in `labels` order; only a question-set fit reads `readouts`, only a
    probe `hidden`."""
    if fit.method == "question_set":
        return apply_set(fit, labels, readouts)
    if fit.method == "probe":
        if hidden is None:
            raise ValueError("a probe fit needs the question's hidden state")
        return apply_probe(fit, labels, raw, prior, hidden)
    return apply(fit, labels, raw, prior)


def apply_probe(
    fit: Fit, labels: Sequence[str], raw: Sequence[float], prior: Sequence[float], hidden: NDArray[np.float32]
) -> list[float]:
    """A probe's probabilities in `labels` order (the request's)."""
    order = [fit.labels.index(label) for label in labels]
    x = (np.asarray(hidden, dtype=np.float64) - np.asarray(fit.centre)) / np.asarray(fit.spread)
    logits = fit.scale * log_ratio(raw, prior) + (np.asarray(fit.bias) + np.asarray(fit.weights) @ x)[order]
    return [float(p) for p in _sharpened(softmax(logits), fit.sharpen)]


def apply_set(fit: Fit, labels: Sequence[str], readouts: Readouts) -> list[float]:
    """A question-set fit's probabilities in `labels` order; `readouts`: per question key, its labels and r."""
    x = np.asarray([_feature(readouts, question, label) for question, label in fit.features])
    x = (x - np.asarray(fit.centre)) / np.asarray(fit.spread)
    logits = np.asarray(fit.weights) @ np.append(x, 1.0)
    order = [fit.labels.index(label) for label in labels]
    return [float(p) for p in _sharpened(softmax(logits), fit.sharpen)[order]]


def _sharpened(probabilities: Array, sharpen: float) -> Array:
    return probabilities if sharpen == 1.0 else softmax(sharpen * np.log(np.maximum(probabilities, TINY)))


def _feature(readouts: Readouts, question: str, label: str) -> float:
    names, ratio = readouts[question]
    return float(ratio[list(names).index(label)])


# Fitting ---------------------------------------------------------------------------------------


def _newton(
    design: Array, right: NDArray[np.int64], start: Array, penalty: Array, target: Array, steps: int = 50
) -> Array:
    """Minimise mean cross-entropy of softmax(design @ theta) + sum(penalty * (theta - target)^2).

    `design`: (examples, labels, parameters). Convex: Newton steps with a backtracking line search."""
    n, k, _ = design.shape
    onehot = np.zeros((n, k))
    onehot[np.arange(n), right] = 1.0

    def loss(theta: Array) -> float:
        z = design @ theta
        z = z - z.max(axis=1, keepdims=True)
        logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
        return float(-(logp[np.arange(n), right]).mean() + (penalty * (theta - target) ** 2).sum())

    theta = start.copy()
    current = loss(theta)
    flat = design.reshape(n * k, -1)
    for _ in range(steps):
        p = softmax(design @ theta)
        gradient = flat.T @ (p - onehot).reshape(-1) / n + 2 * penalty * (theta - target)
        weighted = design * p[:, :, None]  # diag(p) J; the Hessian is J' diag(p) J - (J' p)(J' p)'
        summed = weighted.sum(1)
        hessian = flat.T @ weighted.reshape(n * k, -1) - summed.T @ summed
        hessian = hessian / n + np.diag(2 * penalty + 1e-9)
        step = np.linalg.solve(hessian, gradient)
        size = 1.0
        while size > 1e-6:
            trial = theta - size * step
            found = loss(trial)
            if found <= current:
                break
            size /= 2
        else:
            break
        if current - found < 1e-12:
            theta = trial
            break
        theta, current = trial, found
    return theta


def _ratios(examples: Sequence[Example]) -> Array:
    return np.stack([log_ratio(e.raw, e.prior) for e in examples])


def _rights(examples: Sequence[Example]) -> NDArray[np.int64]:
    return np.asarray([e.right for e in examples], dtype=np.int64)


def contextual(temperature: float, labels: Sequence[str]) -> Fit:
    return Fit("contextual", tuple(labels), scale=1.0 / temperature)


def fit_batch(unlabelled: Sequence[Example], temperature: float) -> Fit:
    """The label prior as the mean of the raw probabilities over real states (no labels needed)."""
    raw = np.asarray([e.raw for e in unlabelled])
    return Fit("batch", unlabelled[0].labels, scale=1.0 / temperature, prior=tuple(float(q) for q in raw.mean(0)))


def fit_temperature(examples: Sequence[Example], temperature: float) -> Fit:
    r = _ratios(examples)
    theta = _newton(
        r[:, :, None],
        _rights(examples),
        np.asarray([1.0 / temperature]),
        np.asarray([1e-6]),
        np.asarray([1.0 / temperature]),
    )
    return Fit("temperature", examples[0].labels, scale=float(theta[0]))


def fit_vector(examples: Sequence[Example], temperature: float, penalty: float) -> Fit:
    r = _ratios(examples)
    n, k = r.shape
    design = np.concatenate([r[:, :, None], np.broadcast_to(np.eye(k), (n, k, k))], axis=2)
    target = np.concatenate([[1.0 / temperature], np.zeros(k)])
    theta = _newton(design, _rights(examples), target, np.full(k + 1, penalty), target)
    return Fit(
        "vector", examples[0].labels, scale=float(theta[0]), bias=tuple(float(b) for b in theta[1:]), penalty=penalty
    )


def probe_ready(examples: Sequence[Example]) -> bool:
    """Whether a probe can be fitted: every example has its hidden state, and few enough labels."""
    return len(examples[0].labels) <= PROBE_MAX_LABELS and all(e.hidden is not None for e in examples)


def fit_probe(examples: Sequence[Example], temperature: float, penalty: float) -> Fit:
    """The probe, fitted in the directions the examples' standardised hidden states span (at most
    PROBE_MAX_DIRECTIONS, the largest): an L2 penalty leaves any other direction's weight at zero, so
    this is the same fit in far fewer parameters."""
    r = _ratios(examples)
    h = np.asarray([e.hidden for e in examples], dtype=np.float64)
    centre, spread = h.mean(0), h.std(0) + 1e-6
    z = (h - centre) / spread / np.sqrt(h.shape[1])  # unit length on average, whatever the model's width
    # The directions from the examples' Gram matrix (examples x examples): far smaller than the
    # hidden state is wide, so this costs little whatever the model.
    power, vectors = np.linalg.eigh(z @ z.T)
    keep = np.argsort(power)[::-1][:PROBE_MAX_DIRECTIONS]
    keep = keep[power[keep] > 1e-12 * power.max()]
    f = vectors[:, keep] * np.sqrt(power[keep])  # z's coordinates in those directions
    basis = z.T @ vectors[:, keep] / np.sqrt(power[keep])
    (n, k), m = r.shape, f.shape[1]
    design = np.concatenate(
        [
            r[:, :, None],
            np.broadcast_to(np.eye(k), (n, k, k)),
            np.einsum("kl,nm->nklm", np.eye(k), f).reshape(n, k, k * m),
        ],
        axis=2,
    )
    target = np.zeros(design.shape[2])
    target[0] = 1.0 / temperature
    penalties = np.concatenate([np.full(1 + k, PROBE_ANCHOR), np.full(k * m, penalty)])
    theta = _newton(design, _rights(examples), target, penalties, target)
    weights = theta[1 + k :].reshape(k, m) @ basis.T / np.sqrt(h.shape[1])  # on (h - centre) / spread
    return Fit(
        "probe",
        examples[0].labels,
        scale=float(theta[0]),
        bias=tuple(float(b) for b in theta[1 : 1 + k]),
        centre=tuple(float(c) for c in centre),
        spread=tuple(float(s) for s in spread),
        weights=tuple(tuple(float(w) for w in row) for row in weights),
        penalty=penalty,
    )


@dataclass(frozen=True)
class SetRow:
    """Every question's readout about one state, for a question-set fit: key -> (labels, r)."""

    readouts: dict[str, tuple[tuple[str, ...], Array]]


def fit_set(rows: Sequence[SetRow], target: str, rights: Sequence[int], penalty: float, ordinal: bool = False) -> Fit:
    """`ordinal` (score questions): one weight vector scaled by the level, logit_k = k * (w . x) + c_k
    (the adjacent-category model), so the levels share what the features say instead of each level
    learning its own weights: far fewer parameters for the same examples. Stored as the full
    weight matrix it implies, so applying it is the same as for any question-set fit."""
    features = tuple((q, label) for q in sorted(rows[0].readouts) for label in rows[0].readouts[q][0])
    x = np.asarray([[_feature(row.readouts, q, label) for q, label in features] for row in rows])
    centre, spread = x.mean(0), x.std(0) + 1e-6
    x = (x - centre) / spread
    labels = rows[0].readouts[target][0]
    k, d, n = len(labels), x.shape[1] + 1, len(rows)
    if ordinal:
        levels = np.asarray([float(label) for label in labels])
        design = np.concatenate([np.einsum("k,nd->nkd", levels, x), np.broadcast_to(np.eye(k), (n, k, k))], axis=2)
    else:
        design = np.einsum("kl,nd->nkld", np.eye(k), np.concatenate([x, np.ones((n, 1))], axis=1)).reshape(n, k, k * d)
    start = np.zeros(design.shape[2])
    theta = _newton(design, np.asarray(rights, dtype=np.int64), start, np.full(start.size, penalty), start)
    if ordinal:
        weights = np.concatenate([np.outer(levels, theta[: d - 1]), theta[d - 1 :, None]], axis=1)
    else:
        weights = theta.reshape(k, d)
    return Fit(
        "question_set",
        labels,
        features=features,
        centre=tuple(float(c) for c in centre),
        spread=tuple(float(s) for s in spread),
        weights=tuple(tuple(float(w) for w in row) for row in weights),
        penalty=penalty,
    )


# Metrics ---------------------------------------------------------------------------------------


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


# Choosing --------------------------------------------------------------------------------------

Trainer = Callable[[Sequence[int]], Callable[[Sequence[int]], Array]]  # train indices -> (indices -> probabilities)


def fold_count(n: int) -> int:
    """How many folds `n` labelled examples are cross-validated in; below MIN_FOLDS, none can be."""
    return min(FOLDS, n // MIN_FOLD_SIZE)


def folds(n: int, count: int = FOLDS) -> list[list[int]]:
    if not MIN_FOLDS <= count <= n:
        raise ValueError(f"{n} examples cannot be split into {count} folds")
    order = np.random.default_rng(n).permutation(n)
    return [sorted(int(i) for i in order[f::count]) for f in range(count)]


def cross_validated(trainer: Trainer, n: int, count: int = FOLDS) -> Array:
    """Each example's probabilities from a fit on the other folds."""
    found: Array | None = None
    for held in folds(n, count):
        train = [i for i in range(n) if i not in set(held)]
        predicted = trainer(train)(held)
        if found is None:
            found = np.zeros((n, predicted.shape[1]))
        found[held] = predicted
    assert found is not None
    return found


@dataclass(frozen=True)
class Choice:
    """What fitting one question decided: the fit to store (None: keep contextual) and its report."""

    fit: Fit | None
    method: str
    adopted: bool
    before: Scores  # contextual calibration, on every example
    after: Scores  # the chosen candidate, cross-validated
    candidates: dict[str, float]  # cross-validated log loss of each candidate
    folds: int = FOLDS
    not_tried: str | None = None  # why the per-label candidates were left out, if they were


class TooFewExamples(ValueError):
    """Fewer labelled examples than a cross-validated choice needs (MIN_LABELLED)."""


def uncovered(examples: Sequence[Example]) -> list[str]:
    """The labels no example has as its right answer."""
    seen = {e.right for e in examples}
    return [label for i, label in enumerate(examples[0].labels) if i not in seen]


def choose(
    examples: Sequence[Example],
    temperature: float,
    unlabelled: Sequence[Example] = (),
    set_rows: Sequence[SetRow] | None = None,
    key: str = "",
    ordered: bool = False,
) -> Choice:
    """Fit every candidate, keep the one with the lowest cross-validated log loss if it beats the
    contextual calibration's log loss on the same examples. `set_rows` (the opt-in question-set
    fit): every question's readout about each example's state, `key` this question's key in them;
    `ordered`: the labels are a score's levels, which adds the ordinal question-set candidate. The
    probe is a candidate when every example carries its hidden state (probe_ready). Raises
    TooFewExamples below MIN_LABELLED examples."""
    n = len(examples)
    if n < MIN_LABELLED:
        raise TooFewExamples(f"{n} labelled examples: a cross-validated fit needs at least {MIN_LABELLED}")
    count = fold_count(n)
    missing = uncovered(examples)
    not_tried = None
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        not_tried = (
            f"no example's answer is {shown} ({len(examples[0].labels) - len(missing)} of "
            f"{len(examples[0].labels)} labels seen): the per-label fits (vector, probe, question set) were not tried"
        )
        set_rows = None
    right = _rights(examples)
    r = _ratios(examples)
    shipped = softmax(r / temperature)
    before = scores(shipped, right)
    sample = list(unlabelled) or [Example(e.labels, e.raw, e.prior, None) for e in examples]

    def single(make: Callable[[Sequence[Example]], Fit]) -> Trainer:
        def train(indices: Sequence[int]) -> Callable[[Sequence[int]], Array]:
            fit = make([examples[i] for i in indices])
            return lambda held: np.asarray(
                [
                    apply_fit(fit, examples[i].labels, examples[i].raw, examples[i].prior, {}, examples[i].hidden)
                    for i in held
                ]
            )

        return train

    def vector(penalty: float) -> Callable[[Sequence[Example]], Fit]:
        return lambda chosen: fit_vector(chosen, temperature, penalty)

    def probe(penalty: float) -> Callable[[Sequence[Example]], Fit]:
        return lambda chosen: fit_probe(chosen, temperature, penalty)

    makers: dict[str, Callable[[Sequence[Example]], Fit]] = {
        "temperature": lambda chosen: fit_temperature(chosen, temperature)
    }
    if not missing:
        makers.update({f"vector/{p:g}": vector(p) for p in VECTOR_PENALTIES})
        if probe_ready(examples):
            makers.update({f"probe/{p:g}": probe(p) for p in PROBE_PENALTIES})
    batch = fit_batch(sample, temperature)  # label-free: the same fit whatever the fold
    predicted: dict[str, Array] = {
        "batch": np.asarray([apply(batch, e.labels, e.raw, e.prior) for e in examples]),
    }
    for name, make in makers.items():
        predicted[name] = cross_validated(single(make), n, count)
    set_makers: dict[str, Callable[[Sequence[int]], Fit]] = {}
    if set_rows is not None:
        rows = set_rows

        def on_set(penalty: float, ordinal: bool) -> Callable[[Sequence[int]], Fit]:
            return lambda indices: fit_set(
                [rows[i] for i in indices], key, [int(right[i]) for i in indices], penalty, ordinal
            )

        def set_trainer(make_set: Callable[[Sequence[int]], Fit]) -> Trainer:
            def train(indices: Sequence[int]) -> Callable[[Sequence[int]], Array]:
                fit = make_set(indices)
                return lambda held: np.asarray([apply_set(fit, examples[0].labels, rows[i].readouts) for i in held])

            return train

        variants = [("question_set", False)] + ([("question_set/ordinal", True)] if ordered else [])
        for prefix, ordinal in variants:
            for p in SET_PENALTIES:
                set_makers[f"{prefix}/{p:g}"] = on_set(p, ordinal)
                predicted[f"{prefix}/{p:g}"] = cross_validated(set_trainer(set_makers[f"{prefix}/{p:g}"]), n, count)
    losses = {name: scores(p, right).log_loss for name, p in predicted.items()}
    best = min(losses, key=lambda name: (losses[name], name))
    adopted = losses[best] < before.log_loss
    if not adopted:
        return Choice(None, "contextual", False, before, before, losses, count, not_tried)
    if best == "batch":
        fit = batch
    elif best in set_makers:
        fit = set_makers[best](range(n))
    else:
        fit = makers[best](examples)
    # The chosen fit's own confidence, corrected by one temperature on its held-out-fold answers.
    held_out = np.log(np.maximum(predicted[best], TINY))
    sharpen = float(_newton(held_out[:, :, None], right, np.ones(1), np.full(1, 1e-6), np.ones(1))[0])
    fit = replace(fit, sharpen=sharpen)
    after = scores(_sharpened(predicted[best], sharpen), right)
    return Choice(fit, best, True, before, after, losses, count, not_tried)
