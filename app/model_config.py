"""The models a server offers: [[models]] entries of the config file, validated as a whole."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.config import ConfigError, Settings, parse_calibration, parse_flash_attn, parse_layout, parse_repack, read_toml

DEFAULT_ALIAS = "jev-latest"  # the SDKs' default model name: always the default model
TEMPLATES = ("auto", "plain")
INTEGER_SETTINGS = (
    "n_ctx",
    "n_gpu_layers",
    "threads",
    "contexts",
    "session_cache_entries",
    "session_cache_tokens",
    "session_cache_disk_bytes",
)


_DEFAULTS = Settings()  # the per-model settings' defaults are the server's, declared once in Settings


@dataclass(frozen=True)
class ModelSpec:
    """One [[models]] entry; unset fields come from the server settings."""

    name: str
    path: Path
    aliases: tuple[str, ...] = ()
    context_path: Path | None = _DEFAULTS.context_path
    n_ctx: int = _DEFAULTS.n_ctx
    n_gpu_layers: int = _DEFAULTS.n_gpu_layers
    threads: int = _DEFAULTS.threads
    contexts: int = _DEFAULTS.contexts
    repack: str = _DEFAULTS.repack
    flash_attn: str = _DEFAULTS.flash_attn
    session_cache_entries: int = _DEFAULTS.session_cache_entries
    session_cache_tokens: int = _DEFAULTS.session_cache_tokens
    session_cache_dir: Path = _DEFAULTS.session_cache_dir
    session_cache_disk_bytes: int = _DEFAULTS.session_cache_disk_bytes
    template: str = "auto"
    calibration: str = _DEFAULTS.calibration
    calibration_temperature: float = _DEFAULTS.calibration_temperature
    layout: str = _DEFAULTS.layout

    @classmethod
    def from_settings(cls, settings: Settings, **overrides: Any) -> ModelSpec:
        values: dict[str, Any] = {
            "name": settings.model_name,
            "path": settings.model,
            "context_path": settings.context_path,
            "n_ctx": settings.n_ctx,
            "n_gpu_layers": settings.n_gpu_layers,
            "threads": settings.threads,
            "contexts": settings.contexts,
            "repack": settings.repack,
            "flash_attn": settings.flash_attn,
            "session_cache_entries": settings.session_cache_entries,
            "session_cache_tokens": settings.session_cache_tokens,
            "session_cache_dir": settings.session_cache_dir,
            "session_cache_disk_bytes": settings.session_cache_disk_bytes,
            "calibration": settings.calibration,
            "calibration_temperature": settings.calibration_temperature,
            "layout": settings.layout,
        }
        values.update(overrides)
        return cls(**values)


@dataclass(frozen=True)
class ModelsConfig:
    models: tuple[ModelSpec, ...]
    default_model: str
    models_max: int


def read_models_config(settings: Settings) -> ModelsConfig:
    """The [[models]] of the config file, or the single model the flags name. Validated whole."""
    entries = read_toml(settings.config).get("models", []) if settings.config is not None else []
    where = str(settings.config)
    if not isinstance(entries, list):
        raise ConfigError(f"{where}: 'models' must be an array of tables ([[models]])")
    specs = [_spec(settings, entry, f"{where}: [[models]] #{i + 1}") for i, entry in enumerate(entries)]
    if not specs:
        specs = [ModelSpec.from_settings(settings)]
    names: dict[str, str] = {}
    for spec in specs:
        for name in (spec.name, *spec.aliases):
            if name in names or name == DEFAULT_ALIAS:
                raise ConfigError(f"{where}: the name {name!r} is used twice (or is the reserved {DEFAULT_ALIAS!r})")
            names[name] = spec.name
    default = settings.default_model or specs[0].name
    if default not in names:
        raise ConfigError(f"{where}: default_model {default!r} is not a configured model or alias")
    if settings.models_max < 1:
        raise ConfigError(f"{where}: models_max must be at least 1")
    return ModelsConfig(tuple(specs), names[default], settings.models_max)


def _spec(settings: Settings, entry: Any, where: str) -> ModelSpec:
    if not isinstance(entry, dict) or not isinstance(entry.get("name"), str) or not isinstance(entry.get("path"), str):
        raise ConfigError(f"{where}: needs a string 'name' and a string 'path'")
    known = set(ModelSpec.__dataclass_fields__)
    unknown = set(entry) - known
    if unknown:
        raise ConfigError(f"{where}: unknown setting(s) {sorted(unknown)}")
    values = dict(entry)
    values["path"] = Path(entry["path"])
    for key in ("context_path", "session_cache_dir"):
        if key in entry:
            values[key] = Path(entry[key])
    aliases = entry.get("aliases", [])
    if not isinstance(aliases, list) or not all(isinstance(a, str) and a for a in aliases):
        raise ConfigError(f"{where}: 'aliases' must be a list of names")
    values["aliases"] = tuple(aliases)
    for key in INTEGER_SETTINGS:
        if key in entry and (not isinstance(entry[key], int) or isinstance(entry[key], bool)):
            raise ConfigError(f"{where}: {key} must be an integer")
    if values.get("template", "auto") not in TEMPLATES:
        raise ConfigError(f"{where}: template must be one of {TEMPLATES}")
    temperature = entry.get("calibration_temperature", 1.0)
    if not isinstance(temperature, int | float) or isinstance(temperature, bool) or temperature <= 0:
        raise ConfigError(f"{where}: calibration_temperature must be a positive number")
    try:
        for key, parse in (
            ("calibration", parse_calibration),
            ("layout", parse_layout),
            ("repack", parse_repack),
            ("flash_attn", parse_flash_attn),
        ):
            parse(values.get(key, getattr(settings, key)))
    except ValueError as error:
        raise ConfigError(f"{where}: {error}") from error
    return ModelSpec.from_settings(settings, **values)
