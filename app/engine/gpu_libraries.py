"""The CUDA libraries a CUDA build of llama.cpp runs on, when they came as NVIDIA's wheels.

`make setup GPU=cuda` on a machine without a CUDA toolkit compiles against NVIDIA's wheels
(tools/cuda_toolkit.py) and installs their runtime and cuBLAS into the venv, under
site-packages/nvidia/cu13/lib. llama.cpp's CUDA backend links libcudart, libcublas and libcublasLt by
name, and nothing puts that folder on the loader's path, so bindings.init() loads them here, globally,
before it imports llama_cpp: the loader then finds them already in the process. Without a CUDA backend in
the installed llama.cpp, or with a system toolkit, this does nothing.
"""

from __future__ import annotations

import ctypes
import importlib.util
import sys
from pathlib import Path

ORDER = ("libcudart.so", "libcublasLt.so", "libcublas.so")  # each needs the ones before it


def _cuda_build() -> bool:
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        return False
    folder = Path(next(iter(spec.submodule_search_locations))) / "lib"
    return any(folder.glob("libggml-cuda*"))


def wheel_library_folder() -> Path | None:
    """site-packages/nvidia/cu13/lib where it holds the CUDA runtime, else None."""
    for entry in sys.path:
        folder = Path(entry) / "nvidia" / "cu13" / "lib"
        if any(folder.glob("libcudart.so.*")):
            return folder
    return None


def load_cuda_libraries() -> list[Path]:
    """Load the wheels' CUDA libraries for a CUDA build; returns what was loaded."""
    folder = wheel_library_folder() if sys.platform.startswith("linux") and _cuda_build() else None
    if folder is None:
        return []
    loaded = []
    for name in ORDER:
        for path in sorted(folder.glob(f"{name}.*"), key=lambda p: len(p.name))[:1]:
            ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
            loaded.append(path)
    return loaded
