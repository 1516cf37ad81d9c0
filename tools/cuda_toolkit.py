"""The CUDA toolkit a `make setup GPU=cuda` build compiles with: this machine's, or one put together from
NVIDIA's wheels on the package index. Standard library only (the Makefile runs it with any Python).

    python tools/cuda_toolkit.py --cache DIR --record FILE   # prints the CMake flags; says which on stderr
    python tools/cuda_toolkit.py --runtime-of FILE           # the wheels a build made with NVIDIA's wheels runs on

A system toolkit counts when it has nvcc and cuBLAS (headers and library): CUDA_HOME, CUDA_PATH, the
nvcc on PATH, /usr/local/cuda, /opt/cuda, in that order. Otherwise the compiler, runtime and cuBLAS
wheels below are installed into DIR (once; about 1 GB) and used as a toolkit: they lay out one
(bin, include, lib) under nvidia/cu13. The runtime and cuBLAS wheels are then also what the built
library needs when it runs, so `make setup` installs those into the venv (app/engine/bindings.py loads
them before llama.cpp).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

# CUDA 13.0: Turing (sm_75) and newer; a driver of 580 or newer runs what it builds.
COMPILER_WHEELS = (
    "nvidia-cuda-nvcc==13.0.88",
    "nvidia-cuda-crt==13.0.88",
    "nvidia-nvvm==13.0.88",
    "nvidia-cuda-cccl==13.0.85",
)
RUNTIME_WHEELS = ("nvidia-cuda-runtime==13.0.96", "nvidia-cublas==13.0.2.14")
WHEEL_ROOT = Path("nvidia") / "cu13"  # where those wheels put the toolkit, under the install folder
LINKED = ("libcudart", "libcublas", "libcublasLt")  # CMake's FindCUDAToolkit looks for their unversioned names


def say(text: str) -> None:
    print(f"  CUDA toolkit: {text}", file=sys.stderr, flush=True)


def complete(root: Path) -> bool:
    """Whether `root` holds what ggml's CUDA backend builds with: nvcc, and cuBLAS's header and library."""
    libraries = [root / "lib64", root / "lib", root / "targets" / "x86_64-linux" / "lib"]
    headers = [root / "include", root / "targets" / "x86_64-linux" / "include"]
    return (
        (root / "bin" / "nvcc").is_file()
        and any((folder / "cublas_v2.h").is_file() for folder in headers)
        and any(folder.glob("libcublas.so*") for folder in libraries if folder.is_dir())
    )


def has_driver_stub(root: Path) -> bool:
    """Whether `root` has the CUDA driver's link stub (libcuda.so in a stubs folder), which ggml links
    for its virtual-memory pool. A toolkit installed with the driver has it; NVIDIA's wheels do not."""
    return any((root / lib / "stubs" / "libcuda.so").is_file() for lib in ("lib64", "lib", "targets/x86_64-linux/lib"))


def system_toolkit() -> Path | None:
    candidates = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")]
    nvcc = shutil.which("nvcc")
    if nvcc:
        candidates.append(str(Path(nvcc).resolve().parent.parent))
    candidates += ["/usr/local/cuda", "/opt/cuda"]
    for candidate in candidates:
        if candidate and complete(Path(candidate).resolve()):
            return Path(candidate).resolve()
    return None


def nvcc_version(nvcc: Path) -> str:
    done = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True, check=False)
    lines = [line for line in done.stdout.splitlines() if "release" in line]
    return lines[0].strip() if lines else "version unknown"


def wheel_toolkit(cache: Path) -> Path:
    """The toolkit from NVIDIA's wheels, installed under `cache` once (a folder per set of versions)."""
    wheels = (*COMPILER_WHEELS, *RUNTIME_WHEELS)
    folder = cache / "-".join(w.replace("==", "-") for w in wheels)[:120]
    root = folder / WHEEL_ROOT
    if not (folder / ".complete").is_file():
        say(f"installing {' '.join(wheels)} into {folder}")
        shutil.rmtree(folder, ignore_errors=True)
        command = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(folder), *wheels]
        if subprocess.run(command, check=False).returncode != 0:
            sys.exit("tools/cuda_toolkit.py: installing the CUDA wheels failed (see above)")
        lib = root / "lib"
        for name in LINKED:
            versioned = sorted(lib.glob(f"{name}.so.*"), key=lambda p: len(p.name))
            if versioned and not (lib / f"{name}.so").exists():
                (lib / f"{name}.so").symlink_to(versioned[0].name)
        if not (root / "lib64").exists():
            (root / "lib64").symlink_to("lib")
        if not complete(root):
            sys.exit(f"tools/cuda_toolkit.py: the wheels in {folder} do not make a toolkit (nvcc, cuBLAS)")
        (folder / ".complete").touch()
    return root


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--cache", type=Path, help="where a toolkit from wheels is installed")
    parser.add_argument("--record", type=Path, help="a JSON file saying which toolkit was used")
    parser.add_argument("--runtime-of", type=Path, help="print the runtime wheels a recorded build needs")
    args = parser.parse_args()
    if args.runtime_of is not None:
        record = json.loads(args.runtime_of.read_text(encoding="utf-8"))
        print(" ".join(record.get("runtime_wheels", [])))
        return
    if args.cache is None:
        parser.error("--cache is required")
    root = system_toolkit()
    runtime: tuple[str, ...] = ()
    if root is not None:
        source = "this machine's"
    else:
        root, source, runtime = wheel_toolkit(args.cache), "NVIDIA's wheels", RUNTIME_WHEELS
    version = nvcc_version(root / "bin" / "nvcc")
    say(f"{source}, {root} ({version})")
    flags = [f"-DCUDAToolkit_ROOT={root}", f"-DCMAKE_CUDA_COMPILER={root / 'bin' / 'nvcc'}"]
    vmm = has_driver_stub(root)
    if not vmm:
        # Without the stub ggml cannot link the driver at build time; its plain memory pool needs none.
        say("no driver stub (lib64/stubs/libcuda.so): built with GGML_CUDA_NO_VMM (ggml's plain memory pool)")
        flags.append("-DGGML_CUDA_NO_VMM=ON")
    if args.record is not None:
        record = {
            "source": source,
            "root": str(root),
            "nvcc": version,
            "runtime_wheels": list(runtime),
            "virtual_memory_pool": vmm,
        }
        args.record.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    print(" ".join(flags))


if __name__ == "__main__":
    main()
