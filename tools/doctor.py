"""make doctor: what a bug report needs, in one page of plain text.

OS, Python, the CPU and its features, the llama.cpp build (its system info, backends, GPU
offload), whether it decodes on this CPU, the wheel in use, the models present and verified, and
the speed settings measured for them on this machine.

Runs with any Python 3.11 (standard library only here); everything about llama.cpp is
asked of the virtual environment's Python in a subprocess, so a crashing build is reported,
not fatal.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import platform
import subprocess
import sys
from pathlib import Path

from app.paths import REPO_ROOT
from app.platform.cpu import cmake_args, detect

# Run inside the venv: llama.cpp's own account of the build, and what this process loaded.
LLAMA_INFO = """
import json
from app.engine import bindings
from app.engine.devices import backends, devices
bindings.init()
print(json.dumps({
    "llama_cpp_python": bindings.version(),
    "system_info": bindings.system_info(),
    "backends": backends(),
    "devices": [str(device) for device in devices()],
    "gpu_offload": bindings.gpu_offload_supported(),
    "engine_problem": bindings.installed_problem(),
}))
"""


def _venv_python(venv: Path) -> Path | None:
    python = venv / "bin" / "python"
    return python if python.is_file() else None


def llama_section(venv: Path) -> list[str]:
    python = _venv_python(venv)
    if python is None:
        return [f"  no virtual environment at {venv}: run `make setup`"]
    done = subprocess.run(
        [str(python), "-c", LLAMA_INFO], capture_output=True, text=True, timeout=120, check=False, cwd=REPO_ROOT
    )
    if done.returncode != 0:
        return [
            f"  importing llama_cpp failed (exit {done.returncode}):",
            *[f"  | {x}" for x in done.stderr.splitlines()[-5:]],
        ]
    info = json.loads(done.stdout.strip().splitlines()[-1])
    lines = [f"  llama-cpp-python {info['llama_cpp_python']}", f"  system info: {info['system_info']}"]
    if info["engine_problem"]:
        lines.insert(1, f"  {info['engine_problem']}")
    lines.append(f"  ggml backends loaded: {', '.join(info['backends']) or '(none)'}")
    lines.append(f"  devices: {'; '.join(info['devices']) or '(none listed)'}")
    lines.append(f"  GPU offload supported: {'yes' if info['gpu_offload'] else 'no (a CPU build)'}")
    return lines


def module_section(venv: Path, module: str, timeout: int) -> list[str]:
    """What `python -m module` prints in the virtual environment, indented."""
    python = _venv_python(venv)
    if python is None:
        return ["  (no virtual environment)"]
    done = subprocess.run(
        [str(python), "-m", module], capture_output=True, text=True, timeout=timeout, cwd=REPO_ROOT, check=False
    )
    return [f"  {line}" for line in (done.stdout + done.stderr).strip().splitlines()] or ["  (nothing)"]


def wheel_section(venv: Path, wheel_dir: Path | None) -> list[str]:
    lines = []
    record = venv / "llama-build.json"
    if record.is_file():
        built = json.loads(record.read_text(encoding="utf-8"))
        lines.append(f"  built for: {built.get('arch')} {' '.join(built.get('features', []))}")
        lines.append(f"  GPU: {built.get('gpu', 'cpu')} (make setup GPU=...; recorded in {venv / 'build-choice.mk'})")
        lines.append(f"  CMAKE_ARGS: {built.get('cmake_args')}")
    else:
        lines.append(f"  {record} missing: llama-cpp-python was not installed by `make setup`")
    if wheel_dir is not None:
        wheels = sorted(wheel_dir.glob("*.whl"))
        lines.append(f"  wheel for this machine: {wheels[0] if wheels else f'not built yet ({wheel_dir})'}")
    return lines


def models_section() -> list[str]:
    spec = importlib.util.spec_from_file_location("onepass_fetch", REPO_ROOT / "models" / "fetch.py")
    assert spec is not None and spec.loader is not None
    fetch = sys.modules["onepass_fetch"] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fetch)  # models/fetch.py: standard library only, not a package

    sources = fetch.read_sources()
    lines = []
    for key, source in sources.items():
        path = REPO_ROOT / "models" / source.filename
        if not path.is_file():
            state = f"absent (make {'model' if key == 'default' else 'model-small'})"
        else:
            state = "verified (size and sha256)" if fetch.is_verified(path, source) else "PRESENT BUT DOES NOT VERIFY"
        lines.append(f"  {source.filename}: {state}")
    known = {source.filename for source in sources.values()}
    made = {sources["default"].filename.removesuffix(".gguf") + "-decision.gguf"}  # the Makefile's DECISION_MODEL
    others = sorted(p.name for p in (REPO_ROOT / "models").glob("*.gguf") if p.name not in known)
    lines += [
        f"  {name}: "
        + ("made from the default model (make model-decision)" if name in made else "(your own; not checked)")
        for name in others
    ]
    return lines


def report(venv: Path, wheel_dir: Path | None) -> str:
    cpu = detect()
    sections = {
        "system": [f"  {platform.platform()}", f"  Python {sys.version.split()[0]} ({sys.executable})"],
        "cpu": [
            f"  {cpu.model} ({cpu.arch}, {cpu.system})",
            f"  features: {' '.join(sorted(cpu.features)) or '(none of the ones llama.cpp builds for)'}",
            f"  build flags for it: {' '.join(cmake_args(cpu))}",
        ],
        "llama.cpp": llama_section(venv),
        "build check": module_section(venv, "app.platform.build_check", timeout=600),
        "wheel": wheel_section(venv, wheel_dir),
        "models": models_section(),
        "speed settings chosen (threads, repacked weights, flash attention)": module_section(
            venv, "app.platform.tuning", timeout=120
        ),
    }
    return "\n".join(f"{title}:\n" + "\n".join(lines) for title, lines in sections.items())


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tools.doctor", description=__doc__.splitlines()[0])
    parser.add_argument("--venv", type=Path, default=REPO_ROOT / ".venv")
    parser.add_argument("--wheel-dir", type=Path, default=None, help="this machine's wheel folder (the Makefile's)")
    args = parser.parse_args()
    print(report(args.venv, args.wheel_dir))


if __name__ == "__main__":
    main()
