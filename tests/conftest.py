"""Shared fixtures: tiny GGUFs written per session, services and HTTP clients over real llama.cpp."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from app.answering.service import ModelService
from app.http.server import create_app
from app.platform.tiny_gguf import write_tiny_gguf
from app.serving.known_models import default_model_path
from app.serving.registry import ModelRegistry
from tests.support.live import RunningServer
from tests.support.llama_calls import LlamaCalls, count_llama_calls
from tests.support.loading import load_model
from tests.support.settings import isolated_settings, tiny_settings

# Every skip names its group; each run ends with one line naming the groups it skipped (tests/support/skip_groups.py).
pytest_plugins = ["pytester", "tests.support.skip_groups"]


@pytest.fixture(scope="session")
def tiny_chat_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny-chat.gguf", seed=0)


@pytest.fixture(scope="session")
def tiny_plain_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny-plain.gguf", seed=1, chat_template=None)


@pytest.fixture
def llama_calls(monkeypatch: pytest.MonkeyPatch) -> LlamaCalls:
    """The decodes and restores this test makes llama.cpp run, counted at its bindings."""
    return count_llama_calls(monkeypatch)


@pytest.fixture(scope="session")
def tiny_service(tiny_chat_path: Path) -> Iterator[ModelService]:
    service = load_model(tiny_settings(tiny_chat_path))
    yield service
    service.close()


@pytest.fixture(scope="session")
def tiny_plain_service(tiny_plain_path: Path) -> Iterator[ModelService]:
    service = load_model(tiny_settings(tiny_plain_path))
    yield service
    service.close()


@pytest.fixture
def client(tiny_service: ModelService, tiny_chat_path: Path) -> Iterator[TestClient]:
    app = create_app(tiny_settings(tiny_chat_path), registry=ModelRegistry.serving(tiny_service))
    with TestClient(app) as test_client:
        yield test_client


@pytest.fixture(scope="module")
def live_url(tiny_service: ModelService, tiny_chat_path: Path) -> Iterator[str]:
    """A real uvicorn server over the tiny model, for clients that need a socket."""
    running = RunningServer(tiny_settings(tiny_chat_path), ModelRegistry.serving(tiny_service))
    try:
        yield running.base_url
    finally:
        running.stop()


@pytest.fixture(scope="session")
def real_model_path() -> Path:
    if os.environ.get("ONEPASS_SKIP_REAL_MODEL") == "1":
        from tests.support.skip_groups import skip  # here: pytest imports the plugin itself, after this file

        skip("real-model", "ONEPASS_SKIP_REAL_MODEL=1")
    path = default_model_path()
    if not path.is_file():
        pytest.fail(f"{path} is missing: run `make model` (make test does)")
    return path


@pytest.fixture(scope="session")
def real_service(real_model_path: Path) -> Iterator[ModelService]:
    service = load_model(isolated_settings(model=real_model_path, n_ctx=4096, session_cache_disk_bytes=0))
    yield service
    service.close()
