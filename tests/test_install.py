"""onepass installed as a user installs it: `pip install .` (not editable) into a fresh venv, then the
`onepass` console script started from a folder that is not the checkout, with `-m <gguf>`.

The venv gets llama-cpp-python from the wheel `make setup` built for this CPU (`make test` names its
folder in ONEPASS_TEST_WHEEL_DIR) and the other dependencies from the package index, as a user's would.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from app.fleet.processes import ServerProcess
from app.paths import REPO_ROOT
from tests.support.skip_groups import skip

WHEEL_DIR = os.environ.get("ONEPASS_TEST_WHEEL_DIR")
PACKAGE_FILES = ("pyproject.toml", "README.md", "LICENSE", "app")  # what `pip install .` reads
INSTALL_TIMEOUT_S = 900


def run(argv: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S, check=False
    )


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The venv's bin folder, with onepass installed from a copy of the package's files."""
    if WHEEL_DIR is None:
        skip("install", "ONEPASS_TEST_WHEEL_DIR is not set (make test sets it to the wheel make setup built)")
    wheels = sorted(Path(WHEEL_DIR).glob("llama_cpp_python-*.whl"))
    assert wheels, f"no llama-cpp-python wheel in {WHEEL_DIR}"
    root = tmp_path_factory.mktemp("install")
    source = root / "source"  # a copy: a build writes into the tree it builds
    for name in PACKAGE_FILES:
        if (REPO_ROOT / name).is_dir():
            shutil.copytree(REPO_ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        elif (REPO_ROOT / name).is_file():
            source.mkdir(exist_ok=True)
            shutil.copy(REPO_ROOT / name, source / name)
    venv = root / "venv"
    steps = [
        [sys.executable, "-m", "venv", str(venv)],
        [str(venv / "bin" / "pip"), "install", "-q", "--disable-pip-version-check", str(wheels[-1])],
        [str(venv / "bin" / "pip"), "install", "-q", "--disable-pip-version-check", str(source)],
    ]
    for step in steps:
        done = run(step, root)
        assert done.returncode == 0, f"{step}: {done.stdout}{done.stderr}"
    yield venv / "bin"


@pytest.fixture
def elsewhere(tmp_path: Path) -> Path:
    folder = tmp_path / "somewhere-else"
    folder.mkdir()
    return folder


def clean_env() -> dict[str, str]:
    return {key: value for key, value in os.environ.items() if not key.startswith("ONEPASS_")}


def test_the_installed_package_is_the_venvs_own_copy_not_the_checkout(installed: Path, elsewhere: Path) -> None:
    done = run([str(installed / "python"), "-c", "import app; print(app.__file__)"], elsewhere)
    assert done.returncode == 0, done.stderr
    assert Path(done.stdout.strip()).is_relative_to(installed.parent)


def test_the_console_script_prints_help_and_version_from_any_folder(installed: Path, elsewhere: Path) -> None:
    shown = run([str(installed / "onepass"), "--help"], elsewhere, clean_env())
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith("usage: onepass") and "-m MODEL, --model MODEL" in shown.stdout
    version = run([str(installed / "onepass"), "--version"], elsewhere, clean_env())
    assert version.returncode == 0 and version.stdout.startswith("onepass "), version.stderr


def test_without_a_model_it_says_how_to_name_one(installed: Path, elsewhere: Path) -> None:
    done = run([str(installed / "onepass")], elsewhere, clean_env())
    assert done.returncode != 0
    assert "no model to serve: pass --model FILE.gguf" in done.stderr


def test_the_console_script_serves_a_gguf_named_with_m_from_another_folder(
    installed: Path, elsewhere: Path, tiny_chat_path: Path
) -> None:
    # a path relative to where it is started, as a user types it
    shutil.copyfile(tiny_chat_path, elsewhere / "mine.gguf")
    env = {**clean_env(), "ONEPASS_SESSION_CACHE_DIR": str(elsewhere / "snapshots")}
    server = ServerProcess(
        ["-m", "mine.gguf", "-t", "1", "--repack", "off", "--flash-attn", "off"],
        env=env,
        timeout=120,
        command=[str(installed / "onepass")],
        cwd=elsewhere,
    )
    try:
        server.wait_for("ready: serving mine", timeout=120)
        body = {"model": "jev-latest", "state": "A refund, please.", "questions": {"q": {"type": "noul"}}}
        answered = httpx.post(server.url + "/v1/systemone", json=body, timeout=60)
        assert answered.status_code == 200, answered.text
        assert answered.json()["model"] == "mine" and 0.0 <= answered.json()["answers"]["q"]["noul"] <= 1.0
        assert any("config: none (--model alone)" in line for line in server.lines)
    finally:
        server.stop()


def test_make_run_passes_host_and_port_only_when_given() -> None:
    def run_line(*assignments: str) -> str:
        done = run(["make", "-n", "run", *assignments], REPO_ROOT)
        assert done.returncode == 0, done.stderr
        return next(line for line in done.stdout.splitlines() if "-m app" in line and "fetch" not in line)

    assert "--host" not in run_line() and "--port" not in run_line()  # the config's [server] host and port apply
    assert "--host 0.0.0.0 --port 9000" in run_line("HOST=0.0.0.0", "PORT=9000")


def test_the_readmes_sdk_example_prints_its_answer_after_installing_the_sdk(
    installed: Path, elsewhere: Path, tiny_chat_path: Path
) -> None:
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    (example,) = [block for block in readme.split("```python\n")[1:] if "TypeSafeClient" in block]
    example = example.split("```")[0]
    assert "pip install '.[sdk]'" in readme
    done = run(
        [str(installed / "pip"), "install", "-q", "--disable-pip-version-check", "typesafe-sdk[zstd]>=0.7.5,<0.8"],
        elsewhere,
    )
    assert done.returncode == 0, done.stderr
    env = {**clean_env(), "ONEPASS_SESSION_CACHE_DIR": str(elsewhere / "snapshots")}
    server = ServerProcess(
        ["-m", str(tiny_chat_path), "-t", "1"],
        env=env,
        timeout=120,
        command=[str(installed / "onepass")],
        cwd=elsewhere,
    )
    try:
        server.wait_for("ready: serving", timeout=120)
        script = elsewhere / "example.py"
        script.write_text(example.replace("http://127.0.0.1:8080", server.url), encoding="utf-8")
        printed = run([str(installed / "python"), str(script)], elsewhere, clean_env())
    finally:
        server.stop()
    assert printed.returncode == 0, printed.stderr
    probability, tone = printed.stdout.split()
    assert 0.0 <= float(probability) <= 1.0 and tone in ("calm", "angry")
