"""The two ASGI middlewares around every route: the API key check, and internal errors contained as 500s."""

from __future__ import annotations

import logging
from typing import Any

from app.http.errors import detail_response
from app.http.runtime import Runtime

log = logging.getLogger("onepass.server")

# Answered without the API key: a load balancer's health checks carry none (llama-server and vLLM
# keep them public too), and readiness tells nothing secret.
PUBLIC_PATHS = frozenset({"/health", "/health/live"})


class RequireApiKey:
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
                await detail_response(401, "authentication_error", message)(scope, receive, send)
                return
        await self.app(scope, receive, send)


class ContainInternalErrors:
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
            await detail_response(500, "internal_error", "internal error; see the server log")(scope, receive, send)
