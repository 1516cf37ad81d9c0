"""Which probabilities a question's answer gets: its raw readout, contextually calibrated, or under
a fit of the user's, and which fit was used. The one object the request path asks.

Without a fit, onepass's own prompt is answered raw (calibration "none") or with the content-free
prior divided out at the model's calibration temperature ("contextual"); a decision model's
question at its file's temperature, its prior divided out first with "contextual". A fit (the
user's examples, app/calibration/choosing.py) replaces either for the questions it matches.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol, get_args

import numpy as np
from numpy.typing import NDArray

from app.calibration import candidates, choosing, conformal
from app.calibration.contextual import Priors, divide
from app.calibration.evidence import Evidence, Example, ratio_of
from app.calibration.fit import Fit, FitRecord
from app.calibration.scoring import softmax
from app.calibration.store import FitStore, question_key
from app.engine.engine import Readout
from app.engine.snapshot import Snapshot
from app.wire.contract import Question, label_keys

Vector = NDArray[np.float32]

Mode = Literal["none", "contextual"]


class SuffixProtocol(Protocol):
    """What calibration reads of a question's suffix (app/answering/prompter.py's Suffix): its tokens
    after the prefix, and the label ids it reads."""

    @property
    def tokens(self) -> tuple[int, ...]: ...

    @property
    def label_ids(self) -> tuple[int, ...]: ...


class ReadingProtocol(Protocol):
    """What calibration reads of how a question is asked and read (app/answering/prompter.py's
    Reading, which the request path hands down: calibration stands below the prompters)."""

    @property
    def variants(self) -> Sequence[SuffixProtocol]: ...

    @property
    def temperature(self) -> float | None: ...  # a decision model's, from its file; None: the model's own

    @property
    def one_logit_per_label(self) -> bool: ...  # each label is one token's logit: priors and fits read those

    def scores(self, readout: Readout) -> list[float]: ...  # each label's score in one variant's readout

    def mass(self, readouts: Sequence[Readout]) -> float | None: ...

    def read(self, per_variant: Sequence[Sequence[float]]) -> list[float]: ...


@dataclass(frozen=True)
class QuestionReadouts:
    """One question of a request as the decode read it: one readout per variant of its reading."""

    question: Question
    reading: ReadingProtocol
    readouts: Sequence[Readout]

    def raw(self) -> list[float]:
        """The answer before any calibration or temperature: each variant's label softmax, read as the
        format reads its variants."""
        return self.reading.read([softmax(self.reading.scores(r)) for r in self.readouts])

    def hidden(self) -> NDArray[np.float32] | None:
        """The hidden vector a probe reads: the variants' mean (None: not decoded for it)."""
        vectors = [r.hidden for r in self.readouts]
        if any(vector is None for vector in vectors):
            return None
        if len(vectors) == 1:
            return vectors[0]
        mean: NDArray[np.float32] = np.mean(np.asarray(vectors, dtype=np.float64), axis=0).astype(np.float32)
        return mean

    def mass(self) -> float | None:
        """The share of the next token's probability on the labels (x_label_mass; None: no readout)."""
        return self.reading.mass(self.readouts) if self.readouts else None


@dataclass(frozen=True)
class AnswerProbabilities:
    """A question's answer probabilities, its raw ones where calibration changed them (x_raw), the
    user's fit that gave them (x_calibration), and the fit's answer set at `coverage` (x_set: the label
    indices, in the set's order)."""

    probabilities: list[float]
    raw: list[float] | None = None
    fit: FitRecord | None = None
    answer_set: list[int] | None = None
    coverage: float | None = None


@dataclass(frozen=True)
class FitsFound:
    """The user's fits that answer a request's questions, by question id."""

    by_id: dict[str, FitRecord] = field(default_factory=dict)

    @property
    def reads_hidden(self) -> bool:
        """Whether a fit reads its question's hidden vector, which only a decode that asks for it gives."""
        return any(record.fit.reads_hidden for record in self.by_id.values())

    @property
    def reads_state_mean(self) -> bool:
        """Whether a fit reads the state's mean vector, which only a snapshot prefilled here has."""
        return any(record.fit.reads_state_mean for record in self.by_id.values())

    @property
    def state_only(self) -> frozenset[str]:
        """The questions whose answers read the state's mean vector alone: they need no readout (unless
        a question-set fit reads every question's)."""
        if any(record.fit.reads_every_question for record in self.by_id.values()):
            return frozenset()
        return frozenset(qid for qid, record in self.by_id.items() if not record.fit.reads_readout)


def fits_among(
    questions: Mapping[str, Question], set_fits: Iterable[FitRecord], single: Callable[[str], FitRecord | None]
) -> dict[str, FitRecord]:
    """By question id, the fit that answers each question: a question-set fit among `set_fits` whose
    whole set the questions ask, else the question's own (`single`, by content key); none, left out."""
    keys = {qid: question_key(question) for qid, question in questions.items()}
    asked = set(keys.values())
    sets = {r.key: r for r in set_fits if r.question_set is not None and set(r.question_set) <= asked}
    found = {qid: sets.get(key) or single(key) for qid, key in keys.items()}
    return {qid: record for qid, record in found.items() if record is not None}


class Calibration:
    """One model's calibration: its mode, its temperature, the content-free priors, the user's fits."""

    def __init__(
        self, mode: str, temperature: float, priors: Priors, store: FitStore | None = None, coverage: float = 0.9
    ) -> None:
        if mode not in get_args(Mode):
            raise ValueError(f"calibration is one of {', '.join(get_args(Mode))}, not {mode!r}")
        if temperature <= 0:
            raise ValueError("the calibration temperature must be positive")
        self.mode: Mode = "contextual" if mode == "contextual" else "none"
        self.temperature = temperature  # T0: divides the calibrated log-probabilities (below 1 sharpens)
        self.priors = priors
        self.store = store  # None: this model keeps no fits
        self.coverage = conformal.checked_coverage(coverage)  # a fitted answer's set's, unless a request asks another

    def fits_for(self, questions: Mapping[str, Question], *, same_set: bool = False) -> FitsFound:
        """The fits that answer these questions. A question-set fit applies only when the request asks
        its whole set; with `same_set` (question-first, where each question's prompt holds every
        question of the request) a fit whose examples all asked one set applies only to that set."""
        if self.store is None:
            return FitsFound()
        asked = {question_key(question) for question in questions.values()}
        found = fits_among(questions, self.store.for_set(asked), self.store.single)
        return FitsFound(
            {
                qid: record
                for qid, record in found.items()
                if not (same_set and record.asked_with and set(record.asked_with) != asked)
            }
        )

    def calibrate(
        self,
        base: Snapshot,
        asked: Mapping[str, QuestionReadouts],
        fits: FitsFound,
        state_mean: Vector | None = None,
        coverage: float | None = None,
    ) -> dict[str, AnswerProbabilities]:
        """Each question's probabilities. `base`: the snapshot the suffixes followed (the priors are
        measured after it, the first time a question is seen); `state_mean`: the state's, where read;
        `coverage`: the answer sets' (None: this model's default)."""
        fitted = self._fitted(base, asked, fits, state_mean)
        coverage = self.coverage if coverage is None else coverage
        found = {}
        for qid, question in asked.items():
            record = fits.by_id.get(qid)
            if record is not None:
                raw = question.raw() if question.readouts else None  # None: read from the state alone
                found[qid] = _with_set(question.question, fitted[qid], raw, record, coverage)
            else:
                found[qid] = self._unfitted(base, question)
        return found

    def answer_evidence(
        self,
        questions: Mapping[str, Question],
        row: Mapping[str, Evidence],
        fits: FitsFound,
        coverage: float | None = None,
    ) -> dict[str, AnswerProbabilities]:
        """Each question's answer from its stored evidence about one state (what fitting keeps of an
        answered state, `row` by question id), as `calibrate` answers it from a decode: by its fit,
        with the fit's set, where one applies; else contextually calibrated (or raw with "none")."""
        coverage = self.coverage if coverage is None else coverage
        ratios = {question_key(questions[qid]): ratio_of(e) for qid, e in row.items()}
        found = {}
        for qid, question in questions.items():
            e, record = row[qid], fits.by_id.get(qid)
            if record is None:
                calibrated = e.raw if self.mode == "none" else divide(e.raw, e.prior, self.temperature)
                found[qid] = AnswerProbabilities(list(calibrated), e.raw)
            else:
                fitted = record.fit.apply(e.labels, e.raw, e.prior, e.hidden, ratios, e.state_mean)
                found[qid] = _with_set(question, fitted, e.raw, record, coverage)
        return found

    def evidence(
        self, base: Snapshot, asked: Mapping[str, QuestionReadouts], state_mean: Vector | None = None
    ) -> dict[str, Evidence]:
        """What fitting reads of each question: its raw probabilities and content-free prior, in label
        order, the hidden vector where the decode read it, and the state's mean vector where read.
        Raises ValueError for a question not read from one token's logit per label (a decision head:
        no prior, no fit)."""
        found = {}
        for qid, question in asked.items():
            reading = question.reading
            if not reading.one_logit_per_label:
                raise ValueError("this model's answers are not one token's logit per label: it takes no fit")
            prior = reading.read([self.priors.prior(base, v.tokens, v.label_ids) for v in reading.variants])
            found[qid] = Evidence(
                label_keys(question.question), question.raw(), prior, question.hidden(), state_mean, question.mass()
            )
        return found

    def choose(
        self,
        examples: Sequence[Example],
        unlabelled: Sequence[Example],
        key: str,
        ordered: bool,
        drawn: Sequence[bool] | None = None,
    ) -> choosing.FitChoice:
        """The fit for one question's labelled examples (app/calibration/choosing.py), at this model's
        temperature; `drawn`: which examples were drawn like the traffic (None: all)."""
        return choosing.choose(examples, self.temperature, unlabelled, key, ordered, drawn)

    def label_free(self, sample: Sequence[Example]) -> Fit:
        """Batch calibration, fitted on states without labels."""
        return candidates.fit_batch(sample, self.temperature)

    def _unfitted(self, base: Snapshot, asked: QuestionReadouts) -> AnswerProbabilities:
        raw = asked.raw()
        reading, own = asked.reading, asked.reading.temperature
        # "none", or a decision head: its file's temperature where it has one, as llama.cpp
        if self.mode == "none" or not reading.one_logit_per_label:
            if own is None:
                return AnswerProbabilities(raw)
            per_variant = [softmax([x / own for x in reading.scores(r)]) for r in asked.readouts]
        else:
            t = self.temperature if own is None else own
            per_variant = [
                divide(softmax(r.label_logits), self.priors.prior(base, v.tokens, v.label_ids), t)
                for v, r in zip(reading.variants, asked.readouts, strict=True)
            ]
        return AnswerProbabilities(reading.read(per_variant), raw)

    def _fitted(
        self, base: Snapshot, asked: Mapping[str, QuestionReadouts], fits: FitsFound, state_mean: Vector | None
    ) -> dict[str, list[float]]:
        if not fits.by_id:
            return {}
        # a question-set fit reads every question's evidence, other fits their own; a state probe's
        # question was not read out (FitsFound.state_only)
        reads_all = any(record.fit.reads_every_question for record in fits.by_id.values())
        state_only = fits.state_only
        wanted = {qid: q for qid, q in asked.items() if reads_all or (qid in fits.by_id and qid not in state_only)}
        evidence = self.evidence(base, wanted, state_mean)
        ratios = {question_key(wanted[qid].question): ratio_of(e) for qid, e in evidence.items()}
        found = {
            qid: record.fit.apply(
                evidence[qid].labels, evidence[qid].raw, evidence[qid].prior, evidence[qid].hidden, ratios, state_mean
            )
            for qid, record in fits.by_id.items()
            if qid not in state_only
        }
        for qid in state_only:
            found[qid] = fits.by_id[qid].fit.apply_to_state(label_keys(asked[qid].question), state_mean)
        return found


def _with_set(
    question: Question, probabilities: list[float], raw: list[float] | None, record: FitRecord, coverage: float
) -> AnswerProbabilities:
    """A fitted answer with its set at `coverage`, where the fit kept held-out answers to bound one (a
    label-free fit, or one stored before sets were, has none)."""
    if not record.fit.conformity:
        return AnswerProbabilities(probabilities, raw, record)
    bound = conformal.threshold(record.fit.conformity, coverage)
    labels = conformal.answer_set(probabilities, bound, question.type == "score")
    return AnswerProbabilities(probabilities, raw, record, labels, coverage)
