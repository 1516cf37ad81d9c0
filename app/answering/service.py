"""answer(request) -> response for one loaded model: plan -> cache -> engine -> scoring."""

from __future__ import annotations

import logging
import math
import threading
import time
from array import array
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

from app.answering import fitting, scoring
from app.answering.calibration import CONTENT_FREE_STATES, ContextualCalibrator
from app.answering.decision import DecisionPrompter
from app.answering.fits import FitStore, question_key
from app.answering.prompting import (
    Prompter,
    QuestionSet,
    Reading,
    RenderedQuestion,
    TemplateRefused,
    TooManyOptions,
    label_keys,
)
from app.contract import (
    Answer,
    CalibrationUsed,
    ChoiceAnswer,
    ChoiceQuestion,
    NoulAnswer,
    NoulQuestion,
    Question,
    ScoreAnswer,
    SystemOneRequest,
    SystemOneResponse,
    TimingMs,
    Usage,
    render_state,
)
from app.engine.disk_cache import DiskTier
from app.engine.llama import Engine, Job, Readout, RestoreError, Timing
from app.engine.ram_cache import CacheKey, SnapshotCache, cache_key
from app.engine.snapshot import Snapshot
from app.engine.tiers import PrefixTiers
from app.errors import Cancelled, InvalidRequest

log = logging.getLogger("onepass.service")

QUESTION_SETS = 8  # question-first layout: question sets kept (a pipeline asks one set many times)


@dataclass(frozen=True)
class Plan:
    state: str
    question_set: QuestionSet | None  # the question-first layout's middle tier (None: state-first)
    prefix_tokens: tuple[int, ...]  # everything before the suffixes: what the state tier snapshots
    questions: list[tuple[str, Question, Reading]]

    def suffixes(self) -> list[RenderedQuestion]:
        return [variant for _, _, reading in self.questions for variant in reading.variants]


@dataclass(frozen=True)
class Evidence:
    """One question's readout as calibration sees it, in the answer's label order."""

    labels: list[str]  # "true"/"false", the option names, or the level indices
    raw: list[float]  # the model's probabilities over the labels
    prior: list[float]  # the same question's about content-free states (contextual calibration)
    # the last hidden state at its decision position, when asked (float32: thousands of them fit in memory)
    hidden: NDArray[np.float32] | None = field(default=None, compare=False)


@dataclass(frozen=True)
class _Fitted:
    probabilities: list[float]
    used: CalibrationUsed


@dataclass(frozen=True)
class _Decoded:
    plan: Plan
    base: Snapshot  # what the question suffixes follow (and their priors are measured after)
    jobs: list[Job]
    readouts: list[list[Readout]]  # in plan.questions order, one per variant
    cache_state: Literal["hit", "disk", "miss", "off"]
    timing: Timing
    n_decodes: int


class ModelService:
    """One model ready to answer: engine, prompter, the system-prompt base snapshot, its cache."""

    def __init__(
        self,
        name: str,
        engine: Engine,
        prompter: Prompter | DecisionPrompter,
        cache: SnapshotCache,
        key_fn: Callable[..., CacheKey] = cache_key,
        calibration: str = "none",
        calibration_temperature: float = 1.0,
        question_sets: SnapshotCache | None = None,
        disk: DiskTier | None = None,
        fits: FitStore | None = None,
    ) -> None:
        """`fits`: calibrations fitted to the user's examples, applied to the questions they match."""
        self.name = name
        self.engine = engine
        self.prompter = prompter
        self.cache = cache  # the state tier: system (+ questions) + state
        # The question-first layout's middle tier: system + question block, one per question set.
        self.question_sets = question_sets or SnapshotCache(QUESTION_SETS, cache.max_tokens)
        self.disk = disk  # the state tier's second level: snapshots that outlive the process
        self._key_fn = key_fn  # a test hook: a constant key forces hash collisions
        self.calibration = calibration
        self.calibration_temperature = calibration_temperature
        self.fits = fits
        self.tiers = PrefixTiers(engine, self.cache, disk)  # the state tier, in RAM then on disk
        self.set_tiers = PrefixTiers(engine, self.question_sets, disk)
        started = time.perf_counter()
        self.base, _ = engine.prefill(prompter.head_tokens)
        self.calibrator = ContextualCalibrator(
            [prompter.state_tokens(state) for state in CONTENT_FREE_STATES],
            lambda base, jobs: self.engine.decode_suffixes(base, jobs).readouts,
            calibration_temperature,
            _DiskPriors(disk, engine) if disk is not None else None,
        )
        log.info(
            "%s: system prompt prefilled (%d tokens, %.0f ms)",
            name,
            self.base.n_tokens,
            (time.perf_counter() - started) * 1000,
        )

    @property
    def prefilled_tokens(self) -> int:
        """Tokens prefilled so far, states and question sets (for /metrics)."""
        return self.tiers.prefilled_tokens + self.set_tiers.prefilled_tokens

    def close(self) -> None:
        if self.disk is not None:
            self.disk.close()  # finishes the queued writes first
        self.engine.close()

    def cache_stats(self) -> dict[str, dict[str, Any]]:
        """Each cache tier's stats: the state tier in RAM, the question sets, the state tier on disk."""
        return {
            "state": self.cache.stats(),
            "question_set": self.question_sets.stats(),
            "disk": self.disk.stats() if self.disk is not None else {"enabled": False},
        }

    def _render(
        self, question: Question, reading: Reading, readouts: list[Readout], base: Snapshot, fit: _Fitted | None
    ) -> Answer:
        raw = raw_probabilities(reading, readouts)
        mass = math.fsum(r.label_mass for r in readouts) / len(readouts)
        if fit is not None:
            return render_answer(question, fit.probabilities, mass, raw, fit.used)
        if reading.temperature is None:  # onepass's own prompt: the service's calibration
            if self.calibration == "none":
                return render_answer(question, raw, mass)
            (rendered,) = reading.variants
            calibrated = self.calibrator.calibrate(base, rendered.tokens, rendered.label_ids, raw)
            return render_answer(question, calibrated, mass, raw)
        # A decision model: each variant at the file's temperature (contextual: its prior divided
        # out first), then the format's reading of the variants.
        temperature = reading.temperature
        if self.calibration == "none":
            per_variant = [scoring.softmax([x / temperature for x in r.label_logits]) for r in readouts]
        else:
            per_variant = [
                self.calibrator.calibrate(
                    base, v.tokens, v.label_ids, scoring.softmax(r.label_logits), temperature=temperature
                )
                for v, r in zip(reading.variants, readouts, strict=True)
            ]
        return render_answer(question, reading.read(per_variant), mass, raw)

    def _fit_records(self, keys: dict[str, str]) -> dict[str, dict[str, Any]]:
        """The user's fits that answer this request's questions (app/answering/fits.py), by question id;
        `keys`: each question's content key. A question-set fit applies only when the request asks its
        whole set."""
        if self.fits is None:
            return {}
        set_fits = {record["key"]: record for record in self.fits.for_set(set(keys.values()))}
        records = {qid: set_fits.get(key) or self.fits.single(key) for qid, key in keys.items()}
        return {qid: record for qid, record in records.items() if record is not None}

    def _fits_for(
        self, decoded: _Decoded, keys: dict[str, str], records: dict[str, dict[str, Any]]
    ) -> dict[str, _Fitted]:
        """Each fitted question's probabilities under its fit (`records`, from _fit_records), by question id."""
        if not records:
            return {}
        # a question-set fit reads every question's readout, other fits their own
        reads_all = any(record["parsed"].method == "question_set" for record in records.values())
        evidence = self._evidence_of(decoded, set(keys) if reads_all else set(records))
        readouts = {keys[qid]: fitting.readout_ratios(e.labels, e.raw, e.prior) for qid, e in evidence.items()}
        found: dict[str, _Fitted] = {}
        for qid, record in records.items():
            e = evidence[qid]
            probabilities = fitting.apply_fit(record["parsed"], e.labels, e.raw, e.prior, readouts, e.hidden)
            used = CalibrationUsed(id=record["id"], method=record["method"], examples=record["examples"])
            found[qid] = _Fitted(probabilities, used)
        return found

    def _evidence_of(self, decoded: _Decoded, wanted: set[str]) -> dict[str, Evidence]:
        """The `wanted` questions' raw label probabilities and content-free priors, in label order."""
        found = {}
        for (qid, question, reading), readouts in zip(decoded.plan.questions, decoded.readouts, strict=True):
            if qid in wanted:
                prior = reading.read(
                    [self.calibrator.prior(decoded.base, v.tokens, v.label_ids) for v in reading.variants]
                )
                found[qid] = Evidence(
                    label_keys(question), raw_probabilities(reading, readouts), prior, hidden_state(readouts)
                )
        return found

    def prefix_key(self, state: str, question_set: QuestionSet | None = None, prefix: tuple[int, ...] = ()) -> CacheKey:
        """The state tier's key: everything that shapes the prefix snapshot's bytes."""
        parts = self.prompter.prefix_parts(state, question_set, prefix)
        return self._key_fn(self.engine.fingerprint, self.engine.kv_settings, *parts)

    def question_set_key(self, question_set: QuestionSet) -> CacheKey:
        assert isinstance(self.prompter, Prompter)  # only onepass's own prompt has a question-first layout
        fmt, engine = self.prompter.format, self.engine
        return self._key_fn(engine.fingerprint, engine.kv_settings, fmt.head_before_lead, question_set.text)

    def plan(self, request: SystemOneRequest) -> Plan:
        """Render and tokenize everything, and check it fits, before any inference."""
        state = render_state(request.state)
        try:
            question_set, prefix, questions = self.prompter.plan(request.state, request.questions)
        except TooManyOptions as error:
            question = request.questions[error.qid]
            raise InvalidRequest.at(
                ("questions", error.qid, question.type, error.field), f"{self.name} {error}", "too_long", error.count
            ) from error
        except TemplateRefused as error:
            raise InvalidRequest.at(error.loc, str(error), "value_error", None) from error
        longest = max(len(rendered.tokens) for _, _, reading in questions for rendered in reading.variants)
        if len(prefix) + longest > self.engine.n_ctx:
            raise InvalidRequest.at(
                ("state",),
                f"the prompt needs {len(prefix)} prefix tokens (system {self.base.n_tokens} + state "
                f"{len(prefix) - self.base.n_tokens}) plus {longest} for the longest question, but the "
                f"model context holds {self.engine.n_ctx}",
                "too_long",
                len(prefix) + longest,
            )
        return Plan(state, question_set, prefix, questions)

    def answer(self, request: SystemOneRequest, cancelled: threading.Event | None = None) -> SystemOneResponse:
        """The response. `cancelled` (a timeout, a client gone) stops it before the next llama.cpp step."""
        started = time.perf_counter()
        plan = self.plan(request)
        keys = {qid: question_key(question) for qid, question, _ in plan.questions} if self.fits is not None else {}
        records = self._fit_records(keys)
        # A probe fit reads its question's hidden state, which only a decode that asks for it gives.
        probing = any(record["parsed"].method == "probe" for record in records.values())
        decoded = self._decode(plan, cancelled, hidden=probing)
        scored = time.perf_counter()
        fits = self._fits_for(decoded, keys, records)
        answers = {  # a question seen for the first time has its calibration prior measured here
            qid: self._render(question, reading, readouts, decoded.base, fits.get(qid))
            for (qid, question, reading), readouts in zip(decoded.plan.questions, decoded.readouts, strict=True)
        }
        calibrate_ms = (time.perf_counter() - scored) * 1000
        total_ms = (time.perf_counter() - started) * 1000
        plan, jobs = decoded.plan, decoded.jobs
        log.info(
            "%s: cache %s, %d prefix tokens, %d questions in %d decode(s), %.0f ms",
            self.name,
            decoded.cache_state,
            len(plan.prefix_tokens),
            len(plan.questions),
            decoded.n_decodes,
            total_ms,
        )
        return SystemOneResponse(
            model=self.name,
            answers=answers,
            usage=Usage(
                input_tokens=len(plan.prefix_tokens) + sum(len(job.tokens) for job in jobs),
                output_tokens=len(plan.questions),
            ),
            x_cache=decoded.cache_state,
            x_timing_ms=TimingMs(
                prefill=round(decoded.timing.prefill_ms, 3),
                restore=round(decoded.timing.restore_ms, 3),
                decode=round(decoded.timing.decode_ms, 3),
                calibrate=round(calibrate_ms, 3),
                total=round(total_ms, 3),
            ),
        )

    def evidence(self, request: SystemOneRequest, *, hidden: bool = False) -> dict[str, Evidence]:
        """What calibration reads for each question, through the same path as `answer` (and its
        cache): the raw label probabilities and the content-free prior, in the answer's label order,
        and with `hidden` the hidden state a probe fit reads."""
        decoded = self._decode(self.plan(request), None, hidden=hidden)
        return self._evidence_of(decoded, set(request.questions))

    def _decode(self, plan: Plan, cancelled: threading.Event | None, *, hidden: bool = False) -> _Decoded:
        """Resolve the prefix through the cache tiers and decode every question once (with `hidden`,
        reading each one's hidden state too)."""
        check = cancelled.is_set if cancelled is not None else (lambda: False)
        built = Timing()
        # The prefix cache is a small tree: the base (system prompt), in the question-first layout
        # the question set on it, then the state on that.
        base = self.base
        if plan.question_set is not None:
            set_tokens = (*self.base.tokens, *plan.question_set.tokens)
            set_key = self.question_set_key(plan.question_set)
            base = self.set_tiers.resolve(set_key, set_tokens, self.base, built, check).snapshot
        key = self.prefix_key(plan.state, plan.question_set, plan.prefix_tokens)
        # A decision template's state can merge with the end of its head: then prefill from the start.
        start = base if plan.prefix_tokens[: base.n_tokens] == base.tokens else None
        resolved = self.tiers.resolve(key, plan.prefix_tokens, start, built, check)
        jobs = batch_jobs(plan.suffixes())
        if check():
            raise Cancelled("cancelled before the decode")
        try:
            answered = self.engine.decode_suffixes(resolved.snapshot, jobs, hidden=hidden)
        except RestoreError as error:
            log.warning("%s: dropping a snapshot that failed to restore (%s); prefilling again", self.name, error)
            self.tiers.drop(key)
            resolved = self.tiers.resolve(key, plan.prefix_tokens, start, built, check)
            answered = self.engine.decode_suffixes(resolved.snapshot, jobs, hidden=hidden)
        readout_of = {(job.tokens, job.labels): r for job, r in zip(jobs, answered.readouts, strict=True)}
        readouts = [[readout_of[(v.tokens, v.label_ids)] for v in reading.variants] for _, _, reading in plan.questions]
        timing = Timing(
            prefill_ms=built.prefill_ms,
            restore_ms=built.restore_ms + answered.timing.restore_ms,
            decode_ms=answered.timing.decode_ms,
        )
        return _Decoded(plan, base, jobs, readouts, resolved.source, timing, answered.n_decodes)


def raw_probabilities(reading: Reading, readouts: list[Readout]) -> list[float]:
    """A question's answer before any calibration or temperature: each variant's label softmax, read
    as the format reads its variants."""
    return reading.read([scoring.softmax(r.label_logits) for r in readouts])


def hidden_state(readouts: list[Readout]) -> NDArray[np.float32] | None:
    """A question's hidden state as a probe fit reads it: its variants' mean (None: not decoded for it)."""
    states = [r.hidden for r in readouts]
    if any(state is None for state in states):
        return None
    if len(states) == 1:
        return states[0]
    mean: NDArray[np.float32] = np.mean(np.asarray(states, dtype=np.float64), axis=0).astype(np.float32)
    return mean


def batch_jobs(questions: Iterable[RenderedQuestion]) -> list[Job]:
    """The decode's jobs: each distinct suffix once, in a canonical order (by its tokens), so neither
    the order questions arrive in nor a repeated question changes the batch layout and with it
    the floating-point rounding."""
    return [Job(tokens, labels) for tokens, labels in sorted({(q.tokens, q.label_ids) for q in questions})]


class _DiskPriors:
    """Calibration priors kept by the disk tier beside the snapshots: a few hundred bytes each,
    verified like them (build, model, KV settings, the tokens they were measured on)."""

    def __init__(self, disk: DiskTier, engine: Engine) -> None:
        self._disk = disk
        self._prefix = (b"calibration prior", engine.fingerprint, engine.kv_settings, "|".join(CONTENT_FREE_STATES))

    def _key(self, tokens: tuple[int, ...]) -> CacheKey:
        return cache_key(*self._prefix, array("I", tokens).tobytes())

    def load(self, tokens: tuple[int, ...]) -> bytes | None:
        found = self._disk.load(self._key(tokens), tokens)
        return found.data if found is not None else None

    def save(self, tokens: tuple[int, ...], data: bytes) -> None:
        self._disk.save(self._key(tokens), Snapshot(data, tokens))


def render_answer(
    question: Question,
    probabilities: list[float],
    mass: float,
    raw: list[float] | None = None,
    fit: CalibrationUsed | None = None,
) -> Answer:
    """The contract's answer for one question; `raw` (uncalibrated) is reported as x_raw when given,
    `fit` (the user's fit that calibrated it) as x_calibration."""
    if isinstance(question, NoulQuestion):
        return NoulAnswer(
            noul=probabilities[0], x_label_mass=mass, x_raw=raw[0] if raw is not None else None, x_calibration=fit
        )
    if isinstance(question, ChoiceQuestion):
        by_name = dict(zip(question.criteria, probabilities, strict=True))
        # Ties go to the first name in sorted order, so option order never changes the choice.
        best = max(sorted(by_name), key=by_name.__getitem__)
        return ChoiceAnswer(
            choice=best,
            confidence=scoring.choice_confidence(probabilities),
            probabilities=by_name,
            x_label_mass=mass,
            x_raw=dict(zip(question.criteria, raw, strict=True)) if raw is not None else None,
            x_calibration=fit,
        )
    return ScoreAnswer(
        score=scoring.expected_score(probabilities),
        confidence=scoring.score_confidence(probabilities),
        legend={str(i): level for i, level in enumerate(question.criteria)},
        probabilities={str(i): p for i, p in enumerate(probabilities)},
        x_label_mass=mass,
        x_raw={str(i): p for i, p in enumerate(raw)} if raw is not None else None,
        x_calibration=fit,
    )
