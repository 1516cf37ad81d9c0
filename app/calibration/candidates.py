"""The candidate fits, each an object that fits itself to examples (app/calibration/fit.py says what
each computes), and the table of those a question tries.

Fitted by Newton's method on the cross-entropy, convex in each candidate's parameters. The
per-label candidates (vector, probe, question set) learn a parameter per label; batch and
temperature do not.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, get_args

import numpy as np
from numpy.typing import NDArray

from app.calibration.evidence import Array, Example, log_ratio
from app.calibration.fit import Fit, Method, feature_matrix, softmax

VECTOR_PENALTIES = (0.0003, 0.003, 0.03, 0.3)
SET_PENALTIES = (0.001, 0.01, 0.1, 1.0)
PROBE_PENALTIES = (0.00001, 0.00003, 0.0001, 0.0003, 0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1.0)
PROBE_ANCHOR = 0.003  # the probe's penalty on its scale and biases (towards contextual calibration)
# A probe has a weight per label and direction of the examples' hidden vectors: bounded so that its
# Newton steps stay small matrices (a choice of many options keeps the other candidates).
PROBE_MAX_LABELS = 10
PROBE_MAX_DIRECTIONS = 100


class Candidate(Protocol):
    """A way to fit a question's calibration: its name in reports, and its fit to some examples."""

    @property
    def name(self) -> str: ...

    def fit(self, examples: Sequence[Example]) -> Fit: ...


@dataclass(frozen=True)
class BatchCandidate:
    """Label-free: the label prior as the mean of the raw probabilities over a sample of real states.
    Fitted once, on the sample, so every fold gets the same fit."""

    fitted: Fit
    name: str = "batch"

    def fit(self, examples: Sequence[Example]) -> Fit:
        return self.fitted


@dataclass(frozen=True)
class TemperatureCandidate:
    temperature: float  # the model's calibration temperature: the start, and the fit without examples
    name: str = "temperature"

    def fit(self, examples: Sequence[Example]) -> Fit:
        r = _ratios(examples)
        start = np.asarray([1.0 / self.temperature])
        theta = newton(r[:, :, None], _rights(examples), start, np.asarray([1e-6]), start)
        return Fit("temperature", examples[0].labels, scale=float(theta[0]))


@dataclass(frozen=True)
class VectorCandidate:
    """A scale and a bias per label, regularised towards contextual calibration (scale 1/T0, bias 0)."""

    temperature: float
    penalty: float

    @property
    def name(self) -> str:
        return f"vector/{self.penalty:g}"

    def fit(self, examples: Sequence[Example]) -> Fit:
        r = _ratios(examples)
        n, k = r.shape
        design = np.concatenate([r[:, :, None], np.broadcast_to(np.eye(k), (n, k, k))], axis=2)
        target = np.concatenate([[1.0 / self.temperature], np.zeros(k)])
        theta = newton(design, _rights(examples), target, np.full(k + 1, self.penalty), target)
        bias = tuple(float(b) for b in theta[1:])
        return Fit("vector", examples[0].labels, scale=float(theta[0]), bias=bias, penalty=self.penalty)


@dataclass(frozen=True)
class ProbeCandidate:
    """A readout of a vector, learned from the examples: the question's own last hidden vector beside
    the vector fit's terms (`reads` "hidden": a probe fit), or the state's mean vector with biases
    alone ("state_mean": a state probe fit, which reads no readout, so that serving it skips the
    question's readout). Fitted in the directions the examples' standardised vectors span (at most
    PROBE_MAX_DIRECTIONS, the largest): an L2 penalty leaves any other direction's weight at zero, so
    this is the same fit in far fewer parameters."""

    temperature: float
    penalty: float
    reads: Reads = "hidden"

    @property
    def method(self) -> Method:
        return "probe" if self.reads == "hidden" else "state_probe"

    @property
    def name(self) -> str:
        return f"{self.method}/{self.penalty:g}"

    def fit(self, examples: Sequence[Example]) -> Fit:
        r = _ratios(examples)
        h = np.asarray([_vector(e, self.reads) for e in examples], dtype=np.float64)
        centre, spread = h.mean(0), h.std(0) + 1e-6
        z = (h - centre) / spread / np.sqrt(h.shape[1])  # unit length on average, whatever the model's width
        # The directions from the examples' Gram matrix (examples x examples): far smaller than the
        # hidden vector is wide, so this costs little whatever the model.
        power, vectors = np.linalg.eigh(z @ z.T)
        keep = np.argsort(power)[::-1][:PROBE_MAX_DIRECTIONS]
        keep = keep[power[keep] > 1e-12 * power.max()]
        f = vectors[:, keep] * np.sqrt(power[keep])  # z's coordinates in those directions
        basis = z.T @ vectors[:, keep] / np.sqrt(power[keep])
        (n, k), m = r.shape, f.shape[1]
        reads_r = self.reads == "hidden"
        columns = [r[:, :, None]] if reads_r else []
        columns += [np.broadcast_to(np.eye(k), (n, k, k)), np.einsum("kl,nm->nklm", np.eye(k), f).reshape(n, k, k * m)]
        design = np.concatenate(columns, axis=2)
        first = 1 + k if reads_r else k  # where the weights start
        target = np.zeros(design.shape[2])
        if reads_r:
            target[0] = 1.0 / self.temperature
        penalties = np.concatenate([np.full(first, PROBE_ANCHOR), np.full(k * m, self.penalty)])
        theta = newton(design, _rights(examples), target, penalties, target)
        weights = theta[first:].reshape(k, m) @ basis.T / np.sqrt(h.shape[1])  # on (h - centre) / spread
        return Fit(
            self.method,
            examples[0].labels,
            scale=float(theta[0]) if reads_r else 0.0,
            bias=tuple(float(b) for b in theta[first - k : first]),
            centre=tuple(float(c) for c in centre),
            spread=tuple(float(s) for s in spread),
            weights=tuple(tuple(float(w) for w in row) for row in weights),
            penalty=self.penalty,
        )


@dataclass(frozen=True)
class QuestionSetCandidate:
    """The opt-in question-set fit of the question `key`: its logits from every asked question's ratios.
    `ordinal` (score questions): one weight vector scaled by the level, logit_k = k * (w . x) + c_k
    (the adjacent-category model), so the levels share what the features say instead of each level
    learning its own weights: far fewer parameters for the same examples. Stored as the full weight
    matrix it implies, so it applies as any question-set fit does."""

    key: str
    penalty: float
    ordinal: bool = False

    @property
    def name(self) -> str:
        return f"question_set/{'ordinal/' if self.ordinal else ''}{self.penalty:g}"

    def fit(self, examples: Sequence[Example]) -> Fit:
        rows = [e.row.ratios for e in examples if e.row is not None]
        if len(rows) != len(examples):
            raise ValueError("a question-set fit needs every example's set row")
        features = tuple((q, label) for q in sorted(rows[0]) for label in rows[0][q][0])
        x = feature_matrix(rows, features)
        centre, spread = x.mean(0), x.std(0) + 1e-6
        x = (x - centre) / spread
        labels = rows[0][self.key][0]
        k, d, n = len(labels), x.shape[1] + 1, len(rows)
        if self.ordinal:
            levels = np.asarray([float(label) for label in labels])
            design = np.concatenate([np.einsum("k,nd->nkd", levels, x), np.broadcast_to(np.eye(k), (n, k, k))], axis=2)
        else:
            ones = np.concatenate([x, np.ones((n, 1))], axis=1)
            design = np.einsum("kl,nd->nkld", np.eye(k), ones).reshape(n, k, k * d)
        start = np.zeros(design.shape[2])
        theta = newton(design, _rights(examples), start, np.full(start.size, self.penalty), start)
        if self.ordinal:
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
            penalty=self.penalty,
        )


Reads = Literal["hidden", "state_mean"]  # the vector a probe reads


def _vector(example: Example, reads: Reads) -> NDArray[np.float32] | None:
    return example.hidden if reads == "hidden" else example.state_mean


def fit_batch(sample: Sequence[Example], temperature: float) -> Fit:
    """The label prior as the mean of the raw probabilities over real states (no labels needed)."""
    raw = np.asarray([e.raw for e in sample])
    return Fit("batch", sample[0].labels, scale=1.0 / temperature, prior=tuple(float(q) for q in raw.mean(0)))


def probe_ready(examples: Sequence[Example], reads: Reads = "hidden") -> bool:
    """Whether a probe can be fitted: every example has the vector it reads, and few enough labels."""
    return len(examples[0].labels) <= PROBE_MAX_LABELS and all(_vector(e, reads) is not None for e in examples)


def table(
    examples: Sequence[Example],
    temperature: float,
    sample: Sequence[Example],
    *,
    per_label: bool,
    key: str = "",
    ordered: bool = False,
) -> list[Candidate]:
    """The candidates a question tries: batch (fitted on `sample`) and temperature always; with
    `per_label`, the vector fits, the probes where every example has its hidden vector, and where every
    example carries its set row the question-set fits of the question `key` (`ordered`: a score's
    levels, which adds the ordinal ones)."""
    found: list[Candidate] = [BatchCandidate(fit_batch(sample, temperature)), TemperatureCandidate(temperature)]
    if not per_label:
        return found
    found += [VectorCandidate(temperature, p) for p in VECTOR_PENALTIES]
    for reads in get_args(Reads):
        if probe_ready(examples, reads):
            found += [ProbeCandidate(temperature, p, reads) for p in PROBE_PENALTIES]
    if all(e.row is not None for e in examples):
        for ordinal in (False, True) if ordered else (False,):
            found += [QuestionSetCandidate(key, p, ordinal) for p in SET_PENALTIES]
    return found


def _ratios(examples: Sequence[Example]) -> Array:
    return np.stack([log_ratio(e.raw, e.prior) for e in examples])


def _rights(examples: Sequence[Example]) -> NDArray[np.int64]:
    return np.asarray([e.right for e in examples], dtype=np.int64)


def newton(
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
