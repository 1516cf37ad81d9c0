"""POST /v1/systemone: parse the request, admit it for its model, answer it in a worker thread."""

from __future__ import annotations

import logging
import threading
from typing import Any

import anyio
from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import Response

from app.config import Settings
from app.contract import SystemOneRequest, SystemOneResponse, errors_for_response, limit_errors
from app.errors import ApiError, Cancelled, InvalidRequest
from app.fleet.routing import PREFIX_KEY_HEADER, affinity_key_of
from app.http.body import parse_json, read_body
from app.http.runtime import Runtime, runtime_of

log = logging.getLogger("onepass.server")


async def _until_disconnected(request: Request, cancelled: threading.Event, scope: anyio.CancelScope) -> None:
    """With the body read, the next ASGI message is the client going away."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            cancelled.set()
            scope.cancel()
            return


def _parse_request(payload: Any, settings: Settings) -> SystemOneRequest:
    """The contract's request, or a 422 listing what is wrong with it."""
    try:
        parsed = SystemOneRequest.model_validate(payload)
    except ValidationError as error:
        raise InvalidRequest(errors_for_response(error)) from error
    problems = limit_errors(parsed, settings.max_questions, settings.max_text_chars)
    if problems:
        raise InvalidRequest(problems)
    return parsed


async def _answer_in_worker(
    request: Request, runtime: Runtime, name: str, parsed: SystemOneRequest
) -> SystemOneResponse:
    """The model's answer, computed in a worker thread once admitted: stopped when the client goes
    away (Cancelled) or the request times out (504)."""
    registry, timeout = runtime.require_registry(), runtime.settings.request_timeout
    cancelled = threading.Event()
    outcome: dict[str, Any] = {}
    with runtime.admit(name, registry.contexts_of(name)):
        log.debug("request %s admitted for %s", request.headers.get("x-request-id", "-"), name)
        async with anyio.create_task_group() as group:
            group.start_soon(_until_disconnected, request, cancelled, group.cancel_scope)
            try:
                with anyio.fail_after(timeout):
                    outcome["response"] = await anyio.to_thread.run_sync(
                        registry.answer, name, parsed, cancelled, abandon_on_cancel=True
                    )
            except Exception as error:  # raised below, outside the task group that would wrap it
                outcome["error"] = error
            finally:
                group.cancel_scope.cancel()
    if isinstance(outcome.get("error"), TimeoutError):
        cancelled.set()  # the worker stops at its next step instead of working for nobody
        raise ApiError(504, "timeout", f"no answer within {timeout:g} s")
    if "error" in outcome:
        raise outcome["error"]
    if "response" not in outcome:
        raise Cancelled("the client disconnected")
    response: SystemOneResponse = outcome["response"]
    return response


async def systemone(request: Request) -> Response:
    runtime = runtime_of(request)
    parsed = _parse_request(parse_json(await read_body(request, runtime.settings.max_body_bytes)), runtime.settings)
    name = runtime.require_registry().canonical(parsed.model)  # 404 before any work
    observed = request.scope["state"].get("observed", {})
    observed.update(model=name, questions=len(parsed.questions))
    response = await _answer_in_worker(request, runtime, name, parsed)
    observed.update(
        cache=response.x_cache, input_tokens=response.usage.input_tokens, timing_ms=response.x_timing_ms.model_dump()
    )
    # for a proxy in front of several replicas: clients may echo it (deploy/haproxy.cfg hashes it)
    headers = {PREFIX_KEY_HEADER: affinity_key_of(parsed.state_text)}
    return Response(response.to_json(), media_type="application/json", headers=headers)
