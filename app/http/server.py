"""HTTP: Starlette routes, the lifespan that loads the models, one error -> response mapping."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import signal
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Match, Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import Scope

from app.answering.fits import FitStore
from app.answering.service import ModelService
from app.calibrate.jobs import FitJobs
from app.calibrate.runner import ExampleError, parse_examples
from app.config import ConfigError, Settings, SettingsSource, package_version, reload_settings
from app.contract import (
    SystemOneRequest,
    SystemOneResponse,
    errors_for_response,
    limit_errors,
    models_listing,
)
from app.errors import ApiError, Cancelled, InvalidRequest, ModelNotFound, ModelUnavailable
from app.fleet.routing import PREFIX_KEY_HEADER, REPLICA_HEADER, affinity_key, replica_name
from app.http.body import decode_content, parse_json, too_large
from app.http.observability import Metrics, RequestObserver
from app.http.openapi import build_openapi
from app.serving.registry import ModelRegistry
from app.serving.specs import DEFAULT_ALIAS, read_models_config

log = logging.getLogger("onepass.server")

PAGE_DIRECTORY = Path(__file__).resolve().parent / "static"
# Answered without the API key: a load balancer's health checks carry none (llama-server and vLLM
# keep them public too), and readiness tells nothing secret.
PUBLIC_PATHS = frozenset({"/health", "/health/live"})
# Everything the page loads comes from this server, and no text it shows can run as code.
PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'none'; base-uri 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


def read_api_keys(settings: Settings) -> tuple[bytes, ...]:
    keys = [settings.api_key] if settings.api_key else []
    if settings.api_key_file is not None:
        lines = settings.api_key_file.read_text(encoding="utf-8").splitlines()
        keys += [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    return tuple(key.encode() for key in keys)


@dataclass
class Runtime:
    """What the routes share; yielded by the lifespan as request.state.runtime."""

    settings: Settings
    source: SettingsSource | None = None  # the argv and environment the settings came from, for reloads
    registry: ModelRegistry | None = None
    load_error: str | None = None
    loaded: threading.Event = field(default_factory=threading.Event)
    api_keys: tuple[bytes, ...] = ()
    in_flight: dict[str, int] = field(default_factory=dict)  # per model: requests admitted, not yet answered
    fit_jobs: FitJobs = field(default_factory=FitJobs)

    def accepts(self, authorization: bytes) -> bool:
        """Whether an Authorization header's value lets a request in (any value while auth is off)."""
        if not self.api_keys:
            return True  # auth off: an Authorization header is accepted and ignored
        scheme, _, token = authorization.partition(b" ")
        offered = token.strip()
        # compare with every key, in constant time each, so timing says nothing about which matched
        matched = [hmac.compare_digest(offered, key) for key in self.api_keys]
        return scheme.lower() == b"bearer" and any(matched)

    @contextlib.contextmanager
    def admit(self, name: str, contexts: int) -> Any:
        """A place among the requests one model is serving (its `contexts`) or queueing; 503 when full.

        Per model: each model has its own pool of contexts, so a busy model does not turn
        requests for an idle one away."""
        in_flight = self.in_flight.get(name, 0)
        if in_flight >= contexts + self.settings.max_queue:
            raise ApiError(
                503, "overloaded", f"{in_flight} requests in flight for {name}; try again shortly", {"Retry-After": "1"}
            )
        self.in_flight[name] = in_flight + 1  # the event loop is single-threaded: no lock needed
        try:
            yield
        finally:
            self.in_flight[name] -= 1

    def reload(self) -> dict[str, list[str]]:
        """Read the settings again from the same sources (SIGHUP, POST /v1/config/reload) and apply
        them: the models, limits, keys (a server started with -m alone reloads its flags' files, the
        API key file). A bad file changes nothing."""
        registry = self.require_registry()
        if self.source is None:
            raise ApiError(400, "invalid_config", "this server was built without settings sources: nothing to reload")
        try:
            reloaded = reload_settings(self.settings, self.source)
            models = read_models_config(reloaded.settings)
            api_keys = read_api_keys(reloaded.settings)
        except (ConfigError, ValueError, OSError) as error:
            raise ApiError(
                400, "invalid_config", f"config rejected, still serving the previous one: {error}"
            ) from error
        changes = registry.reload(models)
        self.settings, self.api_keys = reloaded.settings, api_keys
        report = {**changes, "settings_changed": reloaded.changed, "needs_restart": reloaded.needs_restart}
        log.info("config reloaded: %s", report)
        return report

    def require_registry(self) -> ModelRegistry:
        if self.registry is not None:
            return self.registry
        if self.load_error is not None:
            raise ApiError(503, "overloaded", f"the model failed to load: {self.load_error}", {"Retry-After": "60"})
        raise ApiError(503, "overloaded", "the model is still loading", {"Retry-After": "5"})

    def metric_sources(self) -> dict[str, Any]:
        models = {}
        if self.registry is not None:
            for name, service in self.registry.loaded().items():
                in_flight = self.in_flight.get(name, 0)
                models[name] = {
                    "tiers": service.cache_stats(),
                    "prefilled_tokens": service.prefilled_tokens,
                    "in_flight": in_flight,
                    "queue_depth": max(0, in_flight - self.registry.contexts_of(name)),
                }
        return {"models": models}


def _runtime_of(request: Request) -> Runtime:
    runtime: Runtime = request.state.runtime
    return runtime


class _RequireApiKey:
    """The one place auth happens: with keys configured, every path but the public ones needs one.

    Public: the probes a load balancer sends without a key (readiness says nothing secret) and the
    page's files, which can do nothing without a key."""

    def __init__(self, app: Any, public: frozenset[str]) -> None:
        self.app = app
        self.public = public

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"].removeprefix(scope.get("root_path", "")) not in self.public:
            runtime: Runtime = scope["state"]["runtime"]
            if not runtime.accepts(dict(scope["headers"]).get(b"authorization", b"")):
                message = "a valid 'Authorization: Bearer <key>' header is required"
                await _detail(401, "authentication_error", message)(scope, receive, send)
                return
        await self.app(scope, receive, send)


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_large(limit, f"the body of {declared} bytes")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large(limit)
        chunks.append(chunk)
    return decode_content(b"".join(chunks), request.headers.get("content-encoding", "identity"), limit)


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
    runtime = _runtime_of(request)
    parsed = _parse_request(parse_json(await _read_body(request, runtime.settings.max_body_bytes)), runtime.settings)
    name = runtime.require_registry().canonical(parsed.model)  # 404 before any work
    observed = request.scope["state"].get("observed", {})
    observed.update(model=name, questions=len(parsed.questions))
    response = await _answer_in_worker(request, runtime, name, parsed)
    observed.update(
        cache=response.x_cache, input_tokens=response.usage.input_tokens, timing_ms=response.x_timing_ms.model_dump()
    )
    # for a proxy in front of several replicas: clients may echo it (deploy/haproxy.cfg hashes it)
    headers = {PREFIX_KEY_HEADER: affinity_key(parsed.state)}
    return Response(response.to_json(), media_type="application/json", headers=headers)


async def list_models(request: Request) -> JSONResponse:
    return JSONResponse(models_listing(_runtime_of(request).require_registry().catalogue()))


async def cache_stats(request: Request) -> JSONResponse:
    registry = _runtime_of(request).require_registry()
    models = {}
    for name, service in registry.loaded().items():
        tiers = service.cache_stats()
        models[name] = {**tiers["state"], "question_sets": tiers["question_set"], "disk": tiers["disk"]}
    return JSONResponse(models)


async def start_fitting(request: Request) -> JSONResponse:
    """POST /v1/calibrations: fit calibrations to the examples in the body, as a background job."""
    runtime = _runtime_of(request)
    payload = parse_json(await _read_body(request, runtime.settings.max_body_bytes))
    if not isinstance(payload, dict) or not isinstance(payload.get("examples"), list):
        raise InvalidRequest.at(("examples",), "a list of examples is required", "missing", None)
    question_set = payload.get("question_set", False)
    if not isinstance(question_set, bool):
        raise InvalidRequest.at(("question_set",), "true or false", "bool_type", question_set)
    registry = runtime.require_registry()
    name = registry.canonical(str(payload.get("model", DEFAULT_ALIAS)))
    try:
        examples = parse_examples(payload["examples"])
    except ExampleError as error:
        raise InvalidRequest.at(("examples",), str(error), "value_error", None) from error

    def lease() -> contextlib.AbstractContextManager[ModelService]:
        return registry.lease(name)

    job = runtime.fit_jobs.start(name, lease, examples, question_set)
    return JSONResponse(job.to_json(), status_code=202, headers={"Location": f"/v1/calibrations/jobs/{job.id}"})


async def fitting_job(request: Request) -> JSONResponse:
    job = _runtime_of(request).fit_jobs.get(request.path_params["id"])
    if job is None:
        raise ApiError(404, "not_found", f"no fitting job {request.path_params['id']!r}")
    return JSONResponse(job.to_json())


def _fits_of(request: Request) -> tuple[str, FitStore]:
    registry = _runtime_of(request).require_registry()
    name = registry.canonical(request.query_params.get("model", DEFAULT_ALIAS))
    with registry.lease(name) as service:
        if service.fits is None:
            raise ApiError(404, "not_found", f"{name} keeps no fits")
        return name, service.fits


async def list_fits(request: Request) -> JSONResponse:
    name, fits = await anyio.to_thread.run_sync(_fits_of, request)
    shown = [{k: v for k, v in record.items() if k != "parsed"} for record in fits.records()]
    return JSONResponse({"model": name, "fits": shown})


async def delete_fit(request: Request) -> JSONResponse:
    name, fits = await anyio.to_thread.run_sync(_fits_of, request)
    if not fits.delete(request.path_params["id"]):
        raise ApiError(404, "not_found", f"{name} has no fit {request.path_params['id']!r}")
    return JSONResponse({"model": name, "deleted": request.path_params["id"]})


async def load_model_route(request: Request) -> JSONResponse:
    registry = _runtime_of(request).require_registry()
    name = registry.canonical(request.path_params["name"])
    await anyio.to_thread.run_sync(registry.load, name)
    return JSONResponse({"name": name, "loaded": True})


async def unload_model_route(request: Request) -> JSONResponse:
    registry = _runtime_of(request).require_registry()
    name = registry.canonical(request.path_params["name"])
    return JSONResponse({"name": name, "unloaded": registry.unload(name)})


async def reload_config(request: Request) -> JSONResponse:
    changes = await anyio.to_thread.run_sync(_runtime_of(request).reload)
    return JSONResponse({"reloaded": True, **changes})


async def health(request: Request) -> JSONResponse:
    runtime = _runtime_of(request)
    if runtime.registry is None:
        status = "loading" if runtime.load_error is None else "failed"
        return JSONResponse({"status": status, "error": runtime.load_error}, status_code=503)
    return JSONResponse({"status": "ok", "model": runtime.registry.default_name})


async def health_live(request: Request) -> JSONResponse:
    return JSONResponse({"status": "ok"})


def _detail(status: int, error_type: str, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"detail": {"error_type": error_type, "message": message}}, status_code=status, headers=headers)


async def _api_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ApiError)
    return _detail(exc.status, exc.error_type, exc.message, exc.headers)


async def _unprocessable(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, InvalidRequest)
    return JSONResponse({"detail": exc.details}, status_code=422)


async def _not_found(request: Request, exc: Exception) -> JSONResponse:
    return _detail(404, "model_not_found", str(exc))


async def _unavailable(request: Request, exc: Exception) -> JSONResponse:
    return _detail(503, "model_unavailable", str(exc), {"Retry-After": "60"})


async def _cancelled(request: Request, exc: Exception) -> JSONResponse:
    return _detail(503, "overloaded", f"the request was dropped before it ran: {exc}", {"Retry-After": "1"})


class _ContainInternalErrors:
    """A bug's exception becomes a 500 in the contract's shape and goes no further.

    Starlette's own handler for `Exception` answers and then re-raises, and the server then
    closes the keep-alive connection, so the client's next request on it fails too.
    """

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        started = False

        async def send_tracked(message: Any) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, send_tracked)
        except Exception:
            log.exception("internal error on %s %s", scope.get("method"), scope.get("path"))
            if started or scope["type"] != "http":
                raise  # a response already began: all we can do is drop the connection
            await _detail(500, "internal_error", "internal error; see the server log")(scope, receive, send)


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HTTPException)
    error_type = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
    return _detail(exc.status_code, error_type, str(exc.detail))


class _PageFiles(StaticFiles):
    async def get_response(self, path: str, scope: Scope) -> Response:
        response = await super().get_response(path, scope)
        response.headers.update(PAGE_HEADERS)
        return response


class _Page(Mount):
    """The page to try onepass (app/http/static) at /, served without the API key: it can do nothing without one.

    It matches its own files only, so every other path keeps the API's answers: a known route
    with another method stays 405, an unknown path the JSON 404."""

    def __init__(self) -> None:
        super().__init__("/", app=_PageFiles(directory=PAGE_DIRECTORY, html=True), name="page")
        files = (path for path in PAGE_DIRECTORY.rglob("*") if path.is_file())
        self.paths = {"/", *("/" + path.relative_to(PAGE_DIRECTORY).as_posix() for path in files)}

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        if scope["type"] == "http" and scope["path"].removeprefix(scope.get("root_path", "")) in self.paths:
            return super().matches(scope)
        return Match.NONE, {}


def _watch_sighup(loop: asyncio.AbstractEventLoop, runtime: Runtime) -> bool:
    """Reload the config on SIGHUP (only possible when the loop runs in the main thread)."""

    def reload_logged() -> None:
        try:
            runtime.reload()
        except ApiError as error:
            log.error("SIGHUP reload: %s", error.message)

    try:
        loop.add_signal_handler(signal.SIGHUP, lambda: loop.run_in_executor(None, reload_logged))
    except (NotImplementedError, RuntimeError, ValueError):
        return False
    return True


def default_loader(settings: Settings) -> ModelRegistry:
    registry = ModelRegistry(read_models_config(settings))
    registry.load(registry.default_name)  # the default model loads at startup, others on first use
    return registry


async def openapi_json(request: Request) -> JSONResponse:
    return JSONResponse(request.app.state.openapi)


async def metrics_text(request: Request) -> Response:
    return Response(request.app.state.metrics.render(), media_type="text/plain; version=0.0.4")


API_ROUTES: list[BaseRoute] = [
    Route("/v1/systemone", systemone, methods=["POST"]),
    Route("/v1/models", list_models, methods=["GET"]),
    Route("/v1/models/{name:path}/load", load_model_route, methods=["POST"]),
    Route("/v1/models/{name:path}/unload", unload_model_route, methods=["POST"]),
    Route("/v1/config/reload", reload_config, methods=["POST"]),
    Route("/v1/cache", cache_stats, methods=["GET"]),
    Route("/v1/calibrations", start_fitting, methods=["POST"]),
    Route("/v1/calibrations", list_fits, methods=["GET"]),
    Route("/v1/calibrations/jobs/{id}", fitting_job, methods=["GET"]),
    Route("/v1/calibrations/{id}", delete_fit, methods=["DELETE"]),
    Route("/metrics", metrics_text, methods=["GET"]),
    Route("/openapi.json", openapi_json, methods=["GET"]),
    Route("/health", health, methods=["GET"]),
    Route("/health/live", health_live, methods=["GET"]),
]
EXCEPTION_HANDLERS: dict[Any, Any] = {
    ApiError: _api_error,
    InvalidRequest: _unprocessable,
    ModelNotFound: _not_found,
    ModelUnavailable: _unavailable,
    Cancelled: _cancelled,
    HTTPException: _http_error,
}


def _lifespan(
    settings: Settings,
    source: SettingsSource | None,
    registry: ModelRegistry | None,
    loader: Callable[[Settings], ModelRegistry],
) -> Callable[[Starlette], contextlib.AbstractAsyncContextManager[dict[str, Any]]]:
    """Start: the runtime, and the models loading in the background unless `registry` is given.
    Stop: fitting jobs cancelled, the models closed."""

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[dict[str, Any]]:
        runtime = Runtime(settings, source, registry, api_keys=read_api_keys(settings))
        app.state.runtime = runtime  # for the metrics, and for tests and embedders to wait on
        thread = None
        if registry is None:

            def load_in_background() -> None:
                try:
                    runtime.registry = loader(settings)
                    log.info("ready: serving %s", runtime.registry.default_name)
                except Exception as error:
                    log.exception("loading the model failed")
                    runtime.load_error = str(error)
                finally:
                    runtime.loaded.set()

            thread = threading.Thread(target=load_in_background, name="onepass-load", daemon=True)
            thread.start()
        else:
            runtime.loaded.set()
        loop = asyncio.get_running_loop()
        hangup = _watch_sighup(loop, runtime)
        try:
            yield {"runtime": runtime}
        finally:
            if hangup:
                loop.remove_signal_handler(signal.SIGHUP)
            runtime.fit_jobs.cancel_all(settings.shutdown_timeout)
            if thread is not None:
                thread.join()
                if runtime.registry is not None:
                    runtime.registry.close()

    return lifespan


def _metric_sources(app: Starlette) -> dict[str, Any]:
    runtime: Runtime | None = getattr(app.state, "runtime", None)  # set by the lifespan
    return runtime.metric_sources() if runtime is not None else {}


def create_app(
    settings: Settings,
    registry: ModelRegistry | None = None,
    loader: Callable[[Settings], ModelRegistry] = default_loader,
    source: SettingsSource | None = None,
    replica: str | None = None,
) -> Starlette:
    """The app. With `registry` it serves that; otherwise the lifespan loads one in the background.

    `source` (where `settings` were read from) lets SIGHUP and POST /v1/config/reload read them again.
    `replica` names this server in every response's X-Onepass-Replica (default: --replica-name, else the
    host name; the CLI adds the port).
    """
    replica = replica or replica_name(settings.replica_name)
    page = None if settings.no_ui else _Page()
    public = PUBLIC_PATHS | (page.paths if page is not None else set())
    metrics = Metrics(lambda: _metric_sources(app))  # read after `app` exists: on a scrape
    app = Starlette(
        routes=API_ROUTES if page is None else [*API_ROUTES, page],
        middleware=[
            Middleware(RequestObserver, metrics=metrics, headers={REPLICA_HEADER: replica}),
            Middleware(_ContainInternalErrors),
            Middleware(_RequireApiKey, public=frozenset(public)),
        ],
        lifespan=_lifespan(settings, source, registry, loader),
        exception_handlers=EXCEPTION_HANDLERS,
    )
    app.state.openapi = build_openapi(package_version())
    app.state.metrics = metrics
    return app
