"""Background jobs: work that runs in a thread of its own while clients follow it by id (a large batch,
a fitting run). One registry serves every kind: an id, a thread, the status the work ended in (or
`failed` with the reason, when it raised), and the last KEEP_FINISHED finished jobs remembered for their
results. A running job is never forgotten. What each kind's job shows is its wire schema's business
(app/wire/contract_jobs.py: BatchJob, CalibrationJob)."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from app.progress import Progress

log = logging.getLogger("onepass.jobs")
KEEP_FINISHED = 64  # finished jobs remembered, with their results, until this many have finished after them
RUNNING = "running"


class Work(Protocol):
    """What a job does, in its thread: `run` returns the status it ended in; InterruptedError means it
    was stopped (`cancelled`), any other exception fails the job."""

    @property
    def progress(self) -> Progress: ...

    def run(self) -> str: ...

    def stop(self) -> None: ...  # from any thread: ask `run` to end at its next step

    def summary(self) -> str: ...  # what it did, for the log line once it has run


W = TypeVar("W", bound=Work)


@dataclass
class BackgroundJob(Generic[W]):
    id: str
    work: W
    thread: threading.Thread = field(repr=False)
    status: str = RUNNING  # then what the work ended in, "cancelled" or "failed"
    error: str | None = None  # why it failed

    @property
    def running(self) -> bool:
        return self.status == RUNNING

    def eta_s(self) -> float | None:
        """Seconds left at the pace so far, to a tenth; None before the first step and once ended."""
        eta = self.work.progress.eta_s()
        return None if eta is None or not self.running else round(eta, 1)


class JobRegistry(Generic[W]):
    """The jobs of one kind (its name names their threads and log lines)."""

    def __init__(self, kind: str, keep: int = KEEP_FINISHED) -> None:
        self.kind, self.keep = kind, keep
        self._jobs: dict[str, BackgroundJob[W]] = {}
        self._finished: deque[str] = deque()  # ids, in the order the jobs finished
        self._lock = threading.Lock()

    def start(self, work: W) -> BackgroundJob[W]:
        job_id = uuid.uuid4().hex[:16]
        thread = threading.Thread(target=lambda: self._run(job), name=f"{self.kind}-{job_id}", daemon=True)
        job = BackgroundJob(job_id, work, thread)
        with self._lock:
            self._jobs[job.id] = job
        thread.start()
        return job

    def get(self, job_id: str) -> BackgroundJob[W] | None:
        with self._lock:
            return self._jobs.get(job_id)

    def all(self) -> list[BackgroundJob[W]]:
        with self._lock:
            return list(self._jobs.values())

    def running(self) -> int:
        return sum(job.running for job in self.all())

    def cancel(self, job: BackgroundJob[W], timeout: float) -> None:
        """Stop the job at its next step and wait until it has ended, at most `timeout` seconds. A job
        that has ended is left as it is."""
        job.work.stop()
        job.thread.join(timeout)

    def cancel_all(self, timeout: float) -> None:
        """Stop every job, then wait for them all to end within one `timeout` seconds, however many there
        are (at shutdown, before the models close): they stop side by side, not one after another."""
        self.stop_all()
        self.join_all(time.monotonic() + timeout)

    def stop_all(self) -> None:
        """Tell every job to stop at its next step."""
        for job in self.all():
            job.work.stop()

    def join_all(self, deadline: float) -> None:
        """Wait for every job to end, until `deadline` (time.monotonic()) at the latest."""
        for job in self.all():
            job.thread.join(max(0.0, deadline - time.monotonic()))

    def _run(self, job: BackgroundJob[W]) -> None:
        error = None
        try:
            status = job.work.run()
            log.info("%s job %s %s: %s", self.kind, job.id, status, job.work.summary())
        except InterruptedError:
            status = "cancelled"
        except Exception as raised:
            log.exception("%s job %s failed", self.kind, job.id)
            status, error = "failed", str(raised)
        with self._lock:
            job.error = error
            job.status = status  # last: a job seen ended has its error
            self._finished.append(job.id)
            while len(self._finished) > self.keep:
                del self._jobs[self._finished.popleft()]
