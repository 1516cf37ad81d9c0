"""Every exception the edge answers (app/errors.py's and Starlette's HTTPException), mapped to its response.

`error_of` is the one mapping: a request's error response and a batch request's error result are both
made from it."""

from __future__ import annotations

from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Match

from app.errors import ApiError, Cancelled, InvalidRequest, ModelNotFound, ModelUnavailable

INTERNAL_ERROR = {"error_type": "internal_error", "message": "internal error; see the server log"}


def detail_response(status: int, error_type: str, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"detail": {"error_type": error_type, "message": message}}, status_code=status, headers=headers)


def error_of(exc: Exception) -> tuple[int, Any, dict[str, str] | None]:
    """The status, the `detail` (a 422's list, else {"error_type", "message"}) and the headers `exc` is
    answered with; anything unforeseen is a 500 whose message says only where to look."""
    if isinstance(exc, ApiError):
        return exc.status, {"error_type": exc.error_type, "message": exc.message}, exc.headers
    if isinstance(exc, InvalidRequest):
        return 422, exc.details, None
    if isinstance(exc, ModelNotFound):
        return 404, {"error_type": "model_not_found", "message": str(exc)}, None
    if isinstance(exc, ModelUnavailable):
        return 503, {"error_type": "model_unavailable", "message": str(exc)}, {"Retry-After": "60"}
    if isinstance(exc, Cancelled):
        message = f"the request was dropped before it ran: {exc}"
        return 503, {"error_type": "overloaded", "message": message}, {"Retry-After": "1"}
    if isinstance(exc, HTTPException):
        error_type = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        headers = dict(exc.headers) if exc.headers else None
        return exc.status_code, {"error_type": error_type, "message": str(exc.detail)}, headers
    return 500, dict(INTERNAL_ERROR), None


def allowed_methods(request: Request) -> str:
    """RFC 9110's Allow for a 405: every method the path has. Starlette's names only the methods of the
    first route whose path matched, and a path may have a route per method."""
    methods: set[str] = set()
    for route in request.app.router.routes:
        match, _ = route.matches(request.scope)
        if match != Match.NONE:
            methods |= getattr(route, "methods", None) or set()
    return ", ".join(sorted(methods))


async def _answer(request: Request, exc: Exception) -> JSONResponse:
    status, detail, headers = error_of(exc)
    if status == 405:
        headers = {**(headers or {}), "Allow": allowed_methods(request)}
    return JSONResponse({"detail": detail}, status_code=status, headers=headers)


EXCEPTION_HANDLERS: dict[Any, Any] = {
    kind: _answer for kind in (ApiError, InvalidRequest, ModelNotFound, ModelUnavailable, Cancelled, HTTPException)
}
