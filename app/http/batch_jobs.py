"""Large batches run as background jobs (202, as fitting jobs do; app/jobs.py): a thread answers the
items while the client follows the progress at GET /v1/systemone/jobs/{id}, then reads the results."""

from __future__ import annotations

from dataclasses import dataclass

from app.http.admission import Admission
from app.http.batch import Run, answer_items
from app.jobs import BackgroundJob
from app.progress import Progress
from app.serving.registry import ModelRegistry
from app.wire.contract_jobs import BatchJob


@dataclass
class BatchWork:
    """A batch answered by a job: done once every request has its result, cancelled when one has none."""

    batch: Run
    registry: ModelRegistry
    admission: Admission

    @property
    def progress(self) -> Progress:
        return self.batch.progress

    def run(self) -> str:
        answer_items(self.batch, self.registry, self.admission)
        return "cancelled" if None in self.batch.results() else "done"

    def stop(self) -> None:
        self.admission.stop(self.batch.stop)

    def summary(self) -> str:
        answered = sum(result is not None for result in self.batch.results())
        return f"{answered} of {self.progress.total} requests answered, {self.batch.errors()} errors"


def batch_job_of(job: BackgroundJob[BatchWork]) -> BatchJob:
    """The job as GET /v1/systemone/jobs/{id} shows it."""
    batch = job.work.batch
    return BatchJob.model_validate(
        {
            "id": job.id,
            "status": job.status,
            "done": batch.progress.done,
            "total": batch.progress.total,
            "errors": batch.errors(),
            "eta_s": job.eta_s(),
            "results": None if job.running else batch.results(),
            "error": job.error,
        }
    )
