"""The model registry: which names and aliases this server answers for, and loading them."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from app.cache import SnapshotCache
from app.config import Settings
from app.engine import Engine
from app.prompting import Prompter
from app.service import ModelService

log = logging.getLogger("onepass.models")

DEFAULT_ALIAS = "jev-latest"  # the SDKs' default model name: always the default model


class ModelNotFound(LookupError):
    def __init__(self, name: str, known: list[str]) -> None:
        super().__init__(f"model {name!r} is not served here; known models: {', '.join(known)}")


def read_context(path: Path | None) -> str:
    """The system context file's text; a missing file means no context."""
    if path is None or not path.is_file():
        if path is not None:
            log.warning("context file %s not found; serving without a system context", path)
        return ""
    return path.read_text(encoding="utf-8")


def load_model(settings: Settings) -> ModelService:
    engine = Engine(
        settings.model,
        n_ctx=settings.n_ctx,
        n_gpu_layers=settings.n_gpu_layers,
        threads=settings.threads,
        contexts=settings.contexts,
    )
    try:
        prompter = Prompter.for_model(
            engine,
            engine.metadata("tokenizer.chat_template"),
            engine.special_token_text(engine.bos_token),
            engine.special_token_text(engine.eos_token),
            read_context(settings.context_path),
        )
        cache = SnapshotCache(settings.session_cache_entries, settings.session_cache_tokens)
        return ModelService(settings.model_name, engine, prompter, cache, calibration=settings.calibration)
    except BaseException:
        engine.close()
        raise


class ModelRegistry:
    """Resolves request model names; `jev-latest` always means the default model."""

    def __init__(self, default: ModelService, aliases: tuple[str, ...] = (DEFAULT_ALIAS,)) -> None:
        self.default = default
        self._by_name = {default.name: default, **{alias: default for alias in aliases}}

    def resolve(self, name: str) -> ModelService:
        try:
            return self._by_name[name]
        except KeyError:
            raise ModelNotFound(name, self.names()) from None

    def names(self) -> list[str]:
        return list(self._by_name)

    def listing(self) -> dict[str, Any]:
        descriptions = {
            name: f"{service.name}: GGUF served by onepass" + ("" if name == service.name else " (alias)")
            for name, service in self._by_name.items()
        }
        return {
            "object": "list",
            "data": [{"id": name, "object": "model", "owned_by": "onepass"} for name in self._by_name],
            "models": [
                {"name": name, "description": descriptions[name], "release_date": "unknown"} for name in self._by_name
            ],
        }

    def close(self) -> None:
        self.default.close()
