"""/v1/calibrations: fitting jobs started from a user's examples, and the fits a model keeps."""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from typing import Any

import anyio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from app.answering.service import ModelService
from app.calibration import ANY_PROMPT, FitStore
from app.errors import ApiError, InvalidRequest, ModelUnavailable
from app.fitting.examples import ExampleError, UserExample, parse_examples
from app.fitting.jobs import FitWork, calibration_job_of
from app.http.body import read_request
from app.http.runtime import Runtime, runtime_of
from app.serving.loading import fits_folder
from app.serving.specs import DEFAULT_ALIAS


@dataclass(frozen=True)
class _Fitting:
    """A POST /v1/calibrations body, read: the model, its examples, whether to try a question-set fit."""

    model: str
    examples: list[UserExample]
    question_set: bool


def _fitting_of(payload: Any, runtime: Runtime) -> _Fitting:
    """The body's fitting, or a 422 (404 for an unknown model). Its examples' images are read here, in
    the body reader's worker thread."""
    if not isinstance(payload, dict) or not isinstance(payload.get("examples"), list):
        raise InvalidRequest.at(("examples",), "a list of examples is required", "missing", None)
    question_set = payload.get("question_set", False)
    if not isinstance(question_set, bool):
        raise InvalidRequest.at(("question_set",), "true or false", "bool_type", question_set)
    name = runtime.canonical(str(payload.get("model", DEFAULT_ALIAS)))
    try:
        examples = parse_examples(payload["examples"])
    except ExampleError as error:
        raise InvalidRequest.at(("examples",), str(error), "value_error", None) from error
    return _Fitting(name, examples, question_set)


def _room_for_a_fit(runtime: Runtime) -> None:
    """503 while max_fitting_jobs fitting jobs run (a labelling session's count too: all of them answer
    on the model's contexts)."""
    most = runtime.settings.max_fitting_jobs
    if runtime.fit_jobs.running() >= most:
        message = f"{most} fitting jobs are running; try again when one has ended"
        raise ApiError(503, "overloaded", message, {"Retry-After": "10"})


async def start_fitting(request: Request) -> JSONResponse:
    """POST /v1/calibrations: fit calibrations to the examples in the body, as a background job."""
    runtime = runtime_of(request)
    _room_for_a_fit(runtime)  # before the body is read: a refused request costs no parsing
    fitting = await read_request(
        request, runtime.settings.max_body_bytes, lambda payload, _: _fitting_of(payload, runtime)
    )
    registry = runtime.require_registry()
    _room_for_a_fit(runtime)  # again, with no await before the start: no two requests take the last room

    def lease() -> contextlib.AbstractContextManager[ModelService]:
        return registry.lease(fitting.model)

    job = runtime.fit_jobs.start(FitWork(fitting.model, lease, fitting.examples, fitting.question_set))
    location = {"Location": f"/v1/calibrations/jobs/{job.id}"}
    return JSONResponse(calibration_job_of(job).wire(), status_code=202, headers=location)


async def fitting_job(request: Request) -> JSONResponse:
    job = runtime_of(request).fit_jobs.get(request.path_params["id"])
    if job is None:
        raise ApiError(404, "not_found", f"no fitting job {request.path_params['id']!r}")
    return JSONResponse(calibration_job_of(job).wire())


@dataclass(frozen=True)
class _Fits:
    """A model's fits as far as they can be known now: from its FitStore while it is loaded; else from
    the files in its folder, fitted under any prompt (which prompt it is served with is known once it
    is loaded), so that listing or deleting a fit never loads a model (and evicts another)."""

    model: str
    store: FitStore
    loaded: bool


def _fits_of(runtime: Runtime, model: str) -> _Fits:
    """In a worker thread: naming the folder of a model not loaded may hash its file (once per file)."""
    name = runtime.canonical(model)
    registry = runtime.require_registry()
    with registry.lease_if_loaded(name) as service:
        if service is not None:
            if service.calibration.store is None:
                raise ApiError(404, "not_found", f"{name} keeps no fits")
            return _Fits(name, service.calibration.store, loaded=True)
    spec = registry.spec_of(name)
    try:
        folder = fits_folder(spec)
    except OSError as error:  # the model file is gone: its folder cannot be named
        raise ModelUnavailable(f"model {name!r}: cannot read {spec.path}: {error}") from error
    return _Fits(name, FitStore(folder, ANY_PROMPT), loaded=False)


def _json(value: Any) -> bytes:
    """`value` as JSONResponse renders it."""
    return json.dumps(value, ensure_ascii=False, allow_nan=False, indent=None, separators=(",", ":")).encode()


def _listed(runtime: Runtime, model: str) -> bytes:
    """The listing's JSON, rendered a fit at a time: one json.dumps of them all would be a single C call
    that holds the GIL, and so stalls the event loop, for as long as the largest listing takes."""
    fits = _fits_of(runtime, model)
    head = _json({"model": fits.model, "loaded": fits.loaded})[:-1]
    return head + b',"fits":[' + b",".join(_json(r.to_json()) for r in fits.store.records()) + b"]}"


async def list_fits(request: Request) -> Response:
    """GET /v1/calibrations?model=X: every fit file read, and the listing rendered, in a worker thread."""
    runtime = runtime_of(request)
    model = request.query_params.get("model", DEFAULT_ALIAS)
    return Response(await anyio.to_thread.run_sync(_listed, runtime, model), media_type="application/json")


def _deleted(runtime: Runtime, model: str, fit_id: str) -> dict[str, Any]:
    fits = _fits_of(runtime, model)
    if not fits.store.delete(fit_id):
        raise ApiError(404, "not_found", f"{fits.model} has no fit {fit_id!r}")
    return {"model": fits.model, "deleted": fit_id}


async def delete_fit(request: Request) -> JSONResponse:
    runtime = runtime_of(request)
    model = request.query_params.get("model", DEFAULT_ALIAS)
    return JSONResponse(await anyio.to_thread.run_sync(_deleted, runtime, model, request.path_params["id"]))
