"""A labelling session (`onepass label S.jsonl`): the states answered once, ranked by what a label would
teach the fits, labelled by the user into a verified file (app/labelling/labels.py), and refitted in the
background as labels arrive.

Answering every state is a job in the server's one JobRegistry of calibration jobs, through
`answer_all` with the evidence journal on (a restart reuses what was answered). Each state's evidence is
then kept, and after each refit the answers and the ranking are computed again from it, with the fits
the model's FitStore holds now: no model call. A refit is a calibration job too (fit_all on every
labelled state's evidence, stored in the model's FitStore, which the served answers read); labels that
arrive while one runs start one more after it, never a queue.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from app.calibration import MIN_LABELLED, AnswerProbabilities, Calibration, Evidence, FitRecord, question_key
from app.errors import InvalidRequest
from app.fitting.examples import (
    DRAWN_KEY,
    ExampleError,
    UserExample,
    json_lines,
    parse_examples,
    right_index,
)
from app.fitting.jobs import FitWork, Lease
from app.fitting.runner import QuestionReport, answer_all, journal_for
from app.jobs import BackgroundJob, JobRegistry
from app.labelling.labels import LabelsFile
from app.labelling.ranking import directions
from app.labelling.step import CONTENT_KEYS, answered, content, drawn_states, picked, refit

log = logging.getLogger("onepass.label")
# What a label did to the refits: started one, or it is owed one (after the refit running now, once the
# states are answered), or none will run (the server is stopping).
REFIT_STARTED, REFIT_PENDING, REFIT_AFTER_ANSWERING, REFIT_CLOSED = (
    "started",
    "after the one running",
    "once the states are answered",
    "none: the server is stopping",
)


@dataclass(frozen=True)
class StatesFile:
    """The states to label, by their line in the file (from 1): as written, and parsed."""

    path: Path
    items: dict[int, dict[str, Any]]
    examples: dict[int, UserExample]  # their answers: those the file gives (such a state counts as labelled)


def read_states(path: Path, model: str = "jev-latest") -> StatesFile:
    """The states file, read as `onepass calibrate` reads an examples file; ExampleError names the first
    line that is not JSON, else the first that is not an example."""
    items = json_lines(path.read_text(encoding="utf-8"), f"{path}: ")
    if not items:
        raise ExampleError(f"{path}: no states")
    examples = parse_examples(items.values(), model, where=[f"{path}: line {n}" for n in items])
    return StatesFile(path, items, dict(zip(items, examples, strict=True)))


@dataclass(frozen=True)
class LabellingFiles:
    """What `onepass label` hands the server: the states, and their labels file."""

    states: StatesFile
    labels: LabelsFile


@dataclass
class _Answering(FitWork):
    """Every state answered once (the journal keeps each as it is answered); fits nothing."""

    session: LabellingSession | None = None

    def run(self) -> str:
        assert self.session is not None
        with self.lease() as service:
            journal = journal_for(service)
            if journal is None:
                raise RuntimeError(f"{self.model} keeps no fits (no calibration_dir): nothing to label for")
            answered = answer_all(service, self.examples, self.progress, self.cancel, journal)
            self.reused = answered.reused
            same_set = service.plan(self.examples[0].request).question_set is not None
        self.session.answered(answered.evidence, same_set)
        return "done"

    def summary(self) -> str:
        return f"{self.model}: {len(self.examples)} states answered for labelling ({self.reused} reused)"


@dataclass
class _Refit(FitWork):
    """A refit on the labelled states' kept evidence; when it ends, the session answers again from the
    evidence, and starts one more refit if labels came meanwhile."""

    session: LabellingSession | None = None

    def fit(
        self, calibration: Calibration, evidence: list[dict[str, Evidence]]
    ) -> tuple[list[FitRecord], list[QuestionReport]]:
        return refit(calibration, self.examples, evidence, self.cancel)  # the labelling loop's step

    def run(self) -> str:
        assert self.session is not None
        try:
            status = super().run()
            self.session.refitted()
            return status
        finally:
            self.session.refit_ended()


class LabellingSession:
    """One states file's labelling, on one served model."""

    def __init__(
        self, states: StatesFile, labels: LabelsFile, model: str, lease: Lease, jobs: JobRegistry[FitWork]
    ) -> None:
        self.states, self.labels, self.model, self.lease, self.jobs = states, labels, model, lease, jobs
        self.order = sorted(states.items)  # line numbers
        # Each state's content, images included, is serialized here once: the states never change, and
        # the labels stored later are made from them.
        contents = {n: content(states.items[n]) for n in self.order}
        # the states offered at random (step.drawn_states), as indices into `order` and as lines
        self.drawn = drawn_states([contents[n] for n in self.order])
        self.drawn_lines = {self.order[i] for i in self.drawn}
        self._question_keys = {
            n: {qid: question_key(q) for qid, q in states.examples[n].request.questions.items()} for n in self.order
        }
        self._lock = threading.Lock()
        # labelled() is kept up to date as labels are stored, not read again from the labels file on each
        # call (the page polls it); _storing keeps the file and it in step when one state's labels race.
        self._storing, self._labelled_lock = threading.Lock(), threading.Lock()
        self._labelled, unmatched = self._read_labels(contents)
        # Answering the states again (refitted) may run twice at once; each run takes a number as it
        # begins, and the answers of the latest to begin are never replaced by an earlier one's.
        self._runs = self._answers_run = 0
        self._evidence: dict[int, dict[str, Evidence]] | None = None
        self._directions: NDArray[np.float32] | None = None  # the states' (ranking.directions), once answered
        self._answers: dict[int, dict[str, AnswerProbabilities]] = {}
        self._same_set = False
        self._refitting = self._pending = self._closed = False
        self.answering: BackgroundJob[FitWork] | None = None
        self.refit: BackgroundJob[FitWork] | None = None
        self.coverage = 0.9  # the answer sets' coverage: the model's default, read once the states are answered
        self.warnings = list(labels.warnings) + unmatched

    def _read_labels(self, contents: Mapping[int, str]) -> tuple[dict[int, UserExample], list[str]]:
        """Every labelled state, with its answers: the labels file's where it has a sound line, else the
        states file's own answers; and what is wrong with the labels file's other lines."""
        found = {n: e for n, e in self.states.examples.items() if e.answers}
        unmatched = []
        for n, line in self.labels.lines().items():
            if n not in contents or content(line) != contents[n]:
                unmatched.append(f"{self.labels.path}: the label of state {n} is not of line {n} of {self.states.path}")
                continue
            try:
                indices = self._indices(n, line.get("answers"))
            except InvalidRequest as error:
                unmatched.append(f"{self.labels.path}: the label of state {n}: {error}")
                continue
            found[n] = UserExample(self.states.examples[n].request, indices, line.get(DRAWN_KEY) is not False)
        for message in unmatched:
            log.warning("%s (left out)", message)
        return found, unmatched

    def start(self) -> None:
        """Answer every state, as a job."""
        examples = [self.states.examples[n] for n in self.order]
        self.answering = self.jobs.start(_Answering(self.model, self.lease, examples, False, session=self))

    def close(self) -> None:
        with self._lock:
            self._closed = True

    # --- labels -------------------------------------------------------------------------------

    def _indices(self, state: int, answers: Any) -> dict[str, int]:
        """The answers as label indices, checked as `onepass calibrate` checks an example's; a 422 otherwise."""
        questions = self.states.examples[state].request.questions
        if not isinstance(answers, dict):
            raise InvalidRequest.at(("answers",), "an object of answers by question id", "dict_type", answers)
        if not answers:
            raise InvalidRequest.at(("answers",), "at least one question's answer", "missing", answers)
        found = {}
        for qid, value in answers.items():
            if qid not in questions:
                known = ", ".join(sorted(questions))
                raise InvalidRequest.at(("answers", qid), f"no question {qid!r} (its questions: {known})", "key", qid)
            try:
                found[qid] = right_index(questions[qid], value)
            except ValueError as error:
                raise InvalidRequest.at(("answers", qid), str(error), "value_error", value) from None
        return found

    def labelled(self) -> dict[int, UserExample]:
        """Every labelled state, with its answers: the labels file's where it has a sound line, else the
        states file's own answers. Labels stored other than through `label` are not seen."""
        with self._labelled_lock:
            return dict(self._labelled)

    def label(self, state: Any, answers: Any) -> tuple[dict[str, Any], str]:
        """Store the answers for a state (its line in the states file), then refit in the background:
        the line as stored, and what became of the refit (REFIT_STARTED, ...). InvalidRequest (422) for a
        state or answers that are not one; nothing is stored then."""
        if isinstance(state, bool) or not isinstance(state, int) or state not in self.states.items:
            message = f"a state's line in {self.states.path.name}: one of {self.order[0]}..{self.order[-1]}"
            raise InvalidRequest.at(("state",), message, "value_error", state)
        indices = self._indices(state, answers)
        item = self.states.items[state]
        shown = {k: item[k] for k in CONTENT_KEYS if k in item}
        was_drawn = state in self.drawn_lines
        with self._storing:
            line = self.labels.put(state, {**shown, "answers": answers, DRAWN_KEY: was_drawn})
            with self._labelled_lock:
                self._labelled[state] = UserExample(self.states.examples[state].request, indices, was_drawn)
        return line, self._start_refit()

    # --- refits -------------------------------------------------------------------------------

    def _start_refit(self) -> str:
        with self._lock:
            if self._closed:
                return REFIT_CLOSED
            if self._evidence is None:
                return REFIT_AFTER_ANSWERING  # once the states are answered, a refit starts if any are labelled
            if self._refitting:
                self._pending = True
                return REFIT_PENDING
            self._refitting = True
            self._launch()
            return REFIT_STARTED

    def _launch(self) -> None:
        """Start a refit on every label stored now (with the lock held)."""
        assert self._evidence is not None
        labelled = self.labelled()
        examples = [labelled[n] for n in sorted(labelled)]
        evidence = [self._evidence[n] for n in sorted(labelled)]
        work = _Refit(self.model, self.lease, examples, False, evidence=evidence, session=self)
        self.refit = self.jobs.start(work)

    def refit_ended(self) -> None:
        with self._lock:
            if self._pending and not self._closed:
                self._pending = False
                self._launch()
            else:
                self._refitting = self._pending = False

    def answered(self, evidence: list[dict[str, Evidence]], same_set: bool) -> None:
        with self._lock:
            self._evidence = dict(zip(self.order, evidence, strict=True))
            self._directions = directions([next(iter(row.values())).state_mean for row in evidence])
            self._same_set = same_set
        self.refitted()
        if self.labelled():
            self._start_refit()

    def refitted(self) -> None:
        """Answer every state again from its evidence, with the fits stored now. Two runs may overlap
        (the states answered, and a refit that a label started ended): a slower run that began first
        keeps its answers only while no later one has given its own, whose fits are as new or newer."""
        with self._lock:
            evidence, same_set = self._evidence, self._same_set
            self._runs += 1
            run = self._runs
        if evidence is None:
            return
        with self.lease() as service:
            calibration = service.calibration
            answers = {n: self._answer(calibration, n, row, same_set) for n, row in evidence.items()}
        with self._lock:
            if run > self._answers_run:
                self._answers, self.coverage, self._answers_run = answers, calibration.coverage, run

    def _answer(
        self, calibration: Calibration, n: int, row: dict[str, Evidence], same_set: bool
    ) -> dict[str, AnswerProbabilities]:
        return answered(calibration, self.states.examples[n].request.questions, row, same_set)

    # --- what the user sees -------------------------------------------------------------------

    @property
    def refitting(self) -> bool:
        """Whether a refit runs now."""
        with self._lock:
            return self._refitting

    @property
    def refit_pending(self) -> bool:
        """Whether labels came while a refit ran: one more runs after it."""
        with self._lock:
            return self._pending

    @property
    def ready(self) -> bool:
        with self._lock:
            return bool(self._answers)

    def answers(self, state: int) -> dict[str, AnswerProbabilities]:
        with self._lock:
            return self._answers.get(state, {})

    def masses(self, state: int) -> dict[str, float | None]:
        """Each question's share of the next token on its labels, as the state was answered."""
        with self._lock:
            return {qid: e.mass for qid, e in (self._evidence or {}).get(state, {}).items()}

    def ranked(self, count: int, skipped: Collection[int] = ()) -> list[int]:
        """Up to `count` unlabelled states (their lines), the most worth labelling first, leaving out the
        `skipped` lines (those the user passed over): the others keep the order they have when none is
        skipped, so a skip does not reorder the states after it."""
        with self._lock:
            answers, unit = self._answers, self._directions
        if not answers:
            return []
        labelled = set(self.labelled())
        passed = {n for n in skipped if n in self.states.items and n not in labelled}
        done = [i for i, n in enumerate(self.order) if n in labelled]
        chosen = picked([answers[n] for n in self.order], unit, done, count + len(passed), self.drawn)
        found = [self.order[i] for i in chosen]
        return [n for n in found if n not in passed][:count]

    def questions(self, coverage: float, labelled: Mapping[int, UserExample]) -> list[dict[str, Any]]:
        """Per question (by content): how many states ask it and are labelled for it (`labelled`: as
        labelled() gives them), the fit that answers it now (method, cross-validated accuracy, its held-out
        sets at `coverage`), and the mean size of its sets over the unlabelled states now."""
        with self._lock:
            answers = self._answers
        figures: dict[str, dict[str, Any]] = {}
        for n in self.order:
            for qid, question in self.states.examples[n].request.questions.items():
                key = self._question_keys[n][qid]
                entry = figures.setdefault(key, {"ids": set(), "type": question.type, "states": 0, "labelled": 0})
                entry.update(ids=entry["ids"] | {qid}, states=entry["states"] + 1)
                found = answers.get(n, {}).get(qid)
                if found is not None and found.fit is not None:
                    entry.setdefault("fit", found.fit)
                if n in labelled and qid in labelled[n].answers:
                    entry["labelled"] += 1
                elif found is not None and found.answer_set is not None:
                    entry.setdefault("sizes", []).append(len(found.answer_set))
        return [_figures(key, entry, coverage) for key, entry in figures.items()]


# Why a question with enough labels has no fit; a later refit can drop an earlier fit for this reason.
NOT_ADOPTED = "no fit adopted: none beat the model's own answers, cross-validated"


def _figures(key: str, entry: dict[str, Any], coverage: float) -> dict[str, Any]:
    record: FitRecord | None = entry.get("fit")
    sizes: list[int] = entry.get("sizes", [])
    labelled = entry["labelled"]
    note = None
    if record is None:
        note = f"no fit yet ({labelled} of {MIN_LABELLED} labels)" if labelled < MIN_LABELLED else NOT_ADOPTED
    sets = (record.sets or {}).get(f"{coverage:g}") if record is not None else None
    return {
        "key": key,
        "name": ", ".join(sorted(entry["ids"])),
        "type": entry["type"],
        "states": entry["states"],
        "labelled": labelled,
        "method": None if record is None else record.method,
        "examples": None if record is None else record.examples,
        "accuracy": None if record is None or record.after is None else record.after["accuracy"],
        "sets": sets,
        "mean_set_size": sum(sizes) / len(sizes) if sizes else None,
        "note": note,
    }
