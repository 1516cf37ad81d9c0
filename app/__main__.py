"""The CLI: `python -m app` (or `onepass`) serves System One answers over HTTP."""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

import uvicorn

from app.config import load_settings
from app.server import create_app


def main(argv: Sequence[str] | None = None) -> None:
    try:
        settings = load_settings(argv)
    except ValueError as error:  # a malformed ONEPASS_* value
        sys.exit(f"onepass: {error}")
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not settings.model.is_file():
        sys.exit(f"onepass: model file {settings.model} not found (run `make model`, or pass --model PATH)")
    uvicorn.run(create_app(settings), host=settings.host, port=settings.port, log_level=settings.log_level.lower())


if __name__ == "__main__":
    main()
