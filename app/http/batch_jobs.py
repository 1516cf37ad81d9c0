"""Large batches run as background jobs (202, as fitting jobs do in app/calibrate/jobs.py): a thread answers
the items while the client follows the progress at GET /v1/systemone/jobs/{id}, then reads the results."""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from app.http.admission import Admission
from app.http.batch import Run, answer_items
from app.serving.registry import ModelRegistry

log = logging.getLogger("onepass.batch")
KEEP_JOBS = 64  # finished jobs remembered, with their results, until this many newer ones have finished


@dataclass
class BatchJob:
    id: str
    run: Run
    status: str = "running"  # running, done, cancelled, failed
    error: str | None = None
    thread: threading.Thread | None = None

    def to_json(self) -> dict[str, Any]:
        eta = self.run.progress.eta_s()
        running = self.status == "running"
        return {
            "id": self.id,
            "status": self.status,
            "done": self.run.progress.done,
            "total": self.run.progress.total,
            "errors": self.run.errors(),
            "eta_s": None if eta is None or not running else round(eta, 1),
            "results": None if running else self.run.results(),
            "error": self.error,
        }


class BatchJobs:
    def __init__(self) -> None:
        self._jobs: dict[str, BatchJob] = {}
        self._lock = threading.Lock()

    def running(self) -> int:
        with self._lock:
            return sum(job.status == "running" for job in self._jobs.values())

    def start(self, run: Run, registry: ModelRegistry, admission: Admission) -> BatchJob:
        job = BatchJob(uuid.uuid4().hex[:16], run)
        with self._lock:
            self._jobs[job.id] = job
            finished = [j for j in self._jobs.values() if j.status != "running"]
            for old in finished[: max(0, len(finished) - KEEP_JOBS)]:
                del self._jobs[old.id]
        job.thread = threading.Thread(
            target=self._run, args=(job, registry, admission), name=f"batch-{job.id}", daemon=True
        )
        job.thread.start()
        return job

    def get(self, job_id: str) -> BatchJob | None:
        with self._lock:
            return self._jobs.get(job_id)

    def all(self) -> Iterator[BatchJob]:
        with self._lock:
            yield from list(self._jobs.values())

    def cancel_all(self, admission: Admission, timeout: float) -> None:
        """Stop every running job at its next step and wait for it (at shutdown, before the models close)."""
        jobs = list(self.all())
        for job in jobs:
            admission.stop(job.run.stop)
        for job in jobs:
            if job.thread is not None:
                job.thread.join(timeout)

    @staticmethod
    def _run(job: BatchJob, registry: ModelRegistry, admission: Admission) -> None:
        try:
            answer_items(job.run, registry, admission)
            job.status = "cancelled" if None in job.run.results() else "done"
            log.info(
                "batch job %s %s: %d of %d requests answered, %d errors",
                job.id,
                job.status,
                sum(result is not None for result in job.run.results()),
                job.run.progress.total,
                job.run.errors(),
            )
        except Exception as error:
            log.exception("batch job %s failed", job.id)
            job.status, job.error = "failed", str(error)
