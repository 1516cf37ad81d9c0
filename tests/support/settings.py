"""Settings for the tests: servers they start keep their snapshots and fits out of the user's folders,
and a tiny model's settings are small and fixed."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from app.config import Settings

# Servers the tests start keep their snapshots out of the user's cache folder, and do not time
# speed settings for the tiny models written each session (tests/test_tuning.py covers that).
os.environ.setdefault("ONEPASS_SESSION_CACHE_DIR", tempfile.mkdtemp(prefix="onepass-test-snapshots-"))
# Nor do they read the fits a user made (onepass calibrate) for the real model: a test that wants fits
# makes them in a folder of its own. Settings built here start from this empty folder (isolated_settings).
FITS_DIR = Path(tempfile.mkdtemp(prefix="onepass-test-fits-"))
os.environ.setdefault("ONEPASS_CALIBRATION_DIR", str(FITS_DIR))
os.environ.setdefault("ONEPASS_REPACK", "off")
os.environ.setdefault("ONEPASS_FLASH_ATTN", "off")
os.environ.setdefault("ONEPASS_THREADS", str(os.cpu_count() or 1))  # as before measured thread counts

# ONEPASS_TEST_GPU_LAYERS=-1 runs the tiny-model tests with every layer offloaded (on a GPU build);
# ONEPASS_TEST_FLASH_ATTN=on with flash attention (docs/gpu.md: what it measured on CUDA).
GPU_LAYERS = int(os.environ.get("ONEPASS_TEST_GPU_LAYERS", "0"))
FLASH_ATTN = os.environ.get("ONEPASS_TEST_FLASH_ATTN", "off")


def isolated_settings(**values: object) -> Settings:
    """Settings as given, over the defaults, except that fits are looked for in the tests' own folder."""
    return Settings(**{"calibration_dir": FITS_DIR, **values})  # type: ignore[arg-type]


def tiny_settings(path: Path, **overrides: object) -> Settings:
    values: dict[str, object] = {
        "model": path,
        "n_ctx": 8192,
        "threads": 1,
        "n_gpu_layers": GPU_LAYERS,
        "repack": "off",
        "flash_attn": FLASH_ATTN,
        "session_cache_disk_bytes": 0,  # the disk tier's own tests turn it on, in a folder of theirs
    }
    values.update(overrides)
    return isolated_settings(**values)
