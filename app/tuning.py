"""Speed settings chosen by measurement on this machine, once, and remembered.

ggml can repack a model's quantized weights into interleaved layouts for the CPU's SIMD
units ("extra buffer types"). Whether that is faster depends on the CPU: on the AVX-512
Xeon this was developed on it was slower, on an AVX2 EPYC 10-15% faster. It changes only
speed and floating-point rounding, never what is computed, so onepass times a prefill of the
model both ways at first start and keeps the faster one. The choice is cached per CPU, per
llama.cpp library and per model file (a JSON file, written atomically, checked when read),
so later starts cost nothing.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from pathlib import Path

from app.build_check import library_files
from app.config import cache_home
from app.cpu import detect
from app.engine import Engine

log = logging.getLogger("onepass.tuning")

SAMPLE = "The customer wrote that the parcel arrived late, the box was damaged and the invoice was wrong. " * 8
SAMPLE_TOKENS = 128
MARGIN = 0.03  # repack must be at least 3% faster to be chosen: below that it is noise


def cache_dir() -> Path:
    return cache_home() / "tuning"


def tuning_key(model_path: Path, threads: int) -> str:
    """What the measurement depends on: the CPU, the llama.cpp build, the model file, the threads."""
    stat = model_path.stat()
    parts = [
        json.dumps(detect().describe(), sort_keys=True),
        *library_files(),
        f"{model_path.resolve()}:{stat.st_size}",
    ]
    parts += [str(stat.st_mtime_ns), str(threads)]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:24]


def prefill_times(model_path: Path, threads: int, rounds: int = 3) -> tuple[float, float]:
    """(plain, repacked): the best of `rounds` prefills of SAMPLE_TOKENS tokens each way.

    Both engines are loaded at once and take turns, so a busy machine (another process on the
    cores) slows both alike instead of whichever happened to run during the burst."""
    engines = [Engine(model_path, n_ctx=512, threads=threads, repack=repack) for repack in (False, True)]
    try:
        tokens = engines[0].tokenize(SAMPLE, add_bos=True)[:SAMPLE_TOKENS]
        best = [float("inf"), float("inf")]
        for _ in range(rounds):
            for i, engine in enumerate(engines):
                began = time.perf_counter()
                engine.prefill(tokens)
                best[i] = min(best[i], (time.perf_counter() - began) * 1000)
        return best[0], best[1]
    finally:
        for engine in engines:
            engine.close()


def read_choice(path: Path) -> bool | None:
    try:
        found = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    choice = found.get("repack") if isinstance(found, dict) else None
    return choice if isinstance(choice, bool) else None  # anything else: measure again


def choose_repack(model_path: Path, threads: int) -> bool:
    """Repacked weights on this machine for this model: measured once, then read from the cache."""
    threads = threads or os.cpu_count() or 1
    path = cache_dir() / f"{tuning_key(model_path, threads)}.json"
    cached = read_choice(path)
    if cached is not None:
        return cached
    plain, repacked = prefill_times(model_path, threads)
    choice = repacked < plain * (1 - MARGIN)
    log.info(
        "%s: prefill of %d tokens %.0f ms plain, %.0f ms repacked: repack %s",
        model_path.name,
        SAMPLE_TOKENS,
        plain,
        repacked,
        "on" if choice else "off",
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    # A name of its own per process: servers started together may all measure and write at once.
    partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
    partial.write_text(json.dumps({"repack": choice, "plain_ms": plain, "repacked_ms": repacked}), encoding="utf-8")
    partial.replace(path)
    return choice
