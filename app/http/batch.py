"""A batch of requests in one body: each item validated and answered on its own, in the order that suits
the prefix cache, its result kept at its place in the request's order.

Each item goes through ModelRegistry.answer alone, exactly as a single request does, so its answer
does not depend on the rest of the batch; the order only decides which prefixes the cache already
holds. A model that batches requests (batch_requests) answers a batch's items side by side, so that
their questions share its decodes: an answer decoded beside others then says so, as a single
request's would. A result is what the item would have been answered alone: the response object, or
{"error": {"status", "detail"}} with the error response's status and detail.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from app.config import Settings
from app.engine.caller import Signal
from app.errors import ApiError, Cancelled, InvalidRequest, ModelNotFound
from app.fleet.routing import affinity_key_of
from app.http.admission import Admission
from app.http.errors import error_of
from app.progress import Progress
from app.serving.registry import ModelRegistry
from app.wire.assets import request_of
from app.wire.contract import (
    BatchRequest,
    SystemOneRequest,
    errors_for_response,
    question_set_key,
    validation_error,
)
from app.wire.limits import limit_errors

log = logging.getLogger("onepass.batch")

# Where a model batches requests (batch_requests), a batch runs this many of its requests at once per
# context, so that their question decodes can share one llama_decode (app/engine/shared_decode.py).
SIDE_BY_SIDE = 16
JOIN_GRACE_S = 30.0  # past the budget, for a worker to see the stop and leave the step it is in


def is_batch(payload: Any) -> bool:
    """A body with `requests` and neither `state` nor `questions`: a body with those is one request,
    answered as ever (the contract ignores fields it does not know, `requests` among them)."""
    return isinstance(payload, dict) and "requests" in payload and not {"state", "questions"} & payload.keys()


def parse_request(payload: Any, settings: Settings, parts: Mapping[str, bytes] | None = None) -> SystemOneRequest:
    """The contract's request, its images read (`parts`: a multipart body's image parts), or a 422
    listing what is wrong with it."""
    parsed = request_of(payload, parts)
    problems = limit_errors(parsed, settings.max_questions, settings.max_text_chars)
    if problems:
        raise InvalidRequest(problems)
    return parsed


def batch_items(payload: Any, settings: Settings) -> list[Any]:
    """The items of a batch body, or a 422: `requests` not a non-empty list, or longer than max_batch_items."""
    try:
        items = BatchRequest.model_validate(payload).requests
    except ValidationError as error:
        raise InvalidRequest(errors_for_response(error)) from error
    if len(items) > settings.max_batch_items:
        message = f"{len(items)} requests; the limit is {settings.max_batch_items}"
        raise InvalidRequest(validation_error(("requests",), message, "too_long", len(items)))
    return items


def error_result(error: Exception) -> dict[str, Any]:
    status, detail, _ = error_of(error)
    return {"error": {"status": status, "detail": detail}}


@dataclass
class Item:
    """One request of a batch: parsed and its model found, or its result already an error."""

    index: int
    request: SystemOneRequest | None = None
    model: str = ""  # the configured name of the model that answers it
    result: dict[str, Any] | None = None  # None: not answered (yet)
    ran: bool = False


def parse_items(raw: list[Any], settings: Settings, canonical: Callable[[str], str]) -> list[Item]:
    """Every item validated on its own, its model name resolved by `canonical`: a bad one gets its 422 or
    404 as its result and nothing else fails."""
    items = []
    for index, body in enumerate(raw):
        item = Item(index)
        try:
            item.request = parse_request(body, settings)
            item.model = canonical(item.request.model)
        except (InvalidRequest, ModelNotFound) as error:
            item.request, item.result = None, error_result(error)
        items.append(item)
    return items


def per_model(items: list[Item]) -> dict[str, int]:
    """How many of the batch's requests each model answers (those that failed validation are not counted)."""
    counts: dict[str, int] = {}
    for item in items:
        if item.request is not None:
            counts[item.model] = counts.get(item.model, 0) + 1
    return counts


def schedule(items: list[Item]) -> list[Item]:
    """The order to answer in: model by model, each model's requests with the same state (its text and
    images) together and within those the same question set, each group where its first request stood.
    A prefix is then built once and found in the cache by the requests after it (in either layout)."""
    first: dict[Hashable, int] = {}  # each model, state and question set: where it first appeared

    def seen(key: Hashable) -> int:
        return first.setdefault(key, len(first))

    keyed = []
    for item in items:
        if item.request is not None:
            key = affinity_key_of(item.request.state_text, item.request.media.images)  # text and images
            state = seen((item.model, key))
            questions = seen((item.model, key, question_set_key(item.request.questions)))
            keyed.append(((seen(item.model), state, questions, item.index), item))
    return [item for _, item in sorted(keyed, key=lambda pair: pair[0])]


@dataclass
class Run:
    """A batch being answered: its items, its time budget, and what stops it."""

    items: list[Item]
    budget: float  # seconds
    max_queue: int | None  # a job's: its requests take their places as they run; None: reserved before (places)
    progress: Progress = field(init=False)
    stop: Signal = field(default_factory=Signal)
    expired: bool = False  # the budget ran out (stop is set then too)

    def __post_init__(self) -> None:
        self.progress = Progress(len(self.items), show=False)
        self.progress.skip(sum(item.result is not None for item in self.items))

    def results(self) -> list[dict[str, Any] | None]:
        return [item.result for item in self.items]

    def errors(self) -> int:
        return sum(item.result is not None and "error" in item.result for item in self.items)


def answer_items(
    run: Run, registry: ModelRegistry, admission: Admission, places: Mapping[str, int] | None = None
) -> None:
    """Answer the run's items one at a time in the scheduled order, each with its turn at its model
    (Admission.turn), until all are answered, the run is stopped, or its budget runs out. A request not
    answered for want of time gets a 504 result; one stopped otherwise (cancelled) keeps None.

    With `places` (each model's, for a batch answered in its response) a place for each request is
    reserved first, all or none (503), here in the worker, which then gives each back: a worker that
    never starts holds none."""
    if places is not None:
        _check(run, registry)
        admission.reserve(per_model(run.items), places)
    deadline = time.monotonic() + run.budget

    def expire() -> None:
        run.expired = True
        admission.stop(run.stop)

    timer = threading.Timer(run.budget, expire)
    timer.daemon = True
    timer.start()
    pending = schedule(run.items)
    try:
        _answer_in_order(pending, run, registry, admission, deadline)
    finally:
        timer.cancel()
        late = 0
        for item in pending:
            if not item.ran and places is not None:
                admission.release(item.model, 1)  # the place reserved for it
            if item.result is None and run.expired:
                timeout = ApiError(504, "timeout", f"not answered within the batch's {run.budget:g} s")
                item.result, late = error_result(timeout), late + 1
            item.request = None  # settled or stopped: nothing reads it again
        run.progress.skip(late)


def _answer_in_order(
    pending: list[Item], run: Run, registry: ModelRegistry, admission: Admission, deadline: float
) -> None:
    """Each item in turn, by one worker; by SIDE_BY_SIDE workers where a model batches requests, so that
    its items wait at once and share its decodes. Until all are answered or the run stops."""
    next_item = iter(pending)
    taking = threading.Lock()
    halted = threading.Event()

    def work() -> None:
        while not halted.is_set():
            with taking:
                item = next(next_item, None)
            if item is None or not _answer_one(item, run, registry, admission, deadline):
                halted.set()

    helpers = [
        threading.Thread(target=work, name=f"batch-worker-{i}", daemon=True)
        for i in range(_workers(pending, registry) - 1)
    ]
    for helper in helpers:
        helper.start()
    work()
    for helper in helpers:  # each ends with its item: the budget's expiry stops the work under way
        helper.join(max(0.0, deadline - time.monotonic()) + JOIN_GRACE_S)
        if helper.is_alive():
            log.warning("a batch worker still runs past the batch's budget")


def _workers(pending: list[Item], registry: ModelRegistry) -> int:
    models = {item.model for item in pending}
    try:
        batching = any(registry.batches_requests(model) for model in models)
    except ModelNotFound:  # a reload took a model away: its items get their 404 one by one
        batching = False
    return SIDE_BY_SIDE if batching else 1


def _check(run: Run, registry: ModelRegistry) -> None:
    """Each request's 422 for its prompt, or 413 over its budget of prompt tokens (ModelRegistry.check), as
    its result, before places are reserved: a request the model cannot answer takes none."""
    for item in run.items:
        if item.request is None:
            continue
        try:
            registry.check(item.model, item.request)
        except (InvalidRequest, ApiError, ModelNotFound) as error:
            item.request, item.result = None, error_result(error)
            run.progress.step()


def _answer_one(item: Item, run: Run, registry: ModelRegistry, admission: Admission, deadline: float) -> bool:
    """The item's result, once it has its turn; False when the run stops first."""
    assert item.request is not None
    try:
        contexts = registry.contexts_of(item.model)
        at_once = contexts * SIDE_BY_SIDE if registry.batches_requests(item.model) else contexts
    except ModelNotFound as error:  # a reload took the model away
        item.result = error_result(error)
        run.progress.step()
        return True
    capacity = None if run.max_queue is None else contexts + run.max_queue
    if not admission.turn(item.model, at_once, capacity, run.stop, deadline):
        return False
    item.ran = True
    try:
        item.result = registry.answer(item.model, item.request, run.stop).wire()
    except Cancelled:
        return False  # stopped: its result is settled with the others'
    except Exception as error:
        item.result = error_result(error)
        if item.result["error"]["status"] == 500:  # a bug: its traceback, as ContainInternalErrors logs one
            log.exception("batch request %d failed", item.index)
    finally:
        admission.done(item.model)
    item.request = None  # answered: a job kept for its results keeps no request's bytes (its images)
    run.progress.step()
    return True
