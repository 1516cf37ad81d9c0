"""The one job registry (app/jobs.py) that batch and fitting jobs share: what a job ends as, cancelling,
and which finished jobs it remembers (the newest ones; a running job is never forgotten)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from app.jobs import BackgroundJob, JobRegistry
from app.progress import Progress

WAIT = 30  # seconds: every wait in these tests is bounded


@dataclass
class Held:
    """Work that waits until released (or stopped), then ends as it was told to."""

    outcome: str | BaseException = "done"
    release: threading.Event = field(default_factory=threading.Event)
    stopped: threading.Event = field(default_factory=threading.Event)
    progress: Progress = field(default_factory=lambda: Progress(1, show=False))

    def run(self) -> str:
        assert self.release.wait(WAIT) or self.stopped.is_set()
        if self.stopped.is_set():
            raise InterruptedError("stopped")
        if isinstance(self.outcome, BaseException):
            raise self.outcome
        self.progress.step()
        return self.outcome

    def stop(self) -> None:
        self.stopped.set()
        self.release.set()

    def summary(self) -> str:
        return "held work"


def finish(job: BackgroundJob[Held]) -> None:
    job.work.release.set()
    job.thread.join(WAIT)
    assert not job.thread.is_alive()


def test_a_job_ends_as_its_work_says_or_failed_with_the_reason() -> None:
    jobs: JobRegistry[Held] = JobRegistry("test")
    done, partly, broken = (jobs.start(Held(outcome)) for outcome in ("done", "done, with errors", ValueError("bad")))
    assert jobs.running() == 3 and all(job.running and job.eta_s() is None for job in jobs.all())
    for job in (done, partly, broken):
        finish(job)
    assert [(job.status, job.error) for job in (done, partly, broken)] == [
        ("done", None),
        ("done, with errors", None),
        ("failed", "bad"),
    ]
    assert jobs.running() == 0 and done.eta_s() is None


def test_cancelling_stops_the_work_and_waits_for_it() -> None:
    jobs: JobRegistry[Held] = JobRegistry("test")
    job = jobs.start(Held())
    jobs.cancel(job, WAIT)
    assert (job.status, job.error, job.thread.is_alive()) == ("cancelled", None, False)
    jobs.cancel(job, WAIT)  # an ended job stays as it ended
    assert job.status == "cancelled"
    others = [jobs.start(Held()) for _ in range(3)]
    jobs.cancel_all(WAIT)
    assert [other.status for other in others] == ["cancelled"] * 3


def test_the_newest_finished_jobs_are_kept_and_running_ones_never_forgotten() -> None:
    jobs: JobRegistry[Held] = JobRegistry("test", keep=3)
    running = jobs.start(Held())  # started first, still running when every other has finished
    started = [jobs.start(Held()) for _ in range(6)]
    # finished in another order than they started: the ones finished last are the newest
    order = [started[i] for i in (5, 0, 4, 1, 3, 2)]
    for i, job in enumerate(order):
        finish(job)
        newest, unfinished = order[max(0, i - 2) : i + 1], [running, *order[i + 1 :]]
        assert {job.id for job in jobs.all()} == {job.id for job in newest + unfinished}
    assert jobs.get(order[0].id) is None and jobs.get(order[-1].id) is order[-1]
    finish(running)
    assert {job.id for job in jobs.all()} == {job.id for job in [*order[-2:], running]}


class Unstoppable(Held):
    """Work that goes on when asked to stop, until it is released."""

    def stop(self) -> None:
        pass


def test_cancelling_every_job_waits_one_timeout_for_all_not_one_each() -> None:
    jobs: JobRegistry[Held] = JobRegistry("test")
    started = [jobs.start(Unstoppable()) for _ in range(4)]
    timeout = 0.5  # a shutdown's: four jobs that never stop would hold it 2 s, one after another
    began = time.monotonic()
    jobs.cancel_all(timeout)
    took = time.monotonic() - began
    assert all(job.running for job in started)  # not stopped: waited for, then left
    for job in started:
        finish(job)
    assert 0.9 * timeout <= took < 2 * timeout, f"cancel_all took {took:.2f} s"
