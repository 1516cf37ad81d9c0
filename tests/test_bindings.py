"""The bindings check: onepass runs on its own build of llama-cpp-python (ENGINE_VERSION) and refuses
any other, at start and in the engine, with the command that installs the right one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.engine import bindings
from app.engine.bindings import ENGINE_VERSION, EngineError, installed_problem, version_problem
from app.engine.engine import Engine
from app.paths import REPO_ROOT
from tools import engine_source

STOCK = "0.3.36"  # what `pip install .` resolves from PyPI: the release, without the engine's local part


def test_only_the_engine_build_passes_and_any_other_is_told_the_fix() -> None:
    assert version_problem(ENGINE_VERSION) is None
    for found, said in ((STOCK, f"llama-cpp-python {STOCK} is installed"), (None, "is not installed")):
        problem = version_problem(found)
        assert problem is not None and said in problem
        assert f"not onepass's engine {ENGINE_VERSION}" in problem
        assert "`make setup`" in problem and "pip install --force-reinstall --no-deps" in problem


def test_the_engine_is_what_the_makefile_builds_and_what_is_installed_here() -> None:
    assert engine_source.VERSION == ENGINE_VERSION == "0.3.36+llama.b11549"
    assert installed_problem() is None


def test_the_engine_refuses_bindings_of_another_version(tiny_chat_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bindings.init()
    import llama_cpp

    monkeypatch.setattr(llama_cpp, "__version__", STOCK)
    with pytest.raises(EngineError, match=rf"llama-cpp-python {STOCK} is installed, not onepass's engine"):
        Engine(tiny_chat_path, n_ctx=256, threads=1)


def test_a_server_on_the_stock_release_stops_at_start_naming_the_fix(tiny_chat_path: Path, tmp_path: Path) -> None:
    # The stock release's metadata first on the path: what importlib.metadata reads of a `pip install .`.
    (tmp_path / f"llama_cpp_python-{STOCK}.dist-info").mkdir()
    (tmp_path / f"llama_cpp_python-{STOCK}.dist-info" / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: llama_cpp_python\nVersion: {STOCK}\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("ONEPASS_")} | {"PYTHONPATH": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-m", "app", "-m", str(tiny_chat_path), "--port", "0"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"onepass: llama-cpp-python {STOCK} is installed, not onepass's engine {ENGINE_VERSION}" in done.stderr
    assert "`make setup`" in done.stderr
    assert "listening on" not in done.stderr
