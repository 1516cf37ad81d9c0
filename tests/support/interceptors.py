"""Services that stop or break requests where a test wants them: held at a door, faulted inside llama.cpp."""

from __future__ import annotations

import threading
from typing import Any

from app.answering.prompter import Plan
from app.answering.service import ModelService, RequestReadouts
from app.engine.caller import current
from app.wire.contract import SystemOneRequest, SystemOneResponse
from tests.support.batches import WAIT


class Doorman(ModelService):
    """The real service behind a door that records who entered: a request whose state is in `held` waits
    there until the test opens it; one in `until_cancelled` waits until its request is cancelled."""

    def __init__(self, inner: ModelService) -> None:
        self.__dict__.update(inner.__dict__)
        self.door = threading.Condition()
        self.entered: list[str] = []
        self.held: set[str] = set()
        self.until_cancelled: set[str] = set()

    def answer(self, request: SystemOneRequest) -> SystemOneResponse:
        state = request.state_text
        with self.door:
            self.entered.append(state)
            self.door.notify_all()
            assert self.door.wait_for(lambda: state not in self.held, WAIT)
        if state in self.until_cancelled:
            assert current().stop.wait(WAIT)
        return super().answer(request)

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


class FaultyService(ModelService):
    """The real service, but the first request feeds llama.cpp a token id outside the vocabulary."""

    def __init__(self, inner: ModelService) -> None:
        self.__dict__.update(inner.__dict__)
        self.faults = 1

    def decode(self, plan: Plan, **reads: Any) -> RequestReadouts:
        if self.faults:
            self.faults -= 1
            rendered = plan.suffixes()[0]
            object.__setattr__(rendered, "tokens", (*rendered.tokens[:-1], self.engine.vocab.n_vocab + 7))
        return super().decode(plan, **reads)
