"""Fitting runs as background jobs (POST /v1/calibrations; app/jobs.py): answering the examples is
inference, minutes on a CPU, so a request starts a job and the client follows its progress."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field

from app.answering.service import ModelService
from app.calibration import Calibration, Evidence, FitRecord
from app.engine.caller import Signal
from app.fitting.examples import UserExample
from app.fitting.runner import QuestionReport, answer_all, fit_all, journal_for, store_all
from app.jobs import BackgroundJob
from app.progress import Progress
from app.wire.contract_jobs import CalibrationJob, FitError, FitReport, StoredFit

Lease = Callable[[], contextlib.AbstractContextManager[ModelService]]


@dataclass
class FitWork:
    """Fit a model's calibration to the examples and store the fits: done, or "done, with errors" when
    some questions could not be fitted or stored (the others' fits are stored)."""

    model: str
    lease: Lease
    examples: list[UserExample]
    question_set: bool
    progress: Progress = field(init=False)
    cancel: Signal = field(default_factory=Signal)
    reused: int = 0  # examples whose evidence an earlier run had answered
    fits: list[StoredFit] = field(default_factory=list)
    report: list[FitReport] | None = None  # once it has run
    errors: list[FitError] = field(default_factory=list)  # the questions that could not be fitted or stored
    # the examples' evidence where it is known already (a labelling session keeps it): nothing is answered
    evidence: list[dict[str, Evidence]] | None = None

    def __post_init__(self) -> None:
        self.progress = Progress(len(self.examples), show=False)

    def run(self) -> str:
        if self.cancel.is_set():  # stopped before it started: the model is not leased (nor loaded) for it
            raise InterruptedError("the fitting run was cancelled")
        with self.lease() as service:
            journal, store = journal_for(service), service.calibration.store
            if store is None or journal is None:
                raise RuntimeError("this model has no folder for fits")
            evidence = self.evidence
            if evidence is None:
                answered = answer_all(service, self.examples, self.progress, self.cancel, journal)
                self.reused, evidence = answered.reused, answered.evidence
            else:
                self.reused = len(evidence)
                self.progress.skip(len(evidence))
            stored, reports = self.fit(service.calibration, evidence)
        self.fits = [StoredFit(id=r.id, key=r.key, method=r.method, examples=r.examples) for r in stored]
        report = [FitReport.model_validate(r.to_json()) for r in reports]
        self.errors = [FitError(key=r.key, name=r.name, ids=r.ids, error=r.error) for r in report if r.error]
        self.report = report
        return "done, with errors" if self.errors else "done"

    def fit(
        self, calibration: Calibration, evidence: list[dict[str, Evidence]]
    ) -> tuple[list[FitRecord], list[QuestionReport]]:
        """Fit the examples and store the adopted fits in the calibration's store (an earlier fit of a
        question that adopts none stays, as `onepass calibrate` leaves it): the stored records, the reports."""
        assert calibration.store is not None
        reports, records = fit_all(self.examples, evidence, calibration, self.question_set, self.cancel)
        return store_all(calibration.store, reports, records)

    def stop(self) -> None:
        self.cancel.set()

    def summary(self) -> str:
        return f"{self.model}: {len(self.fits)} fits stored, {len(self.errors)} questions failed"


def calibration_job_of(job: BackgroundJob[FitWork]) -> CalibrationJob:
    """The job as GET /v1/calibrations/jobs/{id} shows it."""
    work = job.work
    return CalibrationJob.model_validate(
        {
            "id": job.id,
            "model": work.model,
            "status": job.status,
            "done": work.progress.done,
            "total": work.progress.total,
            "eta_s": job.eta_s(),
            "reused": work.reused,
            "fits": work.fits,
            "report": work.report,
            "error": job.error,
            "errors": work.errors,
        }
    )
