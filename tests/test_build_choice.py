"""The build a user chose stays chosen: `make setup GPU=...` is recorded beside the venv and every later
target builds and installs that one, until the user chooses again.

The first tests read what make would do (make build-info, no build). The last ones run in CI after make
test-gpu (make test-build-choice: ONEPASS_BUILD_CHOICE_VENV names the Vulkan venv it made) and run the
documented commands for real: make run, make check-gpu and make test-gpu (as a dry run: its suite has
just run) leave the Vulkan wheel installed, build nothing and reinstall nothing."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import urllib.request
from pathlib import Path

from app.paths import REPO_ROOT
from tests.support.pipes import read_until
from tests.support.skip_groups import skip_if
from tools.cuda_archs import archs_of

CHOICE_VENV = os.environ.get("ONEPASS_BUILD_CHOICE_VENV")


def make(*args: str, timeout: float = 120, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["make", "--no-print-directory", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def info(*args: str, env: dict[str, str] | None = None) -> dict[str, str]:
    done = make("-s", "build-info", *args, env=env)
    assert done.returncode == 0, done.stderr
    return dict(line.split(": ", 1) for line in done.stdout.splitlines())


def with_nvidia_smi(folder: Path, answer: str, status: int = 0) -> dict[str, str]:
    """The environment with an nvidia-smi first on PATH that prints `answer` and exits with `status`."""
    folder.mkdir(exist_ok=True)
    fake = folder / "nvidia-smi"
    fake.write_text(f"#!/bin/sh\nprintf '%s' '{answer}'\nexit {status}\n")
    fake.chmod(0o755)
    return {**os.environ, "PATH": f"{folder}{os.pathsep}{os.environ['PATH']}"}


def test_compute_capabilities_become_distinct_architectures_lowest_first() -> None:
    assert archs_of("9.0\n") == ["90"]
    assert archs_of("12.0\n8.6\n 8.6 \n10.0\n") == ["86", "100", "120"]
    assert archs_of("[N/A]\n") == [] and archs_of("") == []


def test_a_cuda_build_is_for_this_machines_gpus_where_nvidia_smi_names_them(tmp_path: Path) -> None:
    (tmp_path / "venv").mkdir()
    venv = f"VENV={tmp_path / 'venv'}"
    h200 = with_nvidia_smi(tmp_path / "one", "9.0\n")
    chosen = info(venv, "GPU=cuda", env=h200)
    assert "-DCMAKE_CUDA_ARCHITECTURES=90" in chosen["CMAKE_ARGS"].split()
    assert chosen["CUDA architectures"] == "90 (this machine's GPUs as nvidia-smi reports them)"
    mixed = with_nvidia_smi(tmp_path / "mixed", "8.6\n9.0\n8.6\n")  # several GPUs: their distinct architectures
    assert info(venv, "GPU=cuda", env=mixed)["CUDA architectures"].startswith("86;90 (")
    failing = with_nvidia_smi(tmp_path / "failing", "NVIDIA-SMI has failed", status=9)
    assert info(venv, "GPU=cuda", env=failing)["CUDA architectures"] == (
        "75;80;86;89;90;120 (the default: nvidia-smi reported no GPU)"
    )
    assert info(venv, "GPU=cuda", "CUDA_ARCHS=89", env=h200)["CUDA architectures"] == "89 (given)"  # given wins
    # -n prints the build and the record and runs nothing; an empty wheel cache, so that the build is planned
    # even where this machine has built that wheel before
    planned = make("-n", "setup", venv, "GPU=cuda", f"WHEEL_CACHE={tmp_path / 'wheels'}", env=h200)
    assert planned.returncode == 0, planned.stderr
    assert "CUDA architectures: 90 (this machine's GPUs as nvidia-smi reports them;" in planned.stdout  # the log
    assert "CUDA_ARCHS := %s" in planned.stdout and "'90'" in planned.stdout  # and the record
    (tmp_path / "venv" / "build-choice.mk").write_text("GPU := cuda\nCMAKE_ARGS := \nCUDA_ARCHS := 89\n")
    assert info(venv, env=h200)["CUDA architectures"] == f"89 (recorded in {tmp_path / 'venv'}/build-choice.mk)"
    assert info(venv, "GPU=cuda", env=h200)["CUDA architectures"].startswith("90 (")  # choosing again: this GPU


def test_a_recorded_choice_is_what_later_targets_build(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    venv.mkdir()
    plain = info(f"VENV={venv}")
    assert plain["GPU"] == "cpu" and "GGML_VULKAN" not in plain["CMAKE_ARGS"]
    (venv / "build-choice.mk").write_text("GPU := vulkan\nCMAKE_ARGS := -DGGML_CCACHE=OFF\n")
    chosen = info(f"VENV={venv}")
    assert chosen["GPU"] == "vulkan"
    assert "-DGGML_VULKAN=on -DGGML_CCACHE=OFF" in chosen["CMAKE_ARGS"]  # the user's flags after the GPU's
    assert chosen["wheel"] != plain["wheel"]  # its own wheel, in its own cache folder
    again = info(f"VENV={venv}", "GPU=cuda", "CUDA_ARCHS=89")  # choosing again
    assert again["GPU"] == "cuda" and "-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=89" in again["CMAKE_ARGS"]
    assert again["wheel"] not in (plain["wheel"], chosen["wheel"])


def test_setup_records_the_cuda_architectures_with_the_choice(tmp_path: Path) -> None:
    planned = make("-n", "setup", f"VENV={tmp_path}", "GPU=cuda", "CUDA_ARCHS=90")  # -n: prints, builds nothing
    assert planned.returncode == 0, planned.stderr
    assert "CUDA_ARCHS := %s" in planned.stdout and "'90'" in planned.stdout
    (tmp_path / "build-choice.mk").write_text("GPU := cuda\nCMAKE_ARGS := \nCUDA_ARCHS := 90\n")
    later = info(f"VENV={tmp_path}")  # a later target, no arguments: the recorded architectures
    assert "-DCMAKE_CUDA_ARCHITECTURES=90" in later["CMAKE_ARGS"]
    assert later["wheel"] == info(f"VENV={tmp_path}", "GPU=cuda", "CUDA_ARCHS=90")["wheel"]


def test_an_unknown_choice_and_an_old_python_are_refused_before_anything_is_built(tmp_path: Path) -> None:
    refused = make("-s", "build-info", f"VENV={tmp_path}", "GPU=rocm")
    assert refused.returncode != 0 and "GPU=rocm: choose cpu, cuda, metal or vulkan" in refused.stderr
    old = tmp_path / "python3.10"
    old.write_text("#!/bin/sh\necho 'Python 3.10.12'; exit 0\n")  # a Python that is too old answers every call
    old.chmod(0o755)
    too_old = make("-s", "build-info", f"PYTHON={old}")
    assert too_old.returncode != 0 and "onepass needs Python 3.11 or newer" in too_old.stderr
    assert "PYTHON=python3.12 make run" in too_old.stderr


needs_vulkan_venv = skip_if(
    CHOICE_VENV is None, "build-choice", "run by make test-build-choice, after make test-gpu has built the Vulkan venv"
)


def loaded(output: str, marker: str) -> set[str]:
    """The backends a line of `output` lists after `marker` (up to its end or a semicolon)."""
    (line,) = [line for line in output.splitlines() if marker in line][:1]
    return set(line.split(marker, 1)[1].split(";")[0].split(", "))


def installed(venv: Path) -> dict[str, int]:
    """What a rebuild or reinstall would change: the install stamps and llama.cpp's libraries, by mtime."""
    lib = next((venv / "lib").glob("python3*/site-packages/llama_cpp/lib"))
    files = [*venv.glob(".installed-*"), *lib.iterdir()]
    return {str(path): path.stat().st_mtime_ns for path in files}


@needs_vulkan_venv
def test_make_run_and_check_gpu_keep_the_vulkan_build() -> None:
    assert CHOICE_VENV is not None
    venv = REPO_ROOT / CHOICE_VENV
    assert "GPU := vulkan" in (venv / "build-choice.mk").read_text()
    before = installed(venv)
    assert any("libggml-vulkan" in path for path in before)

    checked = make(f"VENV={CHOICE_VENV}", "check-gpu", timeout=900)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert loaded(checked.stdout, "ggml backends loaded: ") == {"CPU", "Vulkan"}
    assert "check-gpu: every step passed" in checked.stdout

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    small = os.environ["ONEPASS_TEST_SMALL_MODEL"]
    server = subprocess.Popen(
        ["make", "--no-print-directory", f"VENV={CHOICE_VENV}", "run", f"PORT={port}", f"ARGS=-m {small} -ngl -1"],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    assert server.stdout is not None
    output = ""
    try:
        output = read_until(server.stdout, "ready: serving", timeout=600)  # the model is loaded
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=30) as response:
            assert response.status == 200
    finally:
        os.killpg(server.pid, signal.SIGINT)
        output += server.communicate(timeout=60)[0]
    assert loaded(output, "llama.cpp backends: ") == {"CPU", "Vulkan"}, output
    assert "pip install" not in output and "building llama-cpp-python" not in output

    rehearsed = make("-n", f"VENV={CHOICE_VENV}", "test-gpu")
    assert rehearsed.returncode == 0, rehearsed.stderr
    assert "pip wheel" not in rehearsed.stdout and "pip install" not in rehearsed.stdout
    assert installed(venv) == before
