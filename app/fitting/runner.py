"""Fitting a model's calibration to a user's examples (app/fitting/examples.py reads them): answer them
through the normal path, fit each question with the model's calibration (app/calibration/), store the
adopted fits, and report."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from app.answering.service import ModelService
from app.calibration import (
    FOLDS,
    MIN_LABELLED,
    Calibration,
    Evidence,
    FitChoice,
    FitRecord,
    FitStore,
    SetRow,
    example_of,
    question_key,
    ratio_of,
)
from app.engine.caller import Caller, Signal, working_for
from app.errors import ApiError, Cancelled, InvalidRequest
from app.fitting.examples import ExampleError, UserExample
from app.fitting.journal import EvidenceJournal
from app.fitting.reach import reach
from app.fleet.routing import affinity_key_of
from app.progress import Progress
from app.wire.contract import Question, canonical_json

log = logging.getLogger("onepass.calibrate")

# Below this many labelled examples a question's fit is reported as not to be trusted
# (docs/calibration.md: the held-out curve against the number of examples).
FEW_EXAMPLES = 50
# A question with states but no labels gets batch calibration where it measured better than contextual
# calibration on held-out pipeline data (docs/calibration.md), from this many states on.
LABEL_FREE_TYPES = ("noul", "score")
FEW_STATES = 20


@dataclass(frozen=True)
class QuestionReport:
    key: str
    ids: list[str]  # the ids the examples gave it
    question: dict[str, Any]
    labelled: int
    unlabelled: int
    choice: FitChoice | None  # None: not fitted on labels (none, too few, or an error)
    warning: str | None
    label_free: str | None = None  # the label-free method adopted for a question without labels
    error: str | None = None  # what went wrong fitting it: its fit is not stored, the others are
    name: str = ""  # how the report names it: its ids, and its options where other questions share the ids
    reach: dict[str, Any] | None = None  # where its fit leaves it unsure: what the data suggests (reach.py)

    def to_json(self) -> dict[str, Any]:
        choice = self.choice
        return {
            "key": self.key,
            "name": self.name or ", ".join(self.ids),
            "ids": self.ids,
            "question": self.question,
            "labelled": self.labelled,
            "unlabelled": self.unlabelled,
            "method": choice.method if choice else self.label_free or "contextual",
            "adopted": (bool(choice and choice.adopted) or self.label_free is not None) and self.error is None,
            "folds": choice.folds if choice else None,
            "before": choice.before.to_json() if choice else None,
            "after": choice.after.to_json() if choice else None,
            "candidates": choice.candidates if choice else {},
            "sets": choice.sets if choice and choice.adopted else None,
            "reach": self.reach,
            "warning": self.warning,
            "error": self.error,
        }


@dataclass(frozen=True)
class ExampleEvidence:
    """The evidence of each example, and how it was had."""

    evidence: list[dict[str, Evidence]]  # per example, by question id
    reused: int  # how many examples' evidence came from the journal rather than the model
    seconds: list[float] = field(default_factory=list)  # each example answered now: how long it took


def journal_for(service: ModelService) -> EvidenceJournal | None:
    """Where this model's answered evidence is kept: beside its fits, valid for this build too."""
    store = service.calibration.store
    if store is None:
        return None
    engine = service.engine
    identity = f"{store.identity}\0{engine.build}\0{engine.kv_settings}"
    return EvidenceJournal(store.folder / "evidence", identity)


def answer_all(
    service: ModelService,
    examples: Sequence[UserExample],
    progress: Progress,
    stop: Signal | None = None,
    journal: EvidenceJournal | None = None,
) -> ExampleEvidence:
    """Each example's evidence, through the answering path and its cache, counted in `progress`, as
    background work (app/engine/caller.py): interactive requests are lent the model's contexts first, and
    `stop` ends the run at the next step of any example. With a `journal`, evidence answered before is
    reused, and each newly answered example's is kept there as soon as it is answered, so an interrupted
    run resumes where it stopped."""
    caller = Caller("background", stop)
    kept = [journal.load(e.request, hidden=True) if journal else None for e in examples]
    reused = sum(found is not None for found in kept)
    progress.skip(reused)
    found, seconds = [], []
    for example, known in zip(examples, kept, strict=True):
        if known is not None:
            found.append(known)
            continue
        if caller.stopped:
            raise InterruptedError("the fitting run was cancelled")
        began = time.perf_counter()
        try:
            with working_for(caller):
                evidence = service.evidence(example.request, hidden=True)  # hidden: for the probe candidate
        except Cancelled as error:
            raise InterruptedError("the fitting run was cancelled") from error
        except ValueError as error:  # a decision head's answers: nothing a fit reads
            raise ExampleError(f"{service.name}: {error}") from error
        except (InvalidRequest, ApiError) as error:  # one the server would refuse, say a state too long
            if isinstance(error, ApiError) and error.status >= 500:
                raise
            raise ExampleError(f"{example.where}: {error}") from error
        seconds.append(time.perf_counter() - began)
        if journal is not None:
            try:
                journal.save(example.request, True, evidence)
            except OSError as error:  # a full disk costs the resumability, not the run
                log.warning("could not keep the answered evidence in %s: %s", journal.folder, error)
        found.append(evidence)
        progress.step()
    return ExampleEvidence(found, reused, seconds)


def served_seconds(service: ModelService, examples: Sequence[UserExample], count: int) -> list[float]:
    """How long the first `count` examples with distinct states take as served with the fits stored
    now, each answered as a new state (its snapshot dropped first). Fits change what a new state costs:
    a question a state probe answers is not read out at all."""
    seconds: list[float] = []
    seen: set[str] = set()
    for example in examples:
        if len(seconds) == count:
            break
        state = canonical_json(example.request.state)
        if state in seen:
            continue
        seen.add(state)
        service.forget_state(example.request)
        began = time.perf_counter()
        service.answer(example.request)
        seconds.append(time.perf_counter() - began)
    return seconds


def fit_all(
    examples: Sequence[UserExample],
    evidence: Sequence[dict[str, Evidence]],
    calibration: Calibration,
    question_set: bool,
    stop: threading.Event | None = None,
) -> tuple[list[QuestionReport], list[FitRecord]]:
    """Per question content: the choice among the candidates, and the records of the adopted fits.
    A question whose fitting raises is reported with its error; the others are fitted as ever. Once
    `stop` is set, InterruptedError before the next question: a question's fit (cross-validated
    candidates, seconds each) is the step a run stops between."""
    groups: dict[str, list[tuple[int, str]]] = {}
    for i, example in enumerate(examples):
        for qid, question in example.request.questions.items():
            groups.setdefault(question_key(question), []).append((i, qid))
    reports, records = [], []
    for key, members in groups.items():
        if stop is not None and stop.is_set():
            raise InterruptedError("the fitting run was cancelled")
        try:
            report, record = fit_question(examples, evidence, calibration, question_set, key, members)
        except Exception as error:  # one question's failure never costs the others
            log.exception("fitting question %s failed", key)
            _, shown, ids = asked(examples, members)
            labelled = sum(qid in examples[i].answers for i, qid in members)
            report = QuestionReport(
                key,
                ids,
                shown,
                labelled,
                len(members) - labelled,
                None,
                None,
                error=f"{type(error).__name__}: {error}",
            )
            record = None
        reports.append(report)
        if record is not None:
            records.append(record)
    return _named(reports), records


def _named(reports: list[QuestionReport]) -> list[QuestionReport]:
    """Each report named by its ids; where several questions share ids (a question whose options vary
    from example to example), by its options as well."""
    sharing = Counter(tuple(r.ids) for r in reports)
    named = []
    for r in reports:
        name = ", ".join(r.ids)
        criteria = r.question.get("criteria")
        if sharing[tuple(r.ids)] > 1 and criteria:
            options = list(criteria)
            name += f" [{', '.join(options[:6])}{', ...' if len(options) > 6 else ''}]"
        named.append(replace(r, name=name))
    return named


def asked(
    examples: Sequence[UserExample], members: list[tuple[int, str]]
) -> tuple[Question, dict[str, Any], list[str]]:
    """The question `members` (example, question id) pairs ask: itself, as its report shows it, and its ids."""
    first_i, first_q = members[0]
    question = examples[first_i].request.questions[first_q]
    return question, json.loads(canonical_json(question.model_dump(mode="json"))), sorted({qid for _, qid in members})


def fit_question(
    examples: Sequence[UserExample],
    evidence: Sequence[dict[str, Evidence]],
    calibration: Calibration,
    question_set: bool,
    key: str,
    members: list[tuple[int, str]],
) -> tuple[QuestionReport, FitRecord | None]:
    """One question's report, and the record of its fit if one is adopted. `members`: the (example,
    question id) pairs that ask it."""
    question, shown, ids = asked(examples, members)
    asked_in = {frozenset(map(question_key, examples[i].request.questions.values())) for i, _ in members}
    asked_with = tuple(sorted(next(iter(asked_in)))) if len(asked_in) == 1 else None
    rows = [(i, qid, evidence[i][qid]) for i, qid in members]
    labelled = [(i, e, examples[i].answers[qid]) for i, qid, e in rows if qid in examples[i].answers]
    unlabelled = len(rows) - len(labelled)
    if len(labelled) < MIN_LABELLED:
        record = None
        if question.type in LABEL_FREE_TYPES and len(rows) >= FEW_STATES:
            canonical = sorted(rows[0][2].labels)
            fit = calibration.label_free([example_of(e, None, canonical) for _, _, e in rows])
            record = FitRecord(key, shown, LABEL_FREE, fit, examples=0, states=len(rows), asked_with=asked_with)
        warning = _too_few(len(labelled), record is not None)
        label_free = LABEL_FREE if record is not None else None
        report = QuestionReport(key, ids, shown, len(labelled), unlabelled, None, warning, label_free)
        return report, record
    canonical = sorted(labelled[0][1].labels)
    sets = set_rows(examples, evidence, [i for i, _, _ in labelled]) if question_set else None
    if sets is not None and len({frozenset(row.ratios) for row in sets}) > 1:
        sets = None  # a question-set fit needs every example to ask the same set
    keys = [affinity_key_of(examples[i].request.state_text, examples[i].request.media.images) for i, _, _ in labelled]
    train = [
        example_of(e, right, canonical, None if sets is None else sets[n], keys[n])
        for n, (_, e, right) in enumerate(labelled)
    ]
    sample = [example_of(e, None, canonical) for _, _, e in rows]  # every state, labelled or not
    ordered = question.type == "score"
    drawn = [examples[i].drawn for i, qid, _ in rows if qid in examples[i].answers]
    choice = calibration.choose(train, sample, key, ordered=ordered, drawn=drawn)
    record = None
    if choice.adopted and choice.fit is not None:
        reads = sorted({f[0] for f in choice.fit.features}) if choice.fit.reads_every_question else None
        record = FitRecord(
            key,
            shown,
            choice.method,
            choice.fit,
            examples=len(labelled),
            before=choice.before.to_json(),
            after=choice.after.to_json(),
            sets=choice.sets,
            question_set=None if reads is None else tuple(reads),
            asked_with=asked_with,
        )
    unsure = reach(calibration, choice, train, sample, key, ordered)
    notes = _notes(len(labelled), choice)
    return QuestionReport(key, ids, shown, len(labelled), unlabelled, choice, notes, reach=unsure), record


LABEL_FREE = "batch (label-free)"


def _too_few(labelled: int, label_free: bool) -> str | None:
    if labelled:
        return (
            f"only {labelled} labelled example{'s' if labelled > 1 else ''}: a fit needs at least "
            f"{MIN_LABELLED} to be cross-validated, so "
            + ("label-free batch calibration applies" if label_free else "it keeps contextual calibration")
        )
    if label_free:
        return None
    types = " and ".join(LABEL_FREE_TYPES)
    return f"no labels: label-free calibration applies to {types} questions with at least {FEW_STATES} states"


def _notes(labelled: int, choice: FitChoice) -> str | None:
    notes = []
    if labelled < FEW_EXAMPLES:
        notes.append(f"only {labelled} labelled examples: a fit needs about {FEW_EXAMPLES} to be trusted")
    if choice.folds < FOLDS:
        notes.append(f"cross-validated with {choice.folds} folds, not {FOLDS}, as the examples are few")
    if choice.not_tried:
        notes.append(choice.not_tried)
    return "; ".join(notes) or None


def store_all(
    fits: FitStore, reports: list[QuestionReport], records: list[FitRecord]
) -> tuple[list[FitRecord], list[QuestionReport]]:
    """Store each adopted fit; one that cannot be stored is reported against its question (and the
    others are still stored). Returns the stored records and the reports."""
    stored, failed = [], {}
    for record in records:
        try:
            stored.append(fits.put(record))
        except Exception as error:
            log.exception("storing the fit of question %s failed", record.key)
            failed[record.key] = f"could not store its fit: {type(error).__name__}: {error}"
    return stored, [replace(r, error=failed[r.key]) if r.key in failed else r for r in reports]


def set_rows(
    examples: Sequence[UserExample], evidence: Sequence[dict[str, Evidence]], indices: list[int]
) -> list[SetRow]:
    """Each example's every question's ratios, by question key: what a question-set fit reads."""
    return [
        SetRow({question_key(q): ratio_of(evidence[i][qid]) for qid, q in examples[i].request.questions.items()})
        for i in indices
    ]
