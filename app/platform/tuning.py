"""Speed settings chosen by measurement on this machine, once, and remembered.

Three llama.cpp settings change only speed and floating-point rounding, never what is computed,
and which is faster depends on the CPU and the build:
- the thread count: one per core (llama.cpp's default) or one per CPU where cores run two
  hyperthreads or there are efficiency cores; measured only where the two counts differ;
- repacked weights: ggml can repack a model's quantized weights into interleaved layouts for
  the CPU's SIMD units ("extra buffer types"); on the AVX-512 Xeon this was developed on that
  was slower, on an AVX2 EPYC 10-15% faster;
- flash attention: a fused attention kernel; on that Xeon it prefilled 8-12% faster.
onepass times a prefill of the model each way at first start and keeps the faster one. Each
choice is cached per CPU, per llama.cpp library and per model file (a JSON file, written
atomically, checked when read), so later starts cost nothing.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

from app.engine.engine import Engine
from app.engine.snapshot import Prefix
from app.paths import KEEP_RECORDS, REPO_ROOT, cache_home, prune_records
from app.platform.build_check import library_files
from app.platform.cpu import detect, thread_counts

log = logging.getLogger("onepass.tuning")

SAMPLE = "The customer wrote that the parcel arrived late, the box was damaged and the invoice was wrong. " * 16
# Tokens prefilled per timing. Attention's share of the work grows with the length, so flash
# attention is timed on a longer prefill (what it gained at each length: docs/performance.md).
SAMPLE_TOKENS = {"threads": 128, "repack": 128, "flash_attn": 256}
MARGIN = 0.03  # a setting leaves its default only when the other way is faster by more than run-to-run noise
# The defaults: repacked weights were much slower on the AVX-512 development machine, so off unless
# measured faster. Flash attention was faster in every measurement (it is llama.cpp's own default
# too), but on a busy VM often by less than the margin, so on unless measured slower.
DEFAULT = {"repack": False, "flash_attn": True}


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


def prefill_times(model_path: Path, variants: list[dict[str, Any]], n_tokens: int, rounds: int = 3) -> list[float]:
    """The best of `rounds` prefills of `n_tokens` tokens with each variant's Engine settings.

    The engines are loaded at once and take turns, so a busy machine (another process on the
    cores) slows all alike instead of whichever happened to run during the burst."""
    engines = [Engine(model_path, n_ctx=512, **variant) for variant in variants]
    try:
        prefix = Prefix(tuple(engines[0].vocab.tokenize(SAMPLE, add_bos=True)[:n_tokens]))
        best = [float("inf")] * len(engines)
        for _ in range(rounds):
            for i, engine in enumerate(engines):
                began = time.perf_counter()
                engine.prefill(prefix)
                best[i] = min(best[i], (time.perf_counter() - began) * 1000)
        return best
    finally:
        for engine in engines:
            engine.close()


def read_record(path: Path) -> dict[str, Any] | None:
    """A stored measurement, or None when it is missing or not one (then it is measured again)."""
    try:
        found = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(found, dict) or not isinstance(found.get("on"), bool):
        return None
    with contextlib.suppress(OSError):  # used now: the newest in prune_records' order (least recently used goes first)
        os.utime(path)
    return found


def record_path(model_path: Path, threads: int, setting: str, fixed: dict[str, bool]) -> Path:
    named = "".join(f"-{name}={int(value)}" for name, value in sorted(fixed.items()))
    return cache_dir() / f"{tuning_key(model_path, threads or os.cpu_count() or 1)}-{setting}{named}.json"


def threads_record_path(model_path: Path, cores: int, cpus: int) -> Path:
    """Where the choice between one thread per core and one per CPU is kept (the key's threads: 0, "auto")."""
    return cache_dir() / f"{tuning_key(model_path, 0)}-threads-{cores}-{cpus}.json"


def choose(model_path: Path, threads: int, setting: str, fixed: dict[str, bool] | None = None) -> bool:
    """Whether the Engine setting `setting` ("repack" or "flash_attn") is on for this model on this
    machine, with the other settings as in `fixed`: measured once, then read from the cache."""
    fixed = fixed or {}
    variants = [{"threads": threads, **fixed, setting: False}, {"threads": threads, **fixed, setting: True}]
    path = record_path(model_path, threads, setting, fixed)
    return timed_choice(model_path, path, setting, variants, DEFAULT[setting])


def choose_threads(model_path: Path) -> int:
    """Threads per decode for this model here: one per core, or one per CPU where that is at
    least 3% faster. Where the counts are equal there is nothing to choose or measure."""
    cores, cpus = thread_counts()
    if cores == cpus:
        return cpus
    variants = [{"threads": cores}, {"threads": cpus}]
    per_cpu = timed_choice(model_path, threads_record_path(model_path, cores, cpus), "threads", variants, False)
    return cpus if per_cpu else cores


def timed_choice(model_path: Path, path: Path, setting: str, variants: list[dict[str, Any]], default: bool) -> bool:
    """Whether the second of two Engine variants ("on") is the one to use, read from the record at
    `path`, or timed once and recorded: it leaves `default` only when the other way is faster by
    MARGIN."""
    cached = read_record(path)
    if cached is not None:
        return bool(cached["on"])
    log.info("%s: timing %s both ways, once for this machine and build", model_path.name, setting)
    off, on = prefill_times(model_path, variants, SAMPLE_TOKENS[setting])
    choice = on <= off * (1 + MARGIN) if default else on < off * (1 - MARGIN)
    log.info(
        "%s: prefill of %d tokens %.0f ms with %s, %.0f ms with %s: chose %s",
        model_path.name,
        SAMPLE_TOKENS[setting],
        off,
        variants[0],
        on,
        variants[1],
        variants[1] if choice else variants[0],
    )
    write_record(path, {"on": choice, "off_ms": off, "on_ms": on})
    return choice


def write_record(path: Path, record: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    # A name of its own per process: servers started together may all measure and write at once.
    partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
    partial.write_text(json.dumps(record), encoding="utf-8")
    partial.replace(path)
    prune_records(path.parent, KEEP_RECORDS)


def describe(model_path: Path, threads: int = 0) -> str:
    """What `auto` chose for this model here, from the cache alone (nothing is measured)."""
    parts = []
    cores, cpus = thread_counts()
    if threads == 0 and cores == cpus:
        threads = cpus  # as choose_threads resolves it
    elif threads == 0:
        found = read_record(threads_record_path(model_path, cores, cpus))
        if found is None:
            return f"threads ({cores} cores, {cpus} CPUs) not measured yet"
        threads = cpus if found["on"] else cores
        parts.append(f"{threads} threads ({found['off_ms']:.0f} ms with {cores}, {found['on_ms']:.0f} ms with {cpus})")
    fixed: dict[str, bool] = {}
    for setting in ("repack", "flash_attn"):
        found = read_record(record_path(model_path, threads, setting, fixed))
        if found is None:
            parts.append(f"{setting} not measured yet")
            break
        times = f"{found.get('off_ms', 0):.0f} ms off, {found.get('on_ms', 0):.0f} ms on"
        parts.append(f"{setting} {'on' if found['on'] else 'off'} ({times})")
        fixed[setting] = bool(found["on"])
    return "; ".join(parts)


def main() -> None:
    """python -m app.platform.tuning: what was chosen for each model in models/, for `make doctor`."""
    for path in sorted((REPO_ROOT / "models").glob("*.gguf")):
        print(f"{path.name}: {describe(path)}")


if __name__ == "__main__":
    main()
