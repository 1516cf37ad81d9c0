"""make check-gpu: load a model with every layer offloaded and print where llama.cpp put them.

python -m app.check_gpu [MODEL.gguf]
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from app.config import DEFAULT_MODEL_PATH
from app.engine import Engine, llama_log

# Lines of llama.cpp's load log that say which device holds what.
PLACEMENT_MARKERS = ("offload", "model buffer size", "KV buffer size", "compute buffer size", "using device")


class _Placement(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if any(marker in message for marker in PLACEMENT_MARKERS):
            self.lines.append(message)


def main() -> None:
    model = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_MODEL_PATH
    placement = _Placement()
    llama_log.addHandler(placement)
    llama_log.setLevel(logging.DEBUG)
    engine = Engine(model, n_ctx=512, n_gpu_layers=-1)
    engine.close()
    print(f"{model.name} with n_gpu_layers=-1:")
    print("\n".join(f"  {line}" for line in placement.lines) or "  (llama.cpp reported no placement)")
    offloaded = [line for line in placement.lines if "offloaded" in line]
    if not offloaded or " 0/" in offloaded[0]:
        print(
            "No layer went to a GPU: this llama-cpp-python is a CPU build "
            '(rebuild with make setup CMAKE_ARGS="-DGGML_CUDA=on" or "-DGGML_METAL=on").'
        )


if __name__ == "__main__":
    main()
