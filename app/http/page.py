"""The page to try onepass (app/http/static) mounted at /, with its Content-Security-Policy."""

from __future__ import annotations

from pathlib import Path

from starlette.responses import Response
from starlette.routing import Match, Mount
from starlette.staticfiles import StaticFiles
from starlette.types import Scope

PAGE_DIRECTORY = Path(__file__).resolve().parent / "static"
# Everything the page loads comes from this server, and no text it shows can run as code.
PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'none'; base-uri 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


class _PageFiles(StaticFiles):
    async def get_response(self, path: str, scope: Scope) -> Response:
        response = await super().get_response(path, scope)
        response.headers.update(PAGE_HEADERS)
        return response


class Page(Mount):
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
