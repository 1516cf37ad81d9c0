"""One loaded model answering: plan the prompts, resolve the prefix, decode, calibrate, render."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from app.answering.answers import answer_of
from app.answering.prompter import Dependence, Plan, Prompter, Suffix, TemplateRefused, TooManyOptions
from app.calibration import AnswerProbabilities, Calibration, Evidence, QuestionReadouts
from app.engine.context import RestoreError
from app.engine.engine import Engine, Readout, SuffixReadouts, SuffixTokens, Timing
from app.engine.snapshot import Prefix, Snapshot
from app.engine.tiers import PrefixCache, ResolvedPrefix
from app.errors import ApiError, InvalidRequest
from app.wire.contract import (
    OTHER_REQUESTS,
    Answer,
    CalibrationUsed,
    Question,
    SystemOneRequest,
    SystemOneResponse,
    TimingMs,
    Usage,
)

log = logging.getLogger("onepass.service")


@dataclass(frozen=True)
class RequestReadouts:
    """A request's plan as the engine read it: each question's readouts, the prefix found, the timing."""

    plan: Plan
    base: Snapshot  # what the suffixes follow, and their priors are measured after
    asked: dict[str, QuestionReadouts]  # question id -> its reading and what the decode read for each variant
    prefix: ResolvedPrefix  # the state's snapshot, and which tier it came from
    suffixes: list[SuffixTokens]
    timing: Timing
    n_decodes: int
    beside: int = 0  # other requests whose questions shared its decode

    @property
    def state_mean(self) -> NDArray[np.float32] | None:
        """The state's mean vector (Snapshot.state_mean), where the prefix's snapshot has it."""
        return self.prefix.snapshot.state_mean


class ModelService:
    """One model ready to answer: engine, prompter, the system prompt's snapshot (the base), the prefix
    caches of its states and of its question sets, its calibration."""

    def __init__(
        self,
        name: str,
        engine: Engine,
        prompter: Prompter,
        states: PrefixCache,
        question_sets: PrefixCache,
        calibration: Calibration,
        dependence: Dependence,
        max_prompt_tokens: int = 0,
    ) -> None:
        """`max_prompt_tokens`: the most prompt tokens one request may have its model read (prompt_tokens;
        0: no such budget)."""
        self.name = name
        self.engine = engine
        self.prompter = prompter
        self.states = states  # system (+ question set) + state
        self.question_sets = question_sets  # the question-first layout's: system + question set
        self.calibration = calibration
        self.dependence = dependence  # what answers depend on besides state and question
        self.max_prompt_tokens = max_prompt_tokens
        log.info("%s: %s", name, self.dependence.describe())
        started = time.perf_counter()
        self.base, _ = engine.prefill(Prefix(prompter.head_tokens))
        spent = (time.perf_counter() - started) * 1000
        log.info("%s: system prompt prefilled (%d tokens, %.0f ms)", name, self.base.n_tokens, spent)

    @property
    def prefilled_tokens(self) -> int:
        """Tokens prefilled so far, states and question sets (for /metrics)."""
        return self.states.prefilled_tokens + self.question_sets.prefilled_tokens

    def close(self) -> None:
        if self.states.disk is not None:
            self.states.disk.close()  # finishes the queued writes first
        self.engine.close()

    def cache_stats(self) -> dict[str, dict[str, Any]]:
        """Each tier's stats: the states' RAM tier, the question sets', the disk tier they share."""
        disk = self.states.disk
        return {
            "state": self.states.ram.stats(),
            "question_set": self.question_sets.ram.stats(),
            "disk": disk.stats() if disk is not None else {"enabled": False},
        }

    def answer(self, request: SystemOneRequest) -> SystemOneResponse:
        """The response. Each step (a wait for a context, a piece of a prefill, a decode) is made for the
        current caller (app/engine/caller.py), and none starts once nobody waits for the answer: Cancelled."""
        started = time.perf_counter()
        plan = self.plan(request)
        fits = self.calibration.fits_for(request.questions, same_set=plan.question_set is not None)
        decoded = self.decode(
            plan,
            hidden=fits.reads_hidden,
            state_mean=fits.reads_state_mean,
            state_only=fits.state_only,
            beside_others=True,
        )
        decoded_at = time.perf_counter()
        # a question seen for the first time has its content-free prior measured here
        calibrated = self.calibration.calibrate(
            decoded.base, decoded.asked, fits, decoded.state_mean, request.x_coverage
        )
        return self.render(decoded, calibrated, started, decoded_at)

    def forget_state(self, request: SystemOneRequest) -> None:
        """Drop the request's state snapshot from both tiers, so that it is answered next as a new state
        (what `onepass calibrate` measures a new state's cost by)."""
        self.states.forget(self.states.key(*self.plan(request).key))

    def evidence(self, request: SystemOneRequest, *, hidden: bool = False) -> dict[str, Evidence]:
        """What fitting reads of each question, through the same path as `answer` (and its cache); with
        `hidden` the vectors the probe fits read too (the question's hidden vector, the state's mean)."""
        decoded = self.decode(self.plan(request), hidden=hidden, state_mean=hidden)
        return self.calibration.evidence(decoded.base, decoded.asked, decoded.state_mean)

    def plan(self, request: SystemOneRequest) -> Plan:
        """Render and tokenize everything, and check it fits the context and the budget of prompt tokens,
        before any inference: a 422 where the context cannot hold it (a state too long for it is refused
        before it is tokenized), a 413 over the budget."""
        try:
            plan = self.prompter.plan(request)
        except TooManyOptions as error:
            loc = ("questions", error.qid, request.questions[error.qid].type, error.field)
            raise InvalidRequest.at(loc, f"{self.name} {error}", "too_long", error.count) from error
        except TemplateRefused as error:  # a state too long for the context too; at no place: at the images
            where = error.loc or (request.media.fields[0],)
            raise InvalidRequest.at(where, str(error), error.kind, None) from error
        longest = max(len(suffix.tokens) for suffix in plan.suffixes())
        n_prefix = len(plan.prefix.tokens)
        if n_prefix + longest > self.engine.n_ctx:
            if not n_prefix:  # a model without memory: each prompt is read whole, in one piece
                message = f"the longest prompt has {longest} tokens, but the model context holds {self.engine.n_ctx}"
            else:
                message = (
                    f"the prompt needs {n_prefix} prefix tokens (system {self.base.n_tokens} + state "
                    f"{n_prefix - self.base.n_tokens}) plus {longest} for the longest question, but the "
                    f"model context holds {self.engine.n_ctx}"
                )
            raise InvalidRequest.at(("state",), message, "too_long", n_prefix + longest)
        needed = prompt_tokens(plan)
        if self.max_prompt_tokens and needed > self.max_prompt_tokens:
            message = (
                f"the request has {self.name} read {needed} prompt tokens (its prefix and each distinct question "
                f"suffix), over the budget of {self.max_prompt_tokens} (max_prompt_tokens): give a shorter state, "
                "fewer questions or fewer options, or split the request"
            )
            raise ApiError(413, "request_too_large", message)
        return plan

    def decode(
        self,
        plan: Plan,
        *,
        hidden: bool = False,
        state_mean: bool = False,
        state_only: frozenset[str] = frozenset(),
        beside_others: bool = False,
    ) -> RequestReadouts:
        """Resolve the prefix through the caches and decode every question's suffixes in one batch (with
        `hidden`, reading each one's hidden vector too; with `state_mean`, a prefix snapshot that has
        its state's mean vector where the engine reads one), but for the questions in `state_only`, whose
        answers read the state's mean alone: they get no readout. A model without memory reads each
        prompt whole."""
        if self.engine.memoryless:
            return self._encode(plan)
        built = Timing()
        base = self._base_for(plan, built)
        key = self.states.key(*plan.key)
        # A decision template's state can merge with the end of its head: then prefill from the start.
        start = base if plan.prefix.tokens[: base.n_tokens] == base.tokens else None
        prefix = self.states.resolve(key, plan.prefix, start, built, state_mean)
        suffixes = distinct_suffixes(v for qid, _, r in plan.questions if qid not in state_only for v in r.variants)
        try:
            answered = self._decode_suffixes(prefix.snapshot, suffixes, hidden, beside_others)
        except RestoreError as error:
            log.warning("%s: dropping a snapshot that failed to restore (%s); prefilling again", self.name, error)
            self.states.drop(key)
            prefix = self.states.resolve(key, plan.prefix, start, built, state_mean)
            answered = self._decode_suffixes(prefix.snapshot, suffixes, hidden, beside_others)
        asked = question_readouts(plan, suffixes, answered.readouts, state_only)
        timing = Timing(
            prefill_ms=built.prefill_ms,
            restore_ms=built.restore_ms + answered.timing.restore_ms,
            decode_ms=answered.timing.decode_ms,
        )
        return RequestReadouts(plan, base, asked, prefix, suffixes, timing, answered.n_decodes, answered.beside)

    def render(
        self, decoded: RequestReadouts, calibrated: dict[str, AnswerProbabilities], started: float, decoded_at: float
    ) -> SystemOneResponse:
        """The contract's response, with its usage and timings."""
        answers = {qid: _answer(asked, calibrated[qid]) for qid, asked in decoded.asked.items()}
        set_fit = any(found.fit is not None and found.fit.fit.reads_every_question for found in calibrated.values())
        finished = time.perf_counter()
        plan, timing = decoded.plan, decoded.timing
        log.info(
            "%s: cache %s, %d prefix tokens, %d questions in %d decode(s), %.0f ms",
            self.name,
            decoded.prefix.source,
            len(plan.prefix.tokens),
            len(plan.questions),
            decoded.n_decodes,
            (finished - started) * 1000,
        )
        return SystemOneResponse(
            model=self.name,
            answers=answers,
            usage=Usage(
                input_tokens=len(plan.prefix.tokens) + sum(len(suffix.tokens) for suffix in decoded.suffixes),
                output_tokens=len(plan.questions),
            ),
            x_cache=decoded.prefix.source,
            x_layout="question-first" if plan.question_set is not None else "state-first",
            x_depends_on=[
                *self.dependence.of([q for _, q, _ in plan.questions], question_set_fit=set_fit),
                *([OTHER_REQUESTS] if decoded.beside else []),
            ],
            x_timing_ms=TimingMs(
                prefill=round(timing.prefill_ms, 3),
                restore=round(timing.restore_ms, 3),
                decode=round(timing.decode_ms, 3),
                calibrate=round((finished - decoded_at) * 1000, 3),
                total=round((finished - started) * 1000, 3),
            ),
        )

    def _decode_suffixes(
        self, prefix: Snapshot, suffixes: list[SuffixTokens], hidden: bool, beside_others: bool
    ) -> SuffixReadouts:
        """The engine's readouts of `suffixes` after `prefix`; none to read (every answer reads the state
        alone) restores nothing."""
        if not suffixes:
            return SuffixReadouts([], 0, Timing())
        return self.engine.decode_suffixes(prefix, suffixes, hidden=hidden, beside_others=beside_others)

    def _encode(self, plan: Plan) -> RequestReadouts:
        """Each distinct whole prompt through a model without memory, once, read at every row a
        question asks of it (a joint head's questions share one prompt)."""
        rows: dict[tuple[tuple[int, ...], tuple[int, ...]], set[int]] = {}
        spans = {}
        for suffix in plan.suffixes():
            rows.setdefault((suffix.tokens, suffix.order), set()).update(suffix.marks)
            spans[(suffix.tokens, suffix.order)] = suffix.spans  # a request's prompts hold the same images
        vectors, timing = {}, Timing()
        for (tokens, order), wanted in sorted(rows.items()):
            read = sorted(wanted)
            whole = Prefix(tokens, spans[(tokens, order)], plan.prefix.images)
            encoded = self.engine.encode(whole, read, order)
            vectors[(tokens, order)] = dict(zip(read, encoded.vectors, strict=True))
            timing.decode_ms += encoded.decode_ms
        asked = {}
        for qid, question, reading in plan.questions:
            readouts = [
                Readout([], 0.0, None, tuple(vectors[(v.tokens, v.order)][m] for m in v.marks))
                for v in reading.variants
            ]
            if not all(math.isfinite(x) for r in readouts for x in reading.scores(r)):
                # a joint head gives NaN where it could not use the prompt's decision order
                raise ApiError(500, "internal_error", f"{self.name} could not evaluate question {qid!r}: NaN scores")
            asked[qid] = QuestionReadouts(question, reading, readouts)
        prefix = ResolvedPrefix(self.base, "off")
        return RequestReadouts(
            plan, self.base, asked, prefix, [SuffixTokens(t, (), ()) for t, _ in rows], timing, len(rows)
        )

    def _base_for(self, plan: Plan, built: Timing) -> Snapshot:
        """What the state's prefix starts from: the base, or in the question-first layout the question
        set's snapshot on it (the prefix cache is a small tree)."""
        if plan.question_set is None:
            return self.base
        tokens = (*self.base.tokens, *plan.question_set.tokens)
        key = self.question_sets.key(*plan.question_set.key)
        return self.question_sets.resolve(key, Prefix(tokens), self.base, built).snapshot


def _answer(asked: QuestionReadouts, found: AnswerProbabilities) -> Answer:
    return answer_from(asked.question, found, asked.mass())


def answer_from(question: Question, found: AnswerProbabilities, mass: float | None = None) -> Answer:
    """One question's answer on the wire from its probabilities, with the fit that calibrated it and the
    fit's answer set, if any; `mass`: its label mass, where a readout was read."""
    fit = found.fit
    used = None if fit is None else CalibrationUsed(id=fit.id, method=fit.method, examples=fit.examples)
    shown = None if found.answer_set is None or found.coverage is None else (found.answer_set, found.coverage)
    return answer_of(question, found.probabilities, mass, found.raw, used, shown)


def question_readouts(
    plan: Plan, suffixes: list[SuffixTokens], readouts: list[Readout], state_only: frozenset[str]
) -> dict[str, QuestionReadouts]:
    """Each question of `plan`, in the request's order, with its variants' readouts among the decoded
    suffixes' (none for a question in `state_only`)."""
    readout_of = {(suffix.tokens, suffix.labels, suffix.marks): r for suffix, r in zip(suffixes, readouts, strict=True)}
    return {
        qid: QuestionReadouts(
            question,
            reading,
            [] if qid in state_only else [readout_of[(v.tokens, v.label_ids, v.marks)] for v in reading.variants],
        )
        for qid, question, reading in plan.questions
    }


def prompt_tokens(plan: Plan) -> int:
    """The tokens a model reads for `plan` where nothing is cached (usage.input_tokens, but for the
    suffixes of questions a fit answers from the state alone): its prefix and each distinct suffix once."""
    return len(plan.prefix.tokens) + sum(len(suffix.tokens) for suffix in distinct_suffixes(plan.suffixes()))


def distinct_suffixes(suffixes: Iterable[Suffix]) -> list[SuffixTokens]:
    """What the decode reads: each distinct suffix once, in a canonical order (by its tokens), so neither
    the order questions arrive in nor a repeated question changes the batch layout and with it
    the floating-point rounding."""
    distinct = sorted({(s.tokens, s.label_ids, s.marks) for s in suffixes})
    return [SuffixTokens(tokens, labels, marks) for tokens, labels, marks in distinct]
