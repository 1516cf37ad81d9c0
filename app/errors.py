"""The two error shapes of the contract, raised anywhere and turned into responses in server.py."""

from __future__ import annotations

from typing import Any


class ApiError(Exception):
    """Answered as {"detail": {"error_type", "message"}} with its status."""

    def __init__(self, status: int, error_type: str, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.error_type, self.message, self.headers = status, error_type, message, headers


class Unprocessable(Exception):
    """Answered as 422 with pydantic's list of {"loc", "msg", "type", "input"} details."""

    def __init__(self, details: list[dict[str, Any]]) -> None:
        super().__init__(details[0]["msg"] if details else "invalid request")
        self.details = details


class Cancelled(Exception):
    """Work stopped because nobody waits for it any more (timeout, client disconnected)."""
