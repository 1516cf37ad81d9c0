"""What the installed llama.cpp can run on: the ggml backends it registered and the devices they found.

llama-cpp-python binds none of ggml's backend registry, so this asks libggml itself, the very file
libllama links (by its soname), after llama.cpp has initialised its backends (bindings.init()): the
answer is what this process loaded, not what the build's file names suggest. A GPU backend with no
device (a Vulkan build without a driver, a CUDA build on a machine without an NVIDIA GPU) lists the
backend and no GPU.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from functools import cache

from app.engine import bindings

# ggml_backend_dev_type: what a device is
KINDS = {0: "cpu", 1: "gpu", 2: "igpu", 3: "accel"}


@dataclass(frozen=True)
class Device:
    name: str  # ggml's: CPU, Vulkan0, CUDA0, Metal, ...
    description: str  # the hardware: the CPU's or the GPU's name
    kind: str  # cpu, gpu, igpu (an integrated GPU), accel

    def __str__(self) -> str:
        return f"{self.name} ({self.description}, {self.kind})"


@cache
def _ggml() -> ctypes.CDLL | None:
    folder = bindings.library_dir()  # loads llama.cpp and registers its backends
    found = [folder / name for name in ("libggml.so.0", "libggml.dylib", "libggml.so") if (folder / name).exists()]
    if not found:
        return None
    lib = ctypes.CDLL(str(found[0]))
    for name, result, arguments in (
        ("ggml_backend_reg_count", ctypes.c_size_t, []),
        ("ggml_backend_reg_get", ctypes.c_void_p, [ctypes.c_size_t]),
        ("ggml_backend_reg_name", ctypes.c_char_p, [ctypes.c_void_p]),
        ("ggml_backend_dev_count", ctypes.c_size_t, []),
        ("ggml_backend_dev_get", ctypes.c_void_p, [ctypes.c_size_t]),
        ("ggml_backend_dev_name", ctypes.c_char_p, [ctypes.c_void_p]),
        ("ggml_backend_dev_description", ctypes.c_char_p, [ctypes.c_void_p]),
        ("ggml_backend_dev_type", ctypes.c_int, [ctypes.c_void_p]),
    ):
        function = getattr(lib, name)
        function.restype, function.argtypes = result, arguments
    return lib


def backends() -> list[str]:
    """The ggml backends this process registered (CPU, Vulkan, CUDA, Metal, BLAS, ...)."""
    lib = _ggml()
    if lib is None:
        return []
    registered = (lib.ggml_backend_reg_get(i) for i in range(lib.ggml_backend_reg_count()))
    return [lib.ggml_backend_reg_name(reg).decode() for reg in registered]


def devices() -> list[Device]:
    """Every device those backends found, in ggml's order."""
    lib = _ggml()
    if lib is None:
        return []
    found = []
    for i in range(lib.ggml_backend_dev_count()):
        device = lib.ggml_backend_dev_get(i)
        found.append(
            Device(
                lib.ggml_backend_dev_name(device).decode(),
                (lib.ggml_backend_dev_description(device) or b"").decode(errors="replace").strip(),
                KINDS.get(lib.ggml_backend_dev_type(device), "unknown"),
            )
        )
    return found


def gpus() -> list[Device]:
    """The devices layers can be offloaded to (discrete or integrated GPUs)."""
    return [device for device in devices() if device.kind in ("gpu", "igpu")]


FIX = (
    "build llama.cpp for your GPU: make setup GPU=cuda (NVIDIA), GPU=metal (Apple silicon) or GPU=vulkan (AMD, "
    "Intel); see docs/gpu.md"
)


# ggml's backends that drive a GPU: one of them loaded with no device is a driver problem, not a CPU build.
GPU_BACKENDS = {"CUDA", "Vulkan", "Metal", "HIP", "SYCL", "MUSA", "CANN", "OpenCL"}


def gpu_layers_problem(n_gpu_layers: int) -> str | None:
    """Why asking for `n_gpu_layers` cannot be met here, or None when it can (or asks for none)."""
    if n_gpu_layers == 0 or gpus():
        return None
    found = backends()
    loaded = ", ".join(found) or "none"
    if bindings.gpu_offload_supported() or set(found) & GPU_BACKENDS:
        return (
            f"n_gpu_layers={n_gpu_layers} asks for GPU layers and this llama.cpp has a GPU backend (backends: "
            f"{loaded}), but it finds no GPU device: check the driver (make doctor lists the devices; a Vulkan "
            "device that is a CPU, such as lavapipe, needs GGML_VK_VISIBLE_DEVICES=0), or set n_gpu_layers = 0"
        )
    return (
        f"n_gpu_layers={n_gpu_layers} asks for GPU layers, but this llama.cpp is a CPU build (backends: {loaded}): "
        f"{FIX}; or set n_gpu_layers = 0"
    )
