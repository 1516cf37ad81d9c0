"""Every exception the edge answers (app/errors.py's and Starlette's HTTPException), mapped to its response."""

from __future__ import annotations

from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse

from app.errors import ApiError, Cancelled, InvalidRequest, ModelNotFound, ModelUnavailable


def detail_response(status: int, error_type: str, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"detail": {"error_type": error_type, "message": message}}, status_code=status, headers=headers)


async def _api_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ApiError)
    return detail_response(exc.status, exc.error_type, exc.message, exc.headers)


async def _invalid_request(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, InvalidRequest)
    return JSONResponse({"detail": exc.details}, status_code=422)


async def _not_found(request: Request, exc: Exception) -> JSONResponse:
    return detail_response(404, "model_not_found", str(exc))


async def _unavailable(request: Request, exc: Exception) -> JSONResponse:
    return detail_response(503, "model_unavailable", str(exc), {"Retry-After": "60"})


async def _cancelled(request: Request, exc: Exception) -> JSONResponse:
    return detail_response(503, "overloaded", f"the request was dropped before it ran: {exc}", {"Retry-After": "1"})


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HTTPException)
    error_type = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
    return detail_response(exc.status_code, error_type, str(exc.detail))


EXCEPTION_HANDLERS: dict[Any, Any] = {
    ApiError: _api_error,
    InvalidRequest: _invalid_request,
    ModelNotFound: _not_found,
    ModelUnavailable: _unavailable,
    Cancelled: _cancelled,
    HTTPException: _http_error,
}
