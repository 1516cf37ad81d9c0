"""The GGUFs onepass knows by content (app/known_models.toml) and the settings that belong to each.

A file is known by its bytes, not its name or folder: its size first (free), then its whole-file
blake3 digest, so a renamed copy keeps its fitted settings and a same-named file with other
weights does not get them.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.engine.fingerprint import file_digest
from app.paths import PACKAGE_DIR, REPO_ROOT

KNOWN_MODELS_PATH = PACKAGE_DIR / "known_models.toml"  # package data: an installed onepass reads it too


@dataclass(frozen=True)
class KnownModel:
    key: str  # its table's name in the file ("default", "small")
    filename: str
    size: int
    blake3: str
    settings: dict[str, Any] = field(default_factory=dict)  # per-model settings, as a [[models]] entry writes them


def read_known_models(path: Path = KNOWN_MODELS_PATH) -> tuple[KnownModel, ...]:
    with path.open("rb") as f:
        table = tomllib.load(f)
    return tuple(
        KnownModel(key, entry["filename"], entry["size"], entry["blake3"], dict(entry.get("settings", {})))
        for key, entry in table.items()
    )


def default_model_path() -> Path:
    """In a checkout, where `make model` puts the default model: models/, under its [default] file name."""
    (default,) = [model for model in read_known_models() if model.key == "default"]
    return REPO_ROOT / "models" / default.filename


def identify(path: Path, known: tuple[KnownModel, ...]) -> KnownModel | None:
    """The known model this file is, or None (also for a missing file: loading it reports that)."""
    try:
        size = path.stat().st_size
    except OSError:
        return None
    candidates = [model for model in known if model.size == size]
    if not candidates:
        return None
    digest = file_digest(path).hex()
    return next((model for model in candidates if model.blake3 == digest), None)
