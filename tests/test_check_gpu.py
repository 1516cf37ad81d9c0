"""make check-gpu names the step that failed or hung: a run can never again end with no word."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.engine import bindings, devices
from app.engine.devices import backends, gpus
from app.engine.engine import Engine
from app.paths import REPO_ROOT
from tests.support.skip_groups import skip_if


def run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)


def test_a_step_that_outlives_its_timeout_is_named_with_its_stack() -> None:
    done = run(
        "import threading\nfrom tools.check_gpu import Steps\nsteps = Steps(0.5)\n"
        "with steps.step('context creation'):\n    threading.Event().wait(60)  # a call that never returns\n"
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "[start] context creation" in done.stdout
    assert "FAILED: step 'context creation' did not finish in 0.5 s (it hangs)" in done.stdout
    assert "File " in done.stdout  # the Python stack of the hung step


def test_a_step_that_raises_is_named_with_its_error() -> None:
    done = run(
        "from tools.check_gpu import Steps\nwith Steps(30).step('one decode'):\n    raise RuntimeError('no device')\n"
    )
    assert done.returncode == 1
    assert "FAILED: step 'one decode': RuntimeError: no device" in done.stdout


def test_every_step_runs_and_reports_on_the_tiny_model(tiny_chat_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tools.check_gpu", str(tiny_chat_path), "--timeout", "120"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    started = [line for line in done.stdout.splitlines() if line.startswith("[start]")]
    finished = [line for line in done.stdout.splitlines() if line.startswith("[done]")]
    assert len(started) == len(finished) == 9, done.stdout + done.stderr
    assert "bit-identity" in started[-1] and "identical" in done.stdout
    assert "KV buffer size" in done.stdout  # where llama.cpp put the KV cache
    assert f"ggml backends loaded: {', '.join(backends())}" in done.stdout
    if gpus():
        assert done.returncode == 0 and "check-gpu: every step passed" in done.stdout
    else:  # every step ran, on the CPU: that is not a GPU check passing
        assert done.returncode == 1 and "FAILED: no layer went to a GPU" in done.stdout
        assert "make setup GPU=cuda" in done.stdout


def test_the_build_identity_names_the_ggml_backends_it_ships(tiny_chat_path: Path) -> None:
    engine = Engine(tiny_chat_path, n_ctx=256, threads=1)
    try:
        assert "cpu" in bindings.shipped_backends()
        assert f"ggml backends {'+'.join(bindings.shipped_backends())}; n_gpu_layers=0;" in engine.build
    finally:
        engine.close()


@skip_if(bool(gpus()), "cpu-build", "this build has a GPU device: the layers have somewhere to go")
def test_asking_for_gpu_layers_without_a_gpu_stops_the_server_at_start_with_the_fix(tiny_chat_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ONEPASS_")}
    done = subprocess.run(
        [sys.executable, "-m", "app", "-m", str(tiny_chat_path), "--n-gpu-layers", "-1", "--port", "0"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "n_gpu_layers=-1 asks for GPU layers, but this llama.cpp is a CPU build (backends: CPU)" in done.stderr
    assert "make setup GPU=cuda" in done.stderr and "or set n_gpu_layers = 0" in done.stderr
    assert "listening on" not in done.stderr


def test_a_gpu_backend_without_a_device_is_named_a_driver_problem(monkeypatch: pytest.MonkeyPatch) -> None:
    # A CUDA build on a machine without the NVIDIA driver loads the CUDA backend and finds no device.
    monkeypatch.setattr(devices, "backends", lambda: ["CUDA", "CPU"])
    monkeypatch.setattr(devices, "gpus", lambda: [])
    monkeypatch.setattr(bindings, "gpu_offload_supported", lambda: False)
    problem = devices.gpu_layers_problem(-1)
    assert problem is not None and "has a GPU backend (backends: CUDA, CPU), but it finds no GPU device" in problem
    monkeypatch.setattr(devices, "backends", lambda: ["CPU"])
    problem = devices.gpu_layers_problem(-1)
    assert problem is not None and "is a CPU build (backends: CPU)" in problem
    assert devices.gpu_layers_problem(0) is None
