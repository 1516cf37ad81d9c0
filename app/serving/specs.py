"""The models a server offers: [[models]] entries of the config file (or --model alone), validated
as a whole, each with the per-model settings in effect and where each came from."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.config import PER_MODEL_OPTIONS, Settings, parse_path
from app.config_sources import ENV, FLAG, ConfigError, parse_value, read_toml
from app.errors import ModelNotFound
from app.serving.known_models import KnownModel, identify, read_known_models

DEFAULT_ALIAS = "jev-latest"  # the SDKs' default model name: always the default model
ENTRY = "[[models]]"
MODEL_FILE = "model file"  # app/known_models.toml's settings for this file


@dataclass(frozen=True)
class ModelSpec:
    """One model to serve. `settings` holds the per-model settings in effect (Settings' per_model
    fields; its server-wide fields stay at their defaults, so two specs are equal exactly when the
    model would be loaded the same way). `origins`: where each setting that is not a default came from."""

    name: str
    path: Path
    aliases: tuple[str, ...] = ()
    settings: Settings = field(default_factory=Settings)
    known: str | None = None  # the known model file it is (app/known_models.toml), if any
    origins: Mapping[str, str] = field(default_factory=dict, compare=False)

    @classmethod
    def from_settings(cls, settings: Settings) -> ModelSpec:
        """The model --model names, with the given settings as they are (tests, bench)."""
        if settings.model is None:
            raise ConfigError("no model to serve: pass --model FILE.gguf (or --config FILE)")
        values = {f.name: getattr(settings, f.name) for f in PER_MODEL_OPTIONS}
        return cls(settings.model_name, settings.model, settings=Settings(**values))

    @property
    def takes_images(self) -> bool:
        """Whether the model reads images: a vision projector (mmproj) is loaded with it. A request with
        images for a model without one gets a 422 (ModelRegistry.check)."""
        return self.settings.mmproj is not None

    def describe(self) -> dict[str, Any]:
        """The per-model settings as plain JSON values (for /v1/models and the start log)."""
        values: dict[str, Any] = {"path": str(self.path)}
        for option in PER_MODEL_OPTIONS:
            value = getattr(self.settings, option.name)
            values[option.name] = str(value) if isinstance(value, Path) else value
        return values

    def summary(self) -> str:
        """One line for the start log: the file, whether it is a known one, each setting not at its default."""
        known = f" (the known model file {self.known!r})" if self.known else ""
        set_here = ", ".join(
            f"{name}={getattr(self.settings, name)} ({origin})" for name, origin in sorted(self.origins.items())
        )
        return f"{self.name}: {self.path}{known}; settings: {set_here or 'all defaults'}"


@dataclass(frozen=True)
class ModelsConfig:
    models: tuple[ModelSpec, ...]
    default_model: str
    models_max: int

    def names(self) -> dict[str, str]:
        """Every name a client may send (each model's own, its aliases, and jev-latest for the default
        model), and the configured name of the model each means."""
        names = {name: spec.name for spec in self.models for name in (spec.name, *spec.aliases)}
        return {**names, DEFAULT_ALIAS: self.default_model}

    def spec(self, name: str) -> ModelSpec:
        """The model a name means (ModelNotFound for one the config does not offer)."""
        names = self.names()
        if name not in names:
            raise ModelNotFound(name, list(names))
        return next(spec for spec in self.models if spec.name == names[name])


def read_models_config(settings: Settings, known: tuple[KnownModel, ...] | None = None) -> ModelsConfig:
    """The [[models]] of the config file, or the single model the flags name. Validated whole.

    `known`: the known model files (default: app/known_models.toml)."""
    known = read_known_models() if known is None else known
    entries = read_toml(settings.config).get("models", []) if settings.config is not None else []
    where = str(settings.config)
    if not isinstance(entries, list):
        raise ConfigError(f"{where}: 'models' must be an array of tables ([[models]])")
    base = settings.config.resolve().parent if settings.config is not None else None
    specs = [
        _entry_spec(settings, entry, base, known, f"{where}: [[models]] #{i + 1}") for i, entry in enumerate(entries)
    ]
    if not specs:
        if settings.model is None:
            raise ConfigError("no model to serve: pass --model FILE.gguf (or --config FILE with [[models]])")
        specs = [resolve_spec(settings, settings.model_name, settings.model, (), {}, known, "--model")]
    names: dict[str, str] = {}
    for spec in specs:
        for name in (spec.name, *spec.aliases):
            if name in names or name == DEFAULT_ALIAS:
                raise ConfigError(f"{where}: the name {name!r} is used twice (or is the reserved {DEFAULT_ALIAS!r})")
            names[name] = spec.name
    default = settings.default_model or specs[0].name
    if default not in names:
        raise ConfigError(f"{where}: default_model {default!r} is not a configured model or alias")
    return ModelsConfig(tuple(specs), names[default], settings.models_max)


def resolve_spec(
    settings: Settings,
    name: str,
    path: Path,
    aliases: tuple[str, ...],
    entry: Mapping[str, Any],
    known: tuple[KnownModel, ...],
    where: str,
) -> ModelSpec:
    """Each per-model setting from the first source that sets it: a flag, an env var, the model's
    entry, the config's [server] section, the model file's own settings, the default."""
    model = identify(path, known)
    from_file = model.settings if model is not None else {}
    values: dict[str, Any] = {}
    origins: dict[str, str] = {}
    for option in PER_MODEL_OPTIONS:
        origin = settings.origins.get(option.name)
        if origin not in (FLAG, ENV) and option.name in entry:
            values[option.name], origin = entry[option.name], ENTRY
        elif origin is None and option.name in from_file:
            try:
                values[option.name] = parse_value(option, from_file[option.name])
            except ValueError as error:
                raise ConfigError(f"known model {model and model.key!r}: {option.name}: {error}") from error
            origin = MODEL_FILE
        else:
            values[option.name] = getattr(settings, option.name)
        if origin is not None:
            origins[option.name] = origin
    resolved = Settings(**values)
    context = resolved.context_path
    if context is not None and not context.is_file():
        raise ConfigError(f"{where}: context_path {context} is not a file")
    if resolved.mmproj is not None and not resolved.mmproj.is_file():
        raise ConfigError(f"{where}: mmproj {resolved.mmproj} is not a file")
    return ModelSpec(name, path, aliases, resolved, model.key if model is not None else None, origins)


def _entry_spec(
    settings: Settings, entry: Any, base: Path | None, known: tuple[KnownModel, ...], where: str
) -> ModelSpec:
    if not isinstance(entry, dict) or not isinstance(entry.get("name"), str) or not isinstance(entry.get("path"), str):
        raise ConfigError(f"{where}: needs a string 'name' and a string 'path'")
    options = {option.name: option for option in PER_MODEL_OPTIONS}
    unknown = set(entry) - {"name", "path", "aliases", *options}
    if unknown:
        raise ConfigError(f"{where}: unknown setting(s) {sorted(unknown)}")
    aliases = entry.get("aliases", [])
    if not isinstance(aliases, list) or not all(isinstance(a, str) and a for a in aliases):
        raise ConfigError(f"{where}: 'aliases' must be a list of names")
    values: dict[str, Any] = {}
    for key, option in options.items():
        if key in entry:
            try:
                values[key] = parse_value(option, entry[key], base)
            except ValueError as error:
                raise ConfigError(f"{where}: {key}: {error}") from error
    path = parse_path(entry["path"])
    if base is not None and not path.is_absolute():
        path = base / path
    return resolve_spec(settings, entry["name"], path, tuple(aliases), values, known, where)


def replace_settings(spec: ModelSpec, **changes: Any) -> ModelSpec:
    """The spec with some per-model settings changed (tests, bench)."""
    return dataclasses.replace(spec, settings=dataclasses.replace(spec.settings, **changes))
