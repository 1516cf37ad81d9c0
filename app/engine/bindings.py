"""llama-cpp-python's bindings: loaded on purpose by `init()`, once, and checked against their library.

No module of app/ loads llama.cpp when it is imported. `init()` does, and whatever runs llama.cpp
calls it first: the engine's constructor, the functions here that ask the library, the ops tools.
It loads the CUDA libraries that a CUDA build made with NVIDIA's wheels links (gpu_libraries.py),
imports llama_cpp, routes llama.cpp's log into Python's logging and initialises its backends. The
engine's modules reach the bindings through `llama` here, which refuses every use before `init()`.
The only module that imports llama_cpp but for the images path (vision.py), which imports its libmtmd
bindings after `init()` (tests/test_layering.py holds both so).

onepass runs on its own build of llama-cpp-python, ENGINE_VERSION: llama-cpp-python's bindings on
the llama.cpp that serves /v1/systemone, assembled by tools/engine_source.py and built by `make
setup`. Its version has a local part naming that llama.cpp, which no package index accepts, so a
release resolved from PyPI (what `pip install .` gets outside `make setup`) never carries it.
`check_bindings` refuses any other build, and bindings that misread their library's structs.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.metadata
import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.engine.gpu_libraries import load_cuda_libraries

__all__ = [  # `llama` among them: named here, since under type checking it is an import
    "DECISION_ORDER_SYMBOLS",
    "ENGINE_VERSION",
    "EngineError",
    "check_bindings",
    "decision_order_setter",
    "gpu_offload_supported",
    "init",
    "installed_problem",
    "library_dir",
    "llama",
    "llama_log",
    "log_callback",
    "set_decision_order",
    "shared_library",
    "shipped_backends",
    "system_info",
    "version",
    "version_problem",
]

ENGINE_VERSION = "0.3.36+llama.b11549"  # tools/engine_source.py assembles it; the Makefile asks it

llama_log = logging.getLogger("onepass.llama")


class EngineError(RuntimeError):
    """llama.cpp refused an operation (load, context, decode), or the installed build is not onepass's."""


_loaded: Any = None  # the llama_cpp module, once init() has imported it
_init_lock = threading.Lock()


class _Bindings:
    """llama_cpp's names, looked up at each use in the module `init()` imported (so a test may
    wrap one of llama_cpp's functions)."""

    def __getattr__(self, name: str) -> Any:
        if _loaded is None:
            raise EngineError("llama.cpp is not loaded: app.engine.bindings.init() loads it")
        return getattr(_loaded, name)


if TYPE_CHECKING:
    import llama_cpp as llama
else:
    llama = _Bindings()


_GGML_LEVELS = {3: logging.WARNING, 4: logging.ERROR}  # ggml_log_level: 1 debug, 2 info, 5 "cont"


def _route_llama_log(level: int, text: bytes, _user_data: ctypes.c_void_p) -> None:
    # llama.cpp logs a lot at load time: keep it at debug unless it warns or fails.
    message = text.decode("utf-8", "replace").rstrip()
    if message:
        llama_log.log(_GGML_LEVELS.get(level, logging.DEBUG), "%s", message)


_log_callback: Any = None  # referenced for the process lifetime: llama.cpp keeps only the pointer


def init() -> None:
    """Load llama.cpp, route its log and initialise its backends; later calls do nothing."""
    global _loaded, _log_callback
    with _init_lock:
        if _loaded is not None:
            return
        # Before llama_cpp is imported: a CUDA build made with NVIDIA's wheels links their libraries
        # by name, and the loader finds them only once they are in the process.
        load_cuda_libraries()
        import llama_cpp

        _log_callback = llama_cpp.llama_log_callback(_route_llama_log)
        llama_cpp.llama_log_set(_log_callback, ctypes.c_void_p(0))
        llama_cpp.llama_backend_init()
        _loaded = llama_cpp


def log_callback() -> Any:
    """The callback that routes llama.cpp's log into Python's logging (libmtmd takes it too)."""
    init()
    return _log_callback


def version_problem(found: str | None) -> str | None:
    """Why llama-cpp-python `found` (None: not installed) is not the engine onepass runs on, or None."""
    if found == ENGINE_VERSION:
        return None
    installed = "llama-cpp-python is not installed" if found is None else f"llama-cpp-python {found} is installed"
    return (
        f"{installed}, not onepass's engine {ENGINE_VERSION} (llama-cpp-python's bindings on the llama.cpp that "
        "serves /v1/systemone, which no package index has): in a checkout, `make setup` builds it into .venv; "
        "elsewhere install the wheel make setup built (pip install --force-reinstall --no-deps "
        "~/.cache/onepass/wheels/<build>/llama_cpp_python-*.whl)"
    )


def installed_problem() -> str | None:
    """version_problem of the installed llama-cpp-python, read from its metadata: nothing is loaded."""
    try:
        found: str | None = importlib.metadata.version("llama-cpp-python")
    except importlib.metadata.PackageNotFoundError:
        found = None
    return version_problem(found)


# What llama.cpp's llama_context_default_params() sets in its trailing fields. Bindings that
# declare the struct otherwise than the library does (a field missing or extra before them) read
# other bytes there: answers would be computed with settings nobody chose, silently.
_DEFAULT_FLAGS = {
    "embeddings": False,
    "offload_kqv": True,
    "no_perf": True,
    "op_offload": True,
    "swa_full": True,
    "kv_unified": False,
}


def check_bindings() -> None:
    """Raise EngineError unless the loaded llama-cpp-python is onepass's engine and its
    llama_context_params is laid out as its libllama fills it in (a wheel built against another
    llama.cpp than its bindings is not)."""
    problem = version_problem(str(llama.__version__))
    if problem is not None:
        raise EngineError(problem)
    params = llama.llama_context_default_params()
    wrong = {name: getattr(params, name) for name, value in _DEFAULT_FLAGS.items() if getattr(params, name) != value}
    if wrong or params.n_outputs_max_per_seq != 1:
        raise EngineError(
            f"llama-cpp-python {llama.__version__} does not match its llama.cpp library ({library_dir()}): "
            f"llama_context_default_params() reads {wrong or {'n_outputs_max_per_seq': params.n_outputs_max_per_seq}}; "
            "build the wheel again (make clean-build; make setup)"
        )


def version() -> str:
    """The installed llama-cpp-python's version."""
    init()
    return str(llama.__version__)


def library_dir() -> Path:
    """The folder of the installed llama.cpp's shared libraries."""
    init()
    return Path(llama.__file__).resolve().parent / "lib"


def shipped_backends() -> list[str]:
    """The ggml backends this build ships (cpu, vulkan, cuda, metal, ...), from its libraries' names:
    a build with a device backend may route ops to it even with no layer offloaded."""
    names = {path.name.split(".")[0].removeprefix("libggml-") for path in library_dir().glob("libggml-*")}
    return sorted(names - {"base"}) or ["unknown"]


def gpu_offload_supported() -> bool:
    """Whether this llama.cpp build has a GPU backend (CUDA, Metal, Vulkan, ...)."""
    init()
    return bool(llama.llama_supports_gpu_offload())


def system_info() -> str:
    """llama.cpp's account of its build: the instruction sets and backends compiled in."""
    init()
    return str(llama.llama_print_system_info().decode("utf-8", "replace").strip())


def shared_library(name: str) -> ctypes.CDLL:
    """One of the build's shared libraries by its base name ("ggml-base"), found as llama_cpp finds its own."""
    init()
    from llama_cpp._ctypes_extensions import load_shared_library

    library: ctypes.CDLL = load_shared_library(name, library_dir())
    return library


# The one call a joint decision head (clef) needs beyond llama.h: declared in llama.cpp's staging
# C++ header (src/llama-ext.h), so exported under its C++ name; a build without it cannot serve clef.
DECISION_ORDER_SYMBOLS = (
    "llama_batch_ext_set_decision_order",
    "_Z34llama_batch_ext_set_decision_orderP15llama_batch_exti20llama_decision_order",
)


@functools.cache
def decision_order_setter() -> Callable[[ctypes.c_void_p, int, int], bool] | None:
    """llama_batch_ext_set_decision_order, bound by its exported name; None when this build has none."""
    for path in sorted(library_dir().glob("*llama.*")):
        if path.suffix not in (".so", ".dylib", ".dll"):
            continue
        library = ctypes.CDLL(str(path))  # the loaded library again: the same handle
        for name in DECISION_ORDER_SYMBOLS:
            function = getattr(library, name, None)
            if function is not None:
                function.argtypes = [ctypes.c_void_p, ctypes.c_int32, ctypes.c_int]
                function.restype = ctypes.c_bool
                return function  # type: ignore[no-any-return]
    return None


def set_decision_order(batch: ctypes.c_void_p, index: int, order: int) -> bool:
    """Give token `index` of a whole-prompt batch its decision order; False when llama.cpp refuses it."""
    setter = decision_order_setter()
    if setter is None:
        raise EngineError(f"this llama.cpp build ({library_dir()}) has no {DECISION_ORDER_SYMBOLS[0]}")
    return bool(setter(batch, index, order))
