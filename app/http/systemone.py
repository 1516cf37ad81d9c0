"""POST /v1/systemone: parse the request, admit it for its model, answer it in a worker thread.

A body with `requests` is a batch (app/http/batch.py): answered in its response when it is small
enough to be admitted whole, else by a job followed at GET /v1/systemone/jobs/{id}."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import anyio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from app.engine.caller import Signal
from app.errors import ApiError, Cancelled, InvalidRequest
from app.fleet.routing import PREFIX_KEY_HEADER, affinity_key_of
from app.http.batch import (
    Item,
    Run,
    answer_items,
    batch_items,
    is_batch,
    parse_items,
    parse_request,
    per_model,
)
from app.http.batch_jobs import BatchWork, batch_job_of
from app.http.body import read_request
from app.http.runtime import Runtime, runtime_of
from app.jobs import BackgroundJob
from app.wire.contract import SystemOneRequest, SystemOneResponse

log = logging.getLogger("onepass.server")


async def _until_disconnected(request: Request, on_disconnect: Callable[[], None], scope: anyio.CancelScope) -> None:
    """With the body read, the next ASGI message is the client going away."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            on_disconnect()
            scope.cancel()
            return


async def _answer_in_worker(
    request: Request, runtime: Runtime, name: str, parsed: SystemOneRequest
) -> SystemOneResponse:
    """The model's answer, computed in a worker thread once admitted: stopped when the client goes
    away (Cancelled) or the request times out (504). Either way the worker stops at its next step,
    and it alone gives the request's place back, when its work has ended: a client that gives up
    frees no place for new work while its own still runs."""
    registry, timeout = runtime.require_registry(), runtime.settings.request_timeout
    cancelled = Signal()
    outcome: dict[str, Any] = {}
    place = runtime.admit(name, registry.contexts_of(name))

    def answer() -> SystemOneResponse:
        if not place.claim():
            raise Cancelled("the client left before the request started")
        try:
            return registry.answer(name, parsed, cancelled)
        finally:
            place.give_back()

    log.debug("request %s admitted for %s", request.headers.get("x-request-id", "-"), name)
    try:
        async with anyio.create_task_group() as group:
            group.start_soon(_until_disconnected, request, cancelled.set, group.cancel_scope)
            try:
                with anyio.fail_after(timeout):
                    outcome["response"] = await anyio.to_thread.run_sync(
                        answer, abandon_on_cancel=True, limiter=runtime.answers
                    )
            except Exception as error:  # raised below, outside the task group that would wrap it
                outcome["error"] = error
            finally:
                group.cancel_scope.cancel()
    finally:
        if "response" not in outcome:
            cancelled.set()  # the worker stops at its next step instead of working for nobody
        place.give_back_unclaimed()
    if isinstance(outcome.get("error"), TimeoutError):
        raise ApiError(504, "timeout", f"no answer within {timeout:g} s")
    if "error" in outcome:
        raise outcome["error"]
    if "response" not in outcome:
        raise Cancelled("the client disconnected")
    response: SystemOneResponse = outcome["response"]
    return response


def _read(payload: Any, parts: dict[str, bytes], runtime: Runtime) -> SystemOneRequest | list[Item]:
    """The body's request, its images read (CRCs, a PNG's pixel data inflated); or a batch's items, each
    read on its own. In the body reader's worker thread, with the decoding and parsing before it."""
    if not is_batch(payload):
        return parse_request(payload, runtime.settings, parts)
    if parts:
        message = "a batch's images come as data_base64 or data URLs, not as parts of a multipart body"
        raise InvalidRequest.at(("requests",), message, "multipart_invalid", None)
    return parse_items(batch_items(payload, runtime.settings), runtime.settings, runtime.canonical)


async def systemone(request: Request) -> Response:
    runtime = runtime_of(request)
    read = await read_request(
        request, runtime.body_limit(), lambda payload, parts: _read(payload, parts, runtime), multipart=True
    )
    if isinstance(read, list):
        return await _batch(request, runtime, read)
    parsed = read
    name = runtime.canonical(parsed.model)  # 404 before any work, also while the models load
    observed = request.scope["state"].get("observed", {})
    observed.update(model=name, questions=len(parsed.questions))
    # 422 for a prompt the model's context cannot hold, before it takes a place a busy model lacks
    await anyio.to_thread.run_sync(runtime.require_registry().check, name, parsed)
    response = await _answer_in_worker(request, runtime, name, parsed)
    observed.update(
        cache=response.x_cache, input_tokens=response.usage.input_tokens, timing_ms=response.x_timing_ms.model_dump()
    )
    # for a proxy in front of several replicas: clients may echo it (deploy/haproxy.cfg hashes it)
    headers = {PREFIX_KEY_HEADER: affinity_key_of(parsed.state_text, parsed.media.images)}
    return Response(response.to_json(), media_type="application/json", headers=headers)


async def _batch(request: Request, runtime: Runtime, items: list[Item]) -> JSONResponse:
    """{"results": [...]} in the request's order, or 202 and a job when the batch is too large to be
    answered in the response (more than max_sync_batch_items, or more for a model than it admits)."""
    settings = runtime.settings
    observed = request.scope["state"].get("observed", {})
    observed.update(batch=len(items))
    wanted = per_model(items)
    if not wanted:  # every request failed validation: their results need no model
        observed.update(errors=len(items))
        return JSONResponse({"results": [item.result for item in items]})
    registry = runtime.require_registry()
    capacity = {name: registry.contexts_of(name) + settings.max_queue for name in wanted}
    if len(items) > settings.max_sync_batch_items or any(wanted[name] > capacity[name] for name in wanted):
        if runtime.batch_jobs.running() >= settings.max_batch_jobs:
            message = f"{settings.max_batch_jobs} batch jobs are running; try again when one has ended"
            raise ApiError(503, "overloaded", message, {"Retry-After": "10"})
        run = Run(items, settings.batch_job_timeout, settings.max_queue)
        job = runtime.batch_jobs.start(BatchWork(run, registry, runtime.admission))
        observed.update(job=job.id)
        location = {"Location": f"/v1/systemone/jobs/{job.id}"}
        return JSONResponse(batch_job_of(job).wire(), status_code=202, headers=location)
    run = Run(items, settings.batch_timeout, None)
    refused: list[ApiError] = []
    async with anyio.create_task_group() as group:
        group.start_soon(_until_disconnected, request, lambda: runtime.admission.stop(run.stop), group.cancel_scope)
        # abandoned only when the client goes away: at its budget the worker stops itself, settling every result
        try:
            await anyio.to_thread.run_sync(
                answer_items,
                run,
                registry,
                runtime.admission,
                capacity,
                abandon_on_cancel=True,
                limiter=runtime.answers,
            )
        except ApiError as error:  # 503: a model lacks the room; raised below, outside the task group
            refused.append(error)
        finally:
            group.cancel_scope.cancel()
    if refused:
        raise refused[0]
    results = run.results()
    if None in results:  # only a disconnect leaves a request unsettled: nobody reads this
        raise Cancelled("the client disconnected")
    observed.update(errors=run.errors())
    return JSONResponse({"results": results})


def _job_of(request: Request) -> BackgroundJob[BatchWork]:
    job = runtime_of(request).batch_jobs.get(request.path_params["id"])
    if job is None:
        raise ApiError(404, "not_found", f"no batch job {request.path_params['id']!r}")
    return job


async def batch_job(request: Request) -> JSONResponse:
    """GET /v1/systemone/jobs/{id}: the job's progress, and its results once it has ended."""
    return JSONResponse(batch_job_of(_job_of(request)).wire())


async def cancel_batch_job(request: Request) -> JSONResponse:
    """DELETE /v1/systemone/jobs/{id}: stop the job at its next step; answered once it has stopped (or
    after request_timeout). Its answered results are kept, the others are null."""
    runtime, job = runtime_of(request), _job_of(request)
    await anyio.to_thread.run_sync(runtime.batch_jobs.cancel, job, runtime.settings.request_timeout)
    return JSONResponse(batch_job_of(job).wire())
