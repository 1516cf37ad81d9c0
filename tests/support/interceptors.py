"""Intercepts (app/serving/registry.py) that stop or break requests where a test wants them: held at a
door, faulted inside llama.cpp."""

from __future__ import annotations

import threading

from app.answering.service import ModelService
from app.engine.caller import current
from app.wire.contract import SystemOneRequest
from tests.support.batches import WAIT


class Doorman:
    """An intercept (app/serving/registry.py) that puts a door before each answer the registry lends its
    model for, and records who entered: a request whose state is in `held` waits there until the test
    opens it; one in `until_cancelled` waits until its request is cancelled."""

    def __init__(self) -> None:
        self.door = threading.Condition()
        self.entered: list[str] = []
        self.held: set[str] = set()
        self.until_cancelled: set[str] = set()

    def __call__(self, service: ModelService, request: SystemOneRequest | None) -> None:
        if request is None:
            return
        state = request.state_text
        with self.door:
            self.entered.append(state)
            self.door.notify_all()
            assert self.door.wait_for(lambda: state not in self.held, WAIT)
        if state in self.until_cancelled:
            assert current().stop.wait(WAIT)

    def open(self, state: str) -> None:
        with self.door:
            self.held.discard(state)
            self.door.notify_all()

    def wait_entered(self, count: int) -> list[str]:
        with self.door:
            assert self.door.wait_for(lambda: len(self.entered) >= count, WAIT), self.entered
            return list(self.entered)

    def wait_for(self, state: str) -> None:
        """Until a request about `state` has entered (counting entries is not enough where requests
        sent alone pass the same door)."""
        with self.door:
            assert self.door.wait_for(lambda: state in self.entered, WAIT), self.entered


class Faulty:
    """An intercept that, before the first answer, decodes that request's own plan with a token id
    outside the vocabulary: a fault inside llama.cpp, raised as that request's; later answers pass."""

    def __init__(self) -> None:
        self.faults = 1

    def __call__(self, service: ModelService, request: SystemOneRequest | None) -> None:
        if request is None or not self.faults:
            return
        self.faults -= 1
        plan = service.plan(request)
        rendered = plan.suffixes()[0]
        object.__setattr__(rendered, "tokens", (*rendered.tokens[:-1], service.engine.vocab.n_vocab + 7))
        service.decode(plan)
