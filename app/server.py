"""HTTP: Starlette routes, the lifespan that loads the model, one error -> response mapping."""

from __future__ import annotations

import contextlib
import hmac
import json
import logging
import threading
import zlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from app.config import Settings
from app.contract import SystemOneRequest, errors_for_response, validation_error
from app.models import ModelNotFound, ModelRegistry, load_model
from app.service import RequestInvalid

log = logging.getLogger("onepass.server")

try:  # the official SDK compresses bodies with zstd when it can
    from compression.zstd import decompress as zstd_decompress  # type: ignore[import-not-found]
except ImportError:
    from backports.zstd import decompress as zstd_decompress


class ApiError(Exception):
    """An error answered as {"detail": {"error_type", "message"}}."""

    def __init__(self, status: int, error_type: str, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.error_type, self.message, self.headers = status, error_type, message, headers


class Unprocessable(Exception):
    """An error answered as 422 with pydantic's list of details."""

    def __init__(self, details: list[dict[str, Any]]) -> None:
        super().__init__(details[0]["msg"] if details else "invalid request")
        self.details = details


@dataclass
class Runtime:
    """What the routes share; yielded by the lifespan as request.state.runtime."""

    settings: Settings
    registry: ModelRegistry | None = None
    load_error: str | None = None
    loaded: threading.Event = field(default_factory=threading.Event)

    def require_registry(self) -> ModelRegistry:
        if self.registry is not None:
            return self.registry
        if self.load_error is not None:
            raise ApiError(503, "overloaded", f"the model failed to load: {self.load_error}", {"Retry-After": "60"})
        raise ApiError(503, "overloaded", "the model is still loading", {"Retry-After": "5"})


def _authorize(request: Request, settings: Settings) -> None:
    if settings.api_key is None:
        return  # auth off: an Authorization header is accepted and ignored
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), settings.api_key.encode()):
        raise ApiError(401, "authentication_error", "a valid 'Authorization: Bearer <key>' header is required")


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ApiError(413, "request_too_large", f"the body is {declared} bytes; the limit is {limit}")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise ApiError(413, "request_too_large", f"the body exceeds the limit of {limit} bytes")
        chunks.append(chunk)
    return _decode_content(b"".join(chunks), request.headers.get("content-encoding", "identity"), limit)


def _decode_content(body: bytes, encoding: str, limit: int) -> bytes:
    encoding = encoding.strip().lower()
    if encoding in ("", "identity"):
        return body
    try:
        if encoding == "zstd":
            decoded: bytes = zstd_decompress(body)
        elif encoding == "gzip":
            decoded = zlib.decompressobj(wbits=31).decompress(body, limit + 1)
        else:
            raise ApiError(415, "unsupported_media_type", f"Content-Encoding {encoding!r} is not supported")
    except ApiError:
        raise
    except Exception as error:
        raise Unprocessable(
            validation_error((), f"body could not be decompressed: {error}", "value_error", None)
        ) from error
    if len(decoded) > limit:
        raise ApiError(413, "request_too_large", f"the decompressed body exceeds the limit of {limit} bytes")
    return decoded


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not valid JSON")


def _parse_json(body: bytes) -> Any:
    try:
        return json.loads(body, parse_constant=_reject_constant)
    except (ValueError, UnicodeDecodeError) as error:
        raise Unprocessable(
            [
                {
                    "loc": ["body", getattr(error, "pos", 0)],
                    "msg": "JSON decode error",
                    "type": "json_invalid",
                    "input": {},
                    "ctx": {"error": str(error)},
                }
            ]
        ) from error


def _runtime(request: Request) -> Runtime:
    runtime: Runtime = request.state.runtime
    return runtime


async def systemone(request: Request) -> JSONResponse:
    runtime = _runtime(request)
    _authorize(request, runtime.settings)
    payload = _parse_json(await _read_body(request, runtime.settings.max_body_bytes))
    try:
        parsed = SystemOneRequest.model_validate(payload)
    except ValidationError as error:
        raise Unprocessable(errors_for_response(error)) from error
    service = runtime.require_registry().resolve(parsed.model)
    response = await anyio.to_thread.run_sync(service.answer, parsed)
    return JSONResponse(response)


async def list_models(request: Request) -> JSONResponse:
    runtime = _runtime(request)
    _authorize(request, runtime.settings)
    return JSONResponse(runtime.require_registry().listing())


async def cache_stats(request: Request) -> JSONResponse:
    runtime = _runtime(request)
    _authorize(request, runtime.settings)
    registry = runtime.require_registry()
    return JSONResponse({name: registry.resolve(name).cache.stats() for name in [registry.default.name]})


async def health(request: Request) -> JSONResponse:
    runtime = _runtime(request)
    _authorize(request, runtime.settings)
    if runtime.registry is None:
        return JSONResponse(
            {"status": "loading" if runtime.load_error is None else "failed", "error": runtime.load_error},
            status_code=503,
        )
    return JSONResponse({"status": "ok", "model": runtime.registry.default.name})


async def health_live(request: Request) -> JSONResponse:
    return JSONResponse({"status": "ok"})


async def _api_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ApiError)
    return JSONResponse(
        {"detail": {"error_type": exc.error_type, "message": exc.message}},
        status_code=exc.status,
        headers=exc.headers,
    )


async def _unprocessable(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, Unprocessable | RequestInvalid)
    return JSONResponse({"detail": exc.details}, status_code=422)


async def _not_found(request: Request, exc: Exception) -> JSONResponse:
    return JSONResponse({"detail": {"error_type": "model_not_found", "message": str(exc)}}, status_code=404)


async def _internal(request: Request, exc: Exception) -> JSONResponse:
    log.exception("internal error on %s %s", request.method, request.url.path, exc_info=exc)
    return JSONResponse(
        {"detail": {"error_type": "internal_error", "message": "internal error; see the server log"}},
        status_code=500,
    )


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HTTPException)
    error_type = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
    return JSONResponse({"detail": {"error_type": error_type, "message": str(exc.detail)}}, status_code=exc.status_code)


def create_app(
    settings: Settings,
    registry: ModelRegistry | None = None,
    loader: Callable[[Settings], ModelRegistry] | None = None,
) -> Starlette:
    """The app. With `registry` it serves that; otherwise the lifespan loads one in the background."""

    def load() -> ModelRegistry:
        return loader(settings) if loader is not None else ModelRegistry(load_model(settings))

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[dict[str, Any]]:
        runtime = Runtime(settings, registry)
        app.state.runtime = runtime  # for tests and embedders to wait on `loaded`; routes use request.state
        owned = registry is None
        thread = None
        if owned:

            def load_in_background() -> None:
                try:
                    runtime.registry = load()
                except Exception as error:
                    log.exception("loading the model failed")
                    runtime.load_error = str(error)
                finally:
                    runtime.loaded.set()

            thread = threading.Thread(target=load_in_background, name="onepass-load", daemon=True)
            thread.start()
        else:
            runtime.loaded.set()
        try:
            yield {"runtime": runtime}
        finally:
            if thread is not None:
                thread.join()
                if runtime.registry is not None:
                    runtime.registry.close()

    return Starlette(
        routes=[
            Route("/v1/systemone", systemone, methods=["POST"]),
            Route("/v1/models", list_models, methods=["GET"]),
            Route("/v1/cache", cache_stats, methods=["GET"]),
            Route("/health", health, methods=["GET"]),
            Route("/health/live", health_live, methods=["GET"]),
        ],
        lifespan=lifespan,
        exception_handlers={
            ApiError: _api_error,
            Unprocessable: _unprocessable,
            RequestInvalid: _unprocessable,
            ModelNotFound: _not_found,
            HTTPException: _http_error,
            Exception: _internal,
        },
    )
