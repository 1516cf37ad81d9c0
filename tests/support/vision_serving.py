"""A tiny text model served with a tiny projector for the tests of image states: the app around it, its
answers' numbers exactly as JSON writes them, how many images its vision path has encoded."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from starlette.testclient import TestClient

from app.answering.service import ModelService
from app.http.server import create_app
from app.serving.registry import ModelRegistry
from app.serving.specs import ModelsConfig, ModelSpec
from tests.support.settings import tiny_settings

NAME = "eyes"


@contextmanager
def served(
    text: Path, mmproj: Path, folder: Path | None = None, **settings: Any
) -> Iterator[tuple[TestClient, ModelService]]:
    """An app serving the text model with the projector; `folder`: its disk tier's."""
    disk = {"session_cache_dir": folder, "session_cache_disk_bytes": 1 << 30} if folder is not None else {}
    spec = ModelSpec(NAME, text, settings=tiny_settings(text, mmproj=mmproj, **disk, **settings))
    registry = ModelRegistry(ModelsConfig((spec,), NAME, 1))
    try:
        with TestClient(create_app(spec.settings, registry=registry)) as client:
            registry.load(NAME)
            yield client, registry.loaded()[NAME]
    finally:
        registry.close()  # the disk tier's queued writes are finished first


def numbers(answered: dict[str, Any]) -> str:
    """The answers, exactly: every float as JSON writes it."""
    return json.dumps(answered["answers"], sort_keys=True)


def encodes(service: ModelService) -> int:
    assert service.engine.vision is not None
    return service.engine.vision.encodes
