"""Fitting runs as background jobs (POST /v1/calibrations): answering the examples is inference, minutes
on a CPU, so a request starts a job and the client follows its progress."""

from __future__ import annotations

import contextlib
import logging
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from app.answering.service import ModelService
from app.calibrate.runner import Parsed, answer_all, fit_all, journal_for, store_all
from app.progress import Progress

log = logging.getLogger("onepass.fit_jobs")
KEEP_JOBS = 64  # finished jobs remembered for their reports (the fits themselves are files)

Lease = Callable[[], contextlib.AbstractContextManager[ModelService]]


@dataclass
class FitJob:
    id: str
    model: str
    progress: Progress
    status: str = "running"  # running, done, "done, with errors", failed, cancelled
    report: list[dict[str, Any]] | None = None
    fits: list[dict[str, Any]] = field(default_factory=list)  # the stored fits: id, key, method, examples
    error: str | None = None
    errors: list[dict[str, Any]] = field(default_factory=list)  # the questions that could not be fitted
    reused: int = 0  # examples whose evidence an earlier run had answered
    cancel: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None

    def to_json(self) -> dict[str, Any]:
        eta = self.progress.eta_s()
        return {
            "id": self.id,
            "model": self.model,
            "status": self.status,
            "done": self.progress.done,
            "total": self.progress.total,
            "eta_s": None if eta is None or self.status != "running" else round(eta, 1),
            "reused": self.reused,
            "fits": self.fits,
            "report": self.report,
            "error": self.error,
            "errors": self.errors,
        }


class FitJobs:
    def __init__(self) -> None:
        self._jobs: dict[str, FitJob] = {}
        self._lock = threading.Lock()

    def start(self, model: str, lease: Lease, examples: list[Parsed], question_set: bool) -> FitJob:
        job = FitJob(uuid.uuid4().hex[:16], model, Progress(len(examples), show=False))
        with self._lock:
            self._jobs[job.id] = job
            finished = [j for j in self._jobs.values() if j.status != "running"]
            for old in finished[: max(0, len(self._jobs) - KEEP_JOBS)]:
                del self._jobs[old.id]
        thread = threading.Thread(
            target=self._run, args=(job, lease, examples, question_set), name=f"fit-{job.id}", daemon=True
        )
        job.thread = thread
        thread.start()
        return job

    def get(self, job_id: str) -> FitJob | None:
        with self._lock:
            return self._jobs.get(job_id)

    def all(self) -> Iterator[FitJob]:
        with self._lock:
            yield from list(self._jobs.values())

    def cancel_all(self, timeout: float) -> None:
        """Stop every running job at its next example and wait for it (at shutdown, before the models close)."""
        jobs = list(self.all())
        for job in jobs:
            job.cancel.set()
        for job in jobs:
            if job.thread is not None:
                job.thread.join(timeout)

    @staticmethod
    def _run(job: FitJob, lease: Lease, examples: list[Parsed], question_set: bool) -> None:
        try:
            with lease() as service:
                journal, store = journal_for(service), service.calibration.store
                if store is None or journal is None:
                    raise RuntimeError("this model has no folder for fits")
                answered = answer_all(service, examples, job.progress, job.cancel.is_set, journal)
                job.reused = answered.reused
                reports, records = fit_all(examples, answered.evidence, service.calibration, question_set)
                stored, reports = store_all(store, reports, records)
            job.fits = [{"id": r.id, "key": r.key, "method": r.method, "examples": r.examples} for r in stored]
            job.report = [report.to_json() for report in reports]
            job.errors = [
                {"key": r["key"], "name": r["name"], "ids": r["ids"], "error": r["error"]}
                for r in job.report
                if r["error"]
            ]
            job.status = "done, with errors" if job.errors else "done"
            log.info(
                "fitting job %s for %s: %d fits stored, %d questions failed",
                job.id,
                job.model,
                len(stored),
                len(job.errors),
            )
        except InterruptedError:
            job.status = "cancelled"
        except Exception as error:
            log.exception("fitting job %s failed", job.id)
            job.status, job.error = "failed", str(error)
