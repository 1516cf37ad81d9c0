"""The CLI: `python -m app` (or `onepass`) serves System One answers over HTTP."""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

import uvicorn

from app.build_check import run_check
from app.config import DEFAULT_CONFIG_PATH, ConfigError, load_settings
from app.model_config import read_models_config
from app.server import create_app


def main(argv: Sequence[str] | None = None) -> None:
    try:
        settings = load_settings(argv, default_config=DEFAULT_CONFIG_PATH)
        models = read_models_config(settings)  # a config with errors stops us before binding the port
    except (ValueError, ConfigError) as error:  # a malformed ONEPASS_* value or config file
        sys.exit(f"onepass: {error}")
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    default = next(spec for spec in models.models if spec.name == models.default_model)
    if not default.path.is_file():
        sys.exit(f"onepass: model file {default.path} not found (run `make model`, or pass --model PATH)")
    problem = run_check()  # a llama.cpp built for another CPU explains itself here, not with SIGILL later
    if problem is not None:
        sys.exit(problem)
    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level.lower(),
        timeout_graceful_shutdown=int(settings.shutdown_timeout),
    )


if __name__ == "__main__":
    main()
