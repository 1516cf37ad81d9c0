"""The scheduler's loop (app/engine/pool.py) over contexts that decode nothing, through hundreds of seeded
random schedules in seconds: borrowers of both lanes (plain steps, prefills, question decodes that may
share one llama_decode) come from threads of their own on one to three contexts, with and without a side
context; some callers are stopped while they wait and some background ones promoted. Every borrower
gets its answer (a context, its question decode taken into another's, or Cancelled where its caller was
stopped), no context is ever lent twice at once, background work stays within its cap, no question
decode is answered twice or past a micro-batch, every context comes back and the loop ends at close."""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass, field
from typing import Literal, cast

import pytest

from app.engine import lending
from app.engine.bindings import EngineError
from app.engine.caller import Caller, Lane, Signal, working_for
from app.engine.context import Context
from app.engine.lending import Questions
from app.engine.pool import ContextPool
from app.errors import Cancelled

SCHEDULES = 500
WAIT_S = 30  # every wait here is bounded; a healthy schedule takes milliseconds

Kind = Literal["step", "prefill", "questions"]


class FakeContext:
    """What the pool reads of a context, and who holds it now (two at once is a failure)."""

    n_ctx = 4096
    can_give_up = True
    decodes = decoded_rows = 0

    def __init__(self, threads: int) -> None:
        self.threads = threads
        self.holder: Borrower | None = None
        self.lock = threading.Lock()

    def set_threads(self, threads: int) -> None:
        self.threads = threads

    def position_of(self, snapshot: object) -> int | None:
        return None

    def interrupt(self, above: int | None = None) -> bool:
        return False  # nothing is under way to give up

    def clear(self) -> None:
        pass

    def close(self) -> None:
        pass


@dataclass(eq=False)
class Job:
    """A question decode: its rows, and the leaders that took it (one, once answered)."""

    rows: int
    done: Signal = field(default_factory=Signal)
    taken_by: list[Borrower] = field(default_factory=list)


@dataclass(eq=False)
class Borrower:
    lane: Lane
    kind: Kind
    rows: int
    caller: Caller = field(init=False)
    job: Job | None = None
    work_s: float = 0.0
    outcome: str = ""
    failures: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.caller = Caller(self.lane)
        if self.kind == "questions":
            self.job = Job(self.rows)

    def run(self, pool: ContextPool, max_rows: int) -> None:
        try:
            with working_for(self.caller):
                if self.job is None:
                    with pool.borrow(None, prefill=self.kind == "prefill") as ctx:
                        self.hold(cast(FakeContext, ctx), pool)
                    self.outcome = "lent"
                    return
                with pool.borrow_for_questions(None, Questions(self.rows, self.rows + 10, 2), self.job) as lent:
                    if lent is None:
                        self.outcome = "taken"
                    else:
                        ctx, jobs = lent
                        self.lead(cast(FakeContext, ctx), cast(list[Job], jobs), pool, max_rows)
                        self.outcome = "led"
                if not self.job.done.wait(WAIT_S):
                    self.failures.append("a question decode taken into another's was never answered")
        except Cancelled:
            self.outcome = "cancelled"
            if not self.caller.stopped:
                self.failures.append("cancelled, though its caller was not stopped")

    def hold(self, ctx: FakeContext, pool: ContextPool) -> None:
        with ctx.lock:
            if ctx.holder is not None:
                self.failures.append("a context lent to two borrowers at once")
            ctx.holder = self
        background = sum(
            1
            for c in cast(list[FakeContext], pool._contexts)
            if c.holder is not None and c.holder.caller.lane == "background"
        )
        if background > pool.background_cap:
            self.failures.append(f"background work holds {background} contexts, past its cap")
        threading.Event().wait(self.work_s)  # the step's work: others come and wait meanwhile
        with ctx.lock:
            ctx.holder = None

    def lead(self, ctx: FakeContext, jobs: list[Job], pool: ContextPool, max_rows: int) -> None:
        self.hold(ctx, pool)
        if not jobs or jobs[0] is not self.job:
            self.failures.append("a leader's decode does not take its own question decode first")
        if len(jobs) > 1 and sum(job.rows for job in jobs) > max_rows:
            self.failures.append("a shared decode past a micro-batch of rows")
        for job in jobs:
            job.taken_by.append(self)
            job.done.set()


def run_schedule(seed: int) -> list[str]:
    """One random schedule; what went wrong in it."""
    rng = random.Random(seed)
    threads, max_rows = rng.choice([1, 4]), rng.choice([8, 64])
    pool = ContextPool(
        lambda n: cast(Context, FakeContext(n)), threads, can_give_up=True, side=rng.random() < 0.5, max_rows=max_rows
    )
    pool.open(rng.randint(1, 3))
    pool.open_side()
    if rng.random() < 0.5:  # as just after a shared decode: the first question decode waits a moment for company
        pool.decoded_together("interactive", rng.randint(2, 6))
    lanes: list[Lane] = ["interactive", "background"]
    kinds: list[Kind] = ["step", "prefill", "questions"]
    borrowers = [
        Borrower(rng.choice(lanes), rng.choice(kinds), rng.randint(1, 12), work_s=rng.random() / 1000)
        for _ in range(rng.randint(1, 12))
    ]
    workers = [threading.Thread(target=b.run, args=(pool, max_rows), daemon=True) for b in borrowers]
    meddled = [b for b in borrowers if rng.random() < 0.3]
    for worker in workers:
        worker.start()
    for borrower in meddled:  # while it waits, or before, or after: wherever the threads are by then
        if borrower.lane == "background" and rng.random() < 0.5:
            borrower.caller.promote()
        else:
            borrower.caller.stop.set()
    failures: list[str] = []
    for worker in workers:
        worker.join(WAIT_S)
        if worker.is_alive():
            failures.append("a borrower never had its answer")
    for borrower in borrowers:
        failures += borrower.failures
        if borrower.job is not None and borrower.outcome != "cancelled" and len(borrower.job.taken_by) != 1:
            failures.append(f"a question decode answered {len(borrower.job.taken_by)} times")
    if not failures:
        if pool.lent("interactive") + pool.lent("background") or pool.waiting("interactive") + pool.waiting(
            "background"
        ):
            failures.append("a context still lent, or a borrower still waiting, once every borrower ended")
        closing = threading.Thread(target=pool.close, daemon=True)
        closing.start()
        closing.join(WAIT_S)
        pool._loop.join(WAIT_S)
        if closing.is_alive() or pool._loop.is_alive():
            failures.append("the pool did not close, or its loop did not end")
    return [f"seed {seed}: {failure}" for failure in failures]


def test_hundreds_of_random_schedules_answer_every_borrower_and_keep_every_promise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(lending, "GATHER_S", 0.005)  # the moment held for company: short, as the steps are here
    for seed in range(SCHEDULES):
        assert run_schedule(seed) == []


def test_a_borrower_asking_a_closed_pool_is_refused() -> None:
    pool = ContextPool(lambda n: cast(Context, FakeContext(n)), 1, can_give_up=True, side=False)
    pool.open(1)
    pool.close()
    with pytest.raises(EngineError, match="closed"), pool.borrow(None):
        pass
