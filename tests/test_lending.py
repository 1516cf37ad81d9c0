"""The lending rules (app/engine/lending.py) drive a simulated pool through thousands of seeded random
schedules, in seconds and without llama.cpp: steps of work of both lanes, prefills and not, arrive at
random moments on one to three contexts, with and without a side context; a prefill looks at each piece
boundary whether to hand its context over and owes itself a piece each time it gets one back, as
prefill.py does. Every schedule ends with every step done and every context back, and at every moment
the rules' promises hold: interactive work first, background work within its cap, the side context only
beside prefills and only for a request's decode, and a request's prefill never handing over to a prefill.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field

import pytest

from app.engine.caller import LANES, Lane
from app.engine.lending import (
    GATHER_S,
    LastDecode,
    Lent,
    PoolState,
    Questions,
    Ticket,
    background_cap,
    companions,
    hands_over,
    may_take,
    prefill_share,
    someone_waits,
    to_give_up,
    waits_for_company,
)

SCHEDULES = 3000
STEPS_AT_MOST = 10_000  # far beyond any schedule's work: a schedule still running then has starved a step


@dataclass(eq=False)
class Work:
    """A step of work: its lane, whether it is a prefill (in pieces), and the pieces it has left."""

    lane: Lane
    prefill: bool
    left: int
    arrives: int
    owed: bool = False  # handed over before: goes on by a piece when it has a context again
    ticket: Ticket = field(init=False)

    def __post_init__(self) -> None:
        self.ticket = Ticket(self.prefill)


@dataclass
class Holder:
    work: Work
    threads: int


class SimulatedPool:
    """A pool's state as pool.py keeps it, moved by the lending rules alone."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.contexts = rng.randint(1, 3)
        self.threads = rng.choice([1, 2, 4, 8])
        self.side_opened = self.threads >= 2 and rng.random() < 0.5
        self.held: list[Holder | None] = [None] * self.contexts
        self.side: Holder | None = None
        self.queues: dict[Lane, deque[Ticket]] = {lane: deque() for lane in LANES}
        self.waiting: dict[Ticket, Work] = {}
        self.lent: dict[Lane, int] = dict.fromkeys(LANES, 0)

    def state(self) -> PoolState:
        share = prefill_share(self.threads)
        return PoolState(
            contexts=self.contexts,
            idle=sum(holder is None for holder in self.held),
            lent=self.lent,
            queues=self.queues,
            threads=self.threads,
            side_opened=self.side_opened,
            side_lent=self.side is not None,
            at_share=all(h is not None and (h.work.prefill or h.threads <= share) for h in self.held),
        )

    def wait(self, work: Work) -> None:
        self.queues[work.lane].append(work.ticket)
        self.waiting[work.ticket] = work

    def lend(self) -> None:
        """Every waiter that may take a context takes one, until none may; waiters look in a random order,
        as the pool's threads wake in whatever order the system runs them."""
        lent_one = True
        while lent_one:
            lent_one = False
            looking = [(lane, ticket) for lane in LANES for ticket in self.queues[lane]]
            self.rng.shuffle(looking)
            for lane, ticket in looking:
                if ticket not in self.waiting:
                    continue
                taken = may_take(self.state(), lane, ticket)
                if taken is None:
                    continue
                if lane == "background":
                    assert not self.queues["interactive"], (
                        "background work was lent a context an interactive step waited for"
                    )
                work = self.waiting.pop(ticket)
                self.queues[lane].remove(ticket)
                self.lent[lane] += 1
                if taken is Lent.SIDE:
                    assert lane == "interactive" and not work.prefill, "the side context is a request's"
                    assert all(h is not None for h in self.held), "the side context while one was idle"
                    self.side = Holder(work, self.threads - prefill_share(self.threads))
                else:
                    threads = prefill_share(self.threads) if self.side is not None else self.threads
                    self.held[self.held.index(None)] = Holder(work, threads)
                lent_one = True

    def check(self) -> None:
        """What holds at every moment, once every waiter that could has taken a context."""
        state = self.state()
        if state.idle:
            assert not self.queues["interactive"], "an interactive step waits beside an idle context"
            cap_reached = self.lent["background"] >= background_cap(self.contexts)
            assert not self.queues["background"] or cap_reached, "a background step waits beside an idle context"
        held_background = sum(h is not None and h.work.lane == "background" for h in self.held)
        assert held_background <= background_cap(self.contexts), "background work over its cap"

    def step(self) -> None:
        """Each holder decodes a piece; a prefill then hands its context over where the rules say so."""
        if self.side is not None:
            self.side.work.left -= 1
            if self.side.work.left == 0:
                self.lent[self.side.work.lane] -= 1
                self.side = None
        for i, holder in enumerate(self.held):
            if holder is None:
                continue
            work = holder.work
            work.left -= 1
            work.owed = False
            if work.left == 0:
                self.held[i] = None
                self.lent[work.lane] -= 1
            elif work.prefill and someone_waits(self.state(), work.lane):
                waiting = [self.waiting[ticket] for ticket in self.queues["interactive"]]
                assert any(hands_over(work.lane, w.ticket) for w in waiting)
                assert work.lane == "background" or any(not w.prefill for w in waiting), (
                    "a request's prefill yielded to a prefill"
                )
                self.held[i] = None
                self.lent[work.lane] -= 1
                work.owed = True
                self.wait(work)

    def give_up_for(self, work: Work) -> None:
        """What a newcomer gives up, as the pool asks the rules: the chosen prefill's piece is cut short
        (the simulation hands its context over at once), or the prefills' threads beyond their share."""
        if work.lane != "interactive" or not all(h is not None for h in self.held):
            return
        prefilling = [(i, h) for i, h in enumerate(self.held) if h is not None and h.work.prefill]
        above, order = to_give_up(self.state(), work.ticket, [h.work.lane for _, h in prefilling])
        if above is not None:
            for _, holder in prefilling:
                holder.threads = min(holder.threads, above)
            return
        assert len(order) <= len(prefilling)
        for place in order:
            i, holder = prefilling[place]
            assert hands_over(holder.work.lane, work.ticket)
            if not holder.work.owed:  # an owed piece is not given up
                self.held[i] = None
                self.lent[holder.work.lane] -= 1
                holder.work.owed = True
                self.wait(holder.work)
                return

    def idle(self) -> bool:
        return all(h is None for h in self.held) and self.side is None and not self.waiting


def schedule(seed: int) -> int:
    """One random schedule run to its end; the steps it took."""
    rng = random.Random(seed)
    pool = SimulatedPool(rng)
    arrivals = sorted(
        (
            Work(
                rng.choice(LANES),
                prefill := rng.random() < 0.4,
                rng.randint(2, 12) if prefill else rng.randint(1, 3),
                rng.randint(0, 40),
            )
            for _ in range(rng.randint(1, 25))
        ),
        key=lambda work: work.arrives,
    )
    pending = deque(arrivals)
    for now in range(STEPS_AT_MOST):
        while pending and pending[0].arrives <= now:
            work = pending.popleft()
            pool.give_up_for(work)
            pool.wait(work)
        pool.lend()
        pool.check()
        if not pending and pool.idle():
            assert pool.lent == dict.fromkeys(LANES, 0), "a context was not given back"
            assert all(work.left == 0 for work in arrivals)
            return now
        pool.step()
    raise AssertionError(f"schedule {seed} starved a step: still running after {STEPS_AT_MOST} steps")


def test_thousands_of_random_schedules_end_with_every_step_done_and_every_promise_kept() -> None:
    steps = [schedule(seed) for seed in range(SCHEDULES)]
    assert len(steps) == SCHEDULES and max(steps) < STEPS_AT_MOST


@pytest.mark.parametrize("waiting_prefill_lane", LANES)
def test_a_requests_prefill_waits_for_another_and_a_fits_gives_way(waiting_prefill_lane: Lane) -> None:
    """The rule the schedules lean on, alone: a prefill holding the only context hands it to an interactive
    prefill only when it is itself background work."""
    waiting = Ticket(prefill=True)
    state = PoolState(
        contexts=1,
        idle=0,
        lent={"interactive": 1, "background": 0}
        if waiting_prefill_lane == "interactive"
        else {"interactive": 0, "background": 1},
        queues={"interactive": deque([waiting]), "background": deque()},
        threads=2,
        side_opened=True,
        side_lent=False,
        at_share=True,
    )
    assert someone_waits(state, waiting_prefill_lane) is (waiting_prefill_lane == "background")
    assert may_take(state, "interactive", waiting) is None  # a prefill never takes the side context


def questions(rows: int, cells: int = 10, sequences: int = 2) -> Ticket:
    return Ticket(False, Questions(rows, cells, sequences))


def test_a_decode_takes_the_first_question_decode_and_the_others_that_fit_in_order() -> None:
    queue = [questions(8), questions(10), questions(4), questions(2, cells=1000), questions(1, sequences=60)]
    # 8 + 4 rows fit beside each other in 12, 10 more do not; the cells and the sequences keep out the last two
    assert companions(queue, max_rows=12, n_ctx=100, max_sequences=8) == [queue[0], queue[2]]
    # the first is always taken, even alone past a bound (it is decoded as it would be alone)
    alone = questions(20)
    assert companions([alone], max_rows=12, n_ctx=100, max_sequences=8) == [alone]


def test_a_question_decode_waits_for_company_only_just_after_a_decode_that_had_more() -> None:
    now = 100.0
    queue = [questions(4)]
    assert waits_for_company(LastDecode(3, now - GATHER_S / 2), queue, 512, now)  # its lane's clients come back
    assert not waits_for_company(LastDecode(1, now - GATHER_S / 2), queue, 512, now)  # one client: nobody waits
    assert not waits_for_company(LastDecode(3, now - 2 * GATHER_S), queue, 512, now)  # their moment passed
    assert not waits_for_company(LastDecode(3, now), [*queue, questions(4), questions(4)], 512, now)  # all here
    assert not waits_for_company(LastDecode(3, now), [questions(512)], 512, now)  # a micro-batch's rows already
    assert not waits_for_company(LastDecode(), queue, 512, now)  # no decode yet
