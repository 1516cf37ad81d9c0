"""Decision GGUFs that take images, for the tests: each type llama.cpp gives images (openjev, pplx-decider,
lfm2-d1, clef, lfm2-d1-omni) on a tiny trunk whose width the tiny projectors of app/platform/tiny_projector.py
project to, with a template that puts the images before the state as llama.cpp's converters do; the
projectors each trunk pairs with (Qwen2-VL's M-RoPE grid needs the qwen2vl text model); PNG fixtures;
and llama-server started with --mmproj."""

from __future__ import annotations

import base64
import socket
import subprocess
import tempfile
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from app.platform.tiny_gguf import write_tiny_gguf
from app.platform.tiny_images import PNG_SIGNATURE, chunk, ihdr, scanlines
from app.platform.tiny_projector import Projector, write_tiny_mmproj
from bench.peer import stop, wait_ready
from tests.support.decision_cases import LABELLED, OPENJEV, TEMPERATURES
from tests.support.tiny_decision import BUILDERS, clef

IMAGES_FIRST = "{% for image in images %}{{ image }}{% endfor %}"
LABEL_TEMPLATES = {"openjev": OPENJEV, "pplx-decider": LABELLED}
# Each type with each projector. libmtmd picks the positions from the text model's rope, not from the
# projector: the llama trunk of the label types lays images out consecutively (qwen2vl's text model for the
# Qwen2-VL projector puts them on an M-RoPE grid), clef's qwen35 trunk puts every image on the grid, and
# lfm2's rope has none, as the real LFM2-VL.
PAIRS: list[tuple[str, Projector]] = [
    (kind, p)
    for kind in (*LABEL_TEMPLATES, "lfm2-d1", "clef", "lfm2-d1-omni")
    for p in ("mlp", "qwen2vl_merger", "gemma3")
]


def image_template(template: str) -> str:
    """A state-first template of tests/test_decision.py with the images at the start of the user turn."""
    return template.replace("<|im_start|>user\n", "<|im_start|>user\n" + IMAGES_FIRST, 1)


def vision_decision_gguf(folder: Path, kind: str, projector: Projector) -> Path:
    """A `kind` decision GGUF whose trunk `projector` pairs with."""
    path = folder / f"{kind}-{projector}.gguf"
    if kind == "clef":  # the tiny clef's scores lie close together: an image would move them too little
        return clef(path, sharpness=40.0)
    if kind not in LABEL_TEMPLATES:
        return BUILDERS[kind](path)
    arch = "qwen2vl" if projector == "qwen2vl_merger" else "llama"
    metadata: dict[str, str | float] = {f"{arch}.decision.type": kind}
    metadata |= {f"{arch}.decision.temperature.{k}": v for k, v in TEMPERATURES.items()}
    template = image_template(LABEL_TEMPLATES[kind])
    return write_tiny_gguf(path, seed=7, systemone=template, metadata=metadata, architecture=arch)


def mmproj(folder: Path, projector: Projector) -> Path:
    path = folder / f"mmproj-{projector}.gguf"
    return path if path.exists() else write_tiny_mmproj(path, projector)


def photo(seed: int, width: int = 64, height: int = 48) -> bytes:
    """An RGB PNG of random pixels, stored uncompressed."""
    pixels = scanlines(width, height, seed=seed)
    return PNG_SIGNATURE + ihdr(width, height) + chunk(b"IDAT", zlib.compress(pixels, 0)) + chunk(b"IEND", b"")


def data_url(image: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(image).decode()


def with_images(state: str, questions: dict[str, Any], images: list[bytes], form: str) -> dict[str, Any]:
    """A request body carrying `images` as llama.cpp takes them: `images` data URLs before a text
    state, or `image_url` parts of a chat-message state."""
    urls = [data_url(image) for image in images]
    if form == "images":
        return {"state": state, "questions": questions, "images": urls}
    parts = [{"type": "image_url", "image_url": {"url": url}} for url in urls]
    message = {"role": "user", "content": [{"type": "text", "text": state}, *parts]}
    return {"state": [message], "questions": questions}


@contextmanager
def llama_server_with_mmproj(
    binary: Path, model: Path, projector: Path, n_ctx: int = 4096, batch: int = 512
) -> Iterator[str]:
    """llama-server on `model` with the vision projector `projector`, set as onepass's tests run: one
    slot, one thread, plain kernels, the projector on the CPU; its URL."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [str(binary), "-m", str(model), "--mmproj", str(projector), "--no-mmproj-offload"]
    command += ["--host", "127.0.0.1", "--port", str(port), "-c", str(n_ctx), "-np", "1", "-b", str(batch)]
    command += ["-ub", str(batch), "-ngl", "0", "-t", "1", "-fa", "off", "--no-repack", "--no-warmup"]
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryFile(mode="w+") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, text=True)
        try:
            wait_ready(url + "/health", process)
            yield url
        finally:
            stop(process)
