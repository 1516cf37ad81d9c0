"""A fit: a question's calibration learned from the user's examples, how it maps evidence to
probabilities, and the record it is stored and reported as.

Every fit maps a question's evidence to logits over its labels; the answer is their softmax. With
r = log p_raw - log q (q a label prior to divide out, as in contextual calibration):

- batch (label-free, Zhou et al. 2023, "Batch Calibration"): scale * r, q the mean of the raw
  probabilities over a sample of real states, which needs no labels;
- temperature: scale * r, q the content-free prior;
- vector: scale * r + bias, a bias per label;
- probe: scale * r + bias + W h, h the question's own last hidden vector, standardised by centre and spread;
- state_probe: bias + W h, h the state's mean vector (a middle layer's output averaged over the
  state's rows: Snapshot.state_mean), which in question-first has read the questions before it. It
  reads no readout, so a question it answers is not read out at all;
- question_set: W x + c, x every asked question's r about the same state (opt-in: such an answer
  depends on the other questions, which the System One contract forbids by default).

Then a last temperature (`sharpen`), fitted on the cross-validated answers. Parameters are kept by
label name, so a fit applies whatever the order of the options.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, get_args

import numpy as np
from numpy.typing import NDArray

from app.calibration.evidence import TINY, Array, Ratio, log_ratio

Method = Literal["batch", "temperature", "vector", "probe", "state_probe", "question_set"]
METHODS: tuple[Method, ...] = get_args(Method)


@dataclass(frozen=True)
class Fit:
    """A question's fitted calibration. `prior` None: the content-free prior measured at answer time.
    For a question-set fit, `features` names the (question key, label) each weight column reads; a
    probe's weight columns read the hidden vector's dimensions, standardised by `centre` and `spread`."""

    method: Method
    labels: tuple[str, ...]
    scale: float = 1.0
    bias: tuple[float, ...] = ()
    prior: tuple[float, ...] | None = None
    features: tuple[tuple[str, str], ...] = ()
    centre: tuple[float, ...] = ()
    spread: tuple[float, ...] = ()
    weights: tuple[tuple[float, ...], ...] = ()  # one row per label, one column per feature
    penalty: float = 0.0
    sharpen: float = 1.0  # a last temperature: the fit's own over- or under-confidence, corrected
    # Its held-out answers' nonconformities, sorted: what its answer sets are bounded by (conformal.py).
    conformity: tuple[float, ...] = ()

    @property
    def reads_every_question(self) -> bool:
        return self.method == "question_set"

    @property
    def reads_hidden(self) -> bool:
        return self.method == "probe"

    @property
    def reads_state_mean(self) -> bool:
        return self.method == "state_probe"

    @property
    def reads_readout(self) -> bool:
        """Whether the fit reads its question's readout (its raw probabilities, its hidden vector): all
        but a state probe, which reads the state's mean vector alone."""
        return not self.reads_state_mean

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
            "conformity": list(self.conformity),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Fit:
        method = str(data["method"])
        if method not in METHODS:
            raise ValueError(f"unknown fit method {method!r}")
        return cls(
            method=method,
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
            conformity=tuple(float(x) for x in data.get("conformity", ())),
        )

    def apply(
        self,
        labels: Sequence[str],
        raw: Sequence[float],
        prior: Sequence[float],
        hidden: NDArray[np.float32] | None = None,
        ratios: Mapping[str, Ratio] | None = None,
        state_mean: NDArray[np.float32] | None = None,
    ) -> list[float]:
        """The probabilities in `labels` order (the request's), from a question's evidence. Only a
        question-set fit reads `ratios` (every asked question's, by question key), only a probe `hidden`,
        only a state probe `state_mean` (and nothing else: `apply_to_state`)."""
        if self.method == "question_set":
            if ratios is None:
                raise ValueError("a question-set fit reads every question's ratios")
            return self._set(labels, ratios)
        if self.method == "state_probe":
            return self.apply_to_state(labels, state_mean)
        order = self._order(labels)
        logits = self.scale * log_ratio(raw, prior if self.prior is None else [self.prior[i] for i in order])
        if self.method == "probe":
            if hidden is None:
                raise ValueError("a probe fit needs the question's hidden vector")
            logits = logits + self._read(hidden)[order]
        elif self.bias:
            logits = logits + np.asarray([self.bias[i] for i in order])
        return [float(p) for p in sharpened(softmax(logits), self.sharpen)]

    def apply_to_state(self, labels: Sequence[str], state_mean: NDArray[np.float32] | None) -> list[float]:
        """A state probe's probabilities in `labels` order, from the state's mean vector alone."""
        if self.method != "state_probe":
            raise ValueError(f"a {self.method} fit reads its question's readout")
        if state_mean is None:
            raise ValueError("a state_probe fit needs the state's mean vector")
        return [float(p) for p in sharpened(softmax(self._read(state_mean)[self._order(labels)]), self.sharpen)]

    def _read(self, vector: NDArray[np.float32]) -> NDArray[np.float64]:
        """A probe's logits from its vector, in the fit's label order."""
        x = (np.asarray(vector, dtype=np.float64) - np.asarray(self.centre)) / np.asarray(self.spread)
        logits: NDArray[np.float64] = np.asarray(self.bias) + np.asarray(self.weights) @ x
        return logits

    def _order(self, labels: Sequence[str]) -> list[int]:
        return [self.labels.index(label) for label in labels]

    def _set(self, labels: Sequence[str], ratios: Mapping[str, Ratio]) -> list[float]:
        x = np.asarray([_feature(ratios, question, label) for question, label in self.features])
        x = (x - np.asarray(self.centre)) / np.asarray(self.spread)
        logits = np.asarray(self.weights) @ np.append(x, 1.0)
        return [float(p) for p in sharpened(softmax(logits), self.sharpen)[self._order(labels)]]


def softmax(logits: Array) -> Array:
    shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
    result: Array = shifted / shifted.sum(axis=-1, keepdims=True)
    return result


def sharpened(probabilities: Array, sharpen: float) -> Array:
    return probabilities if sharpen == 1.0 else softmax(sharpen * np.log(np.maximum(probabilities, TINY)))


def _feature(ratios: Mapping[str, Ratio], question: str, label: str) -> float:
    names, ratio = ratios[question]
    return float(ratio[list(names).index(label)])


def feature_matrix(rows: Sequence[Mapping[str, Ratio]], features: Sequence[tuple[str, str]]) -> NDArray[np.float64]:
    return np.asarray([[_feature(row, q, label) for q, label in features] for row in rows])


@dataclass(frozen=True)
class FitRecord:
    """A fit as it is stored, listed (GET /v1/calibrations) and reported: what it answers, how it was
    chosen, on how many examples. Stored files keep exactly these fields (to_json)."""

    key: str  # the question's content key (question_key); a question-set fit's target question
    question: dict[str, Any]  # the question as canonical JSON
    method: str  # the candidate adopted: "vector/0.003", "probe/0.001", "batch (label-free)", ...
    fit: Fit
    examples: int  # labelled examples it was fitted on; 0 for a label-free fit
    states: int | None = None  # a label-free fit: the states it was fitted on
    before: dict[str, Any] | None = None  # contextual calibration's scores on the examples
    after: dict[str, Any] | None = None  # the fit's, cross-validated
    # its answer sets on its held-out answers, per coverage: {"0.9": {"coverage": ..., "size": ...}}
    sets: dict[str, Any] | None = None
    question_set: tuple[str, ...] | None = None  # a question-set fit: the keys of every question it reads
    # the keys of the questions every example asked it with (None: they asked it in different sets); in
    # question-first, where a question's prompt holds the whole set, the fit applies to that set only
    asked_with: tuple[str, ...] | None = None
    id: str = ""  # given when stored
    identity: str = ""  # the model file and prompt it was fitted for, given when stored

    def to_json(self) -> dict[str, Any]:
        found: dict[str, Any] = {
            "key": self.key,
            "question": self.question,
            "method": self.method,
            "fit": self.fit.to_json(),
            "examples": self.examples,
        }
        optional = {"states": self.states, "before": self.before, "after": self.after, "sets": self.sets}
        found.update({name: value for name, value in optional.items() if value is not None})
        if self.question_set is not None:
            found["set"] = list(self.question_set)
        if self.asked_with is not None:
            found["asked_with"] = list(self.asked_with)
        if self.identity:
            found["identity"] = self.identity
        if self.id:
            found["id"] = self.id
        return found

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> FitRecord:
        question_set, asked_with = data.get("set"), data.get("asked_with")
        return cls(
            key=str(data["key"]),
            question=dict(data["question"]),
            method=str(data["method"]),
            fit=Fit.from_json(data["fit"]),
            examples=int(data["examples"]),
            states=None if data.get("states") is None else int(data["states"]),
            before=data.get("before"),
            after=data.get("after"),
            sets=data.get("sets"),
            question_set=None if question_set is None else tuple(str(key) for key in question_set),
            asked_with=None if asked_with is None else tuple(str(key) for key in asked_with),
            id=str(data.get("id", "")),
            identity=str(data.get("identity", "")),
        )
