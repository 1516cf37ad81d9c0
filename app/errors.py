"""The errors the HTTP edge answers, raised anywhere below it and mapped to responses in app/http/errors.py."""

from __future__ import annotations

from typing import Any


class ApiError(Exception):
    """Answered as {"detail": {"error_type", "message"}} with its status."""

    def __init__(self, status: int, error_type: str, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.error_type, self.message, self.headers = status, error_type, message, headers


class InvalidRequest(Exception):
    """A request the contract refuses: answered 422 with pydantic's list of {"loc", "msg", "type", "input"}."""

    def __init__(self, details: list[dict[str, Any]]) -> None:
        super().__init__(details[0]["msg"] if details else "invalid request")
        self.details = details

    @classmethod
    def at(cls, loc: tuple[str | int, ...], message: str, kind: str, value: Any) -> InvalidRequest:
        """One detail about a request field, e.g. ("state",) or ("questions", qid, "choice", "criteria")."""
        return cls([{"loc": ["body", *loc], "msg": message, "type": kind, "input": value}])


class ModelNotFound(LookupError):
    """A model name or alias this server does not serve: answered 404."""

    def __init__(self, name: str, known: list[str]) -> None:
        super().__init__(f"model {name!r} is not served here; known models: {', '.join(known)}")


class ModelUnavailable(RuntimeError):
    """A configured model that cannot be loaded (missing file, not a GGUF, ...): answered 503."""


class Cancelled(Exception):
    """Work stopped because nobody waits for it any more (timeout, client disconnected)."""
