"""Shared fixtures: tiny GGUFs written per session, services and HTTP clients over real llama.cpp."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from app.answering.service import ModelService
from app.config import Settings
from app.http.server import create_app
from app.platform.tiny_gguf import write_tiny_gguf
from app.serving.known_models import default_model_path
from app.serving.registry import ModelRegistry
from tests.live import RunningServer
from tests.llama_calls import LlamaCalls, count_llama_calls
from tests.loading import load_model

# Every skip names its group; each run ends with one line naming the groups it skipped (tests/skip_groups.py).
pytest_plugins = ["pytester", "tests.skip_groups"]


@pytest.fixture(scope="session")
def tiny_chat_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny-chat.gguf", seed=0)


@pytest.fixture(scope="session")
def tiny_plain_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny-plain.gguf", seed=1, chat_template=None)


# Servers the tests start keep their snapshots out of the user's cache folder, and do not time
# speed settings for the tiny models written each session (tests/test_tuning.py covers that).
os.environ.setdefault("ONEPASS_SESSION_CACHE_DIR", tempfile.mkdtemp(prefix="onepass-test-snapshots-"))
# Nor do they read the fits a user made (onepass calibrate) for the real model: a test that wants fits
# makes them in a folder of its own. Settings built here start from this empty folder (isolated_settings).
FITS_DIR = Path(tempfile.mkdtemp(prefix="onepass-test-fits-"))
os.environ.setdefault("ONEPASS_CALIBRATION_DIR", str(FITS_DIR))
os.environ.setdefault("ONEPASS_REPACK", "off")
os.environ.setdefault("ONEPASS_FLASH_ATTN", "off")
os.environ.setdefault("ONEPASS_THREADS", str(os.cpu_count() or 1))  # as before measured thread counts

# ONEPASS_TEST_GPU_LAYERS=-1 runs the tiny-model tests with every layer offloaded (on a GPU build);
# ONEPASS_TEST_FLASH_ATTN=on with flash attention (docs/gpu.md: what it measured on CUDA).
GPU_LAYERS = int(os.environ.get("ONEPASS_TEST_GPU_LAYERS", "0"))
FLASH_ATTN = os.environ.get("ONEPASS_TEST_FLASH_ATTN", "off")


def isolated_settings(**values: object) -> Settings:
    """Settings as given, over the defaults, except that fits are looked for in the tests' own folder."""
    return Settings(**{"calibration_dir": FITS_DIR, **values})  # type: ignore[arg-type]


def tiny_settings(path: Path, **overrides: object) -> Settings:
    values: dict[str, object] = {
        "model": path,
        "n_ctx": 8192,
        "threads": 1,
        "n_gpu_layers": GPU_LAYERS,
        "repack": "off",
        "flash_attn": FLASH_ATTN,
        "session_cache_disk_bytes": 0,  # the disk tier's own tests turn it on, in a folder of theirs
    }
    values.update(overrides)
    return isolated_settings(**values)


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
        from tests.skip_groups import skip  # here: pytest imports the plugin itself, after this file

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
