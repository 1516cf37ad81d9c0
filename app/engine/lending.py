"""The rules that decide which waiting step of work a model's contexts go to, as pure functions of the pool's
state (`PoolState`): which borrower may take a context, whether a prefill hands its context over, which
prefill's piece under way is given up for a newcomer, and how many threads a prefill's next piece uses.
The pool (pool.py) keeps the state and its lock, and asks these; tests/test_lending.py drives them with a
simulated pool, without llama.cpp.

The rules: interactive work is lent an idle context before background work; background work holds at
most half the contexts, at least one; a lane's contexts go to its first waiter. A prefill hands its
context to an interactive step that waits for one, between two of its pieces or in one, but a request's
prefill never to another prefill (that one waits: taking turns would only add a snapshot's save and
restore to each turn), and a background prefill to any interactive step. The side context is lent only
to an interactive step that is not a prefill, while every context is lent to a prefill or to work with a
prefill's share of the threads; the prefills then decode with that share.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum

from app.engine.caller import Lane


def prefill_share(threads: int) -> int:
    """The threads a prefill keeps while a request is answered beside it on the side context: a quarter
    of them, at least one. The request is what a client waits for; the prefill only has to go on."""
    return max(1, threads // 4)


def background_cap(contexts: int) -> int:
    """The most contexts background work holds at once: half the pool, at least one."""
    return max(1, contexts // 2)


@dataclass(frozen=True)
class Questions:
    """A request's question decode that may share one llama_decode with others' (batch_requests): its rows,
    the cells its prefix and rows fill, and its sequences (the prefix's and one per question)."""

    rows: int
    cells: int
    sequences: int


@dataclass(frozen=True, eq=False)
class Ticket:
    """A borrower's place in its lane's queue; a prefill never takes the side context. `questions`: a
    question decode that others' may join."""

    prefill: bool
    questions: Questions | None = None


@dataclass
class LastDecode:
    """What a lane's last shared question decode says of its next: how many requests to expect (those the
    decode answered, whose clients send their next ones at once, and those it left waiting: they did not
    fit, or came while it decoded), and when it ended (monotonic). Per lane: a fit's decode between two
    rounds of many clients says nothing of how many of them come back."""

    company: int = 1
    ended: float = -math.inf


# The longest the first question decode in line waits for the company its lane's last decode had: a few
# HTTP requests' worth of parsing and planning, a small part of one decode
# (docs/exactness.md#the-setting-batch_requests).
GATHER_S = 0.1


class Lent(Enum):
    """What a waiting ticket may take now."""

    IDLE = "an idle context"
    SIDE = "the side context"


@dataclass(frozen=True)
class PoolState:
    """What the rules read of a pool at one moment (under its lock)."""

    contexts: int
    idle: int
    lent: Mapping[Lane, int]  # contexts lent, per lane (the side context included)
    queues: Mapping[Lane, Sequence[Ticket]]  # the tickets waiting, per lane, in the order they came
    threads: int
    side_opened: bool
    side_lent: bool
    at_share: bool  # every context is lent to a prefill or to work with a prefill's share of the threads


def side_free(state: PoolState) -> bool:
    """Whether the side context may be lent now: every context is lent, each to a prefill (which gives up
    threads beyond its share) or to work lent with its share already."""
    return state.side_opened and not state.side_lent and not state.idle and state.at_share


def prefill_threads(state: PoolState) -> int:
    """The threads a prefill's next piece may use: all, or its share while the side context is lent or
    about to be."""
    beside = state.side_lent or any(not ticket.prefill for ticket in state.queues["interactive"])
    return prefill_share(state.threads) if state.side_opened and beside else state.threads


def hands_over(lane: Lane, ticket: Ticket) -> bool:
    """Whether a prefill of `lane` hands its context to the interactive `ticket`."""
    return lane == "background" or not ticket.prefill


def someone_waits(state: PoolState, lane: Lane) -> bool:
    """Whether an interactive step waits for a context that none is idle for, the side context included,
    that a prefill of `lane` is to hand its context to."""
    if state.idle:
        return False
    free = side_free(state)
    return any(hands_over(lane, ticket) and (ticket.prefill or not free) for ticket in state.queues["interactive"])


def may_take(state: PoolState, lane: Lane, ticket: Ticket) -> Lent | None:
    """What `ticket`, waiting in `lane`, may take now: an idle context, the side context, or nothing yet."""
    queue = state.queues[lane]
    if state.idle and queue[0] is ticket:
        if lane == "interactive":
            return Lent.IDLE
        if not state.queues["interactive"] and state.lent["background"] < background_cap(state.contexts):
            return Lent.IDLE
    if lane == "interactive" and side_free(state):
        first = next((waiter for waiter in queue if not waiter.prefill), None)
        if first is ticket:
            return Lent.SIDE
    return None


def to_give_up(state: PoolState, ticket: Ticket, prefilling: Sequence[Lane]) -> tuple[int | None, list[int]]:
    """For an interactive `ticket` that finds no idle context, given the lane of each context lent to a
    prefill (`prefilling`, in the pool's order): (`above`, `order`). Where `above` is set, every prefill's
    piece under way with more threads than that is given up: the ticket takes the side context, which
    needs the threads beyond the prefills' share. Else the first prefill in `order` (places in
    `prefilling`) whose piece under way can be given up is, to hand its context over: one is enough, a
    background one first."""
    if not ticket.prefill and side_free(state):
        return prefill_threads(state), []
    order = [i for i, lane in enumerate(prefilling) if hands_over(lane, ticket)]
    order.sort(key=lambda i: prefilling[i] != "background")
    return None, order


def waits_for_company(last: LastDecode, queue: Sequence[Ticket], max_rows: int, now: float) -> bool:
    """Whether the question decode first in `queue` (its lane's question tickets waiting, in the order they
    came) waits for more before it takes a context: where its lane's last decode ended within GATHER_S
    and had more company than `queue` holds, and `queue`'s rows fill less than a micro-batch (`max_rows`).

    Clients answered by one decode send their next requests at once, but the first of them to come would
    otherwise be decoded alone and the others after it, one decode each where one would do. Alone (one
    client) nothing waits; nor does a request that comes after its lane's last clients had their moment
    to come back (a lone request after a burst): what of them has not come is not coming at once."""
    if now - last.ended > GATHER_S:
        return False
    rows = sum(ticket.questions.rows for ticket in queue if ticket.questions is not None)
    return len(queue) < last.company and rows < max_rows


def companions(queue: Sequence[Ticket], max_rows: int, n_ctx: int, max_sequences: int) -> list[Ticket]:
    """The question tickets one llama_decode takes: the first of `queue` (its lane's question tickets
    waiting, in the order they came), then the others in order, each where its rows, cells and sequences
    still fit beside those taken (one micro-batch of rows, the context's cells, its sequences)."""
    taken: list[Ticket] = []
    rows = cells = sequences = 0
    for ticket in queue:
        size = ticket.questions
        assert size is not None  # a question ticket
        if taken and (
            rows + size.rows > max_rows or cells + size.cells > n_ctx or sequences + size.sequences > max_sequences
        ):
            continue
        taken.append(ticket)
        rows, cells, sequences = rows + size.rows, cells + size.cells, sequences + size.sequences
    return taken
