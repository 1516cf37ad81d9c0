"""bench.servers on the tiny model: the bench serves onepass from this checkout or from another
(an older engine's, with that checkout's own venv), as real server processes."""

from __future__ import annotations

import shutil
from pathlib import Path

import httpx
import llama_cpp
import pytest

from app.paths import REPO_ROOT
from bench.servers import engine_of, onepass_server
from tests.support.skip_groups import skip

MARKER_ENV = "ONEPASS_TEST_CHECKOUT_MARKER"


def other_checkout(at: Path) -> Path:
    """A checkout of onepass at `at`: a copy of this one's app/ that leaves a file behind when it
    is imported, beside this checkout's venv (its python, found through .venv/bin as in a checkout)."""
    shutil.copytree(REPO_ROOT / "app", at / "app", ignore=shutil.ignore_patterns("__pycache__"))
    with (at / "app" / "__init__.py").open("a") as init:
        init.write(f"import os\nopen(os.environ[{MARKER_ENV!r}], 'w').close()\n")
    (at / ".venv").symlink_to(REPO_ROOT / ".venv")
    return at


def test_a_server_from_another_checkout_runs_that_checkouts_code(
    tiny_chat_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not (REPO_ROOT / ".venv" / "bin" / "python").exists():
        skip("checkout-venv", "this checkout has no .venv (make test makes one)")
    marker = tmp_path / "imported"
    monkeypatch.setenv(MARKER_ENV, str(marker))
    checkout = other_checkout(tmp_path / "checkout")

    with onepass_server(tiny_chat_path, "--threads", "1") as (url, _):
        assert httpx.get(url + "/health", timeout=30).status_code == 200
    assert not marker.exists()  # this checkout's own server: the copy's app/ was never imported

    with onepass_server(tiny_chat_path, "--threads", "1", checkout=checkout) as (url, _):
        assert httpx.get(url + "/health", timeout=30).status_code == 200
    assert marker.exists()

    assert engine_of(checkout).startswith(f"{llama_cpp.__version__} ")
