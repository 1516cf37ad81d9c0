"""Where settings come from: the command line, ONEPASS_<FLAG> env vars and a config file's [server]
section, loaded into one `Settings` (app/config.py declares it) and loaded again on reload, over
the same sources, so that precedence holds across a reload (a flag still beats the file).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import textwrap
import tomllib
from collections.abc import Callable, Mapping, Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from app.config import ENV_PREFIX, OPTIONS, Settings, env_var, flag, parse_bool
from app.paths import REPO_ROOT

# In a checkout: the CLI reads this config by default (`make model` puts the default model beside it).
DEFAULT_CONFIG_PATH = REPO_ROOT / "models" / "onepass.toml"

# Where a setting's value came from, for the start log and for a [[models]] entry to know what it may override.
FLAG, ENV, SERVER_SECTION = "flag", "env", "[server]"


class ConfigError(ValueError):
    """A config file that cannot be used; the message says where and why."""


def package_version() -> str:
    try:
        return version("onepass")
    except PackageNotFoundError:
        return "0"


def _argparse_type(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """argparse prints an ArgumentTypeError's words; for a ValueError only the function's name."""

    def convert(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from error

    return convert


class _HelpFormatter(argparse.HelpFormatter):
    """Wraps help text at spaces only: a flag or variable named in it stays whole at any terminal width."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False, break_long_words=False)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="onepass",
        formatter_class=_HelpFormatter,
        # the subcommand app/__main__.py dispatches before these flags are parsed
        usage="onepass [-h] [--version] [FLAG VALUE ...]\n       onepass calibrate EXAMPLES.jsonl [FLAG VALUE ...]"
        "\n       onepass label STATES.jsonl [FLAG VALUE ...]",
        description="Serve System One answers (POST /v1/systemone) from a local GGUF model. "
        "`onepass calibrate EXAMPLES.jsonl` fits calibrations to your labelled examples and stores them where the "
        "server finds them; `onepass label STATES.jsonl` serves with a labelling session: label the states in the "
        "page's Label tab and the fits follow. The flags below choose the model and settings of all three; "
        "`onepass calibrate -h` and `onepass label -h` list their own options (docs/calibration.md).",
        epilog=f"Every flag can also be set by an environment variable {ENV_PREFIX}<FLAG>, e.g. ONEPASS_N_CTX=4096, "
        "and in a config file's [server] section; the starred ones also per model, in a [[models]] entry. "
        "Precedence: flag > env > [[models]] entry > [server] > the model file's own settings > default.",
        allow_abbrev=False,
    )
    parser.add_argument("--version", action="version", version=f"onepass {package_version()}")
    for field in OPTIONS:
        switch: dict[str, Any] = {"nargs": "?", "const": True} if field.metadata["parse"] is parse_bool else {}
        star = "* " if field.metadata["per_model"] else ""
        parser.add_argument(
            *field.metadata["aliases"],
            flag(field.name),
            dest=field.name,
            metavar=field.name.upper(),
            type=_argparse_type(field.metadata["parse"]),
            default=argparse.SUPPRESS,
            help=f"{star}{field.metadata['help']} [env {env_var(field.name)}; default {field.default}]",
            **switch,
        )
    return parser


def parse_value(field: dataclasses.Field[Any], value: Any, base: Path | None = None) -> Any:
    """A config file's value for `field`, through the same parser as the flag's text; a relative path
    is relative to the config file's folder `base`."""
    if isinstance(value, dict | list):
        raise ValueError(f"expected a single value, not {value!r}")
    text = ("true" if value else "false") if isinstance(value, bool) else str(value)
    parsed = field.metadata["parse"](text)
    if isinstance(parsed, Path) and base is not None and not parsed.is_absolute():
        parsed = base.resolve() / parsed
    return parsed


def load_settings(
    argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None, default_config: Path | None = None
) -> Settings:
    """Flags > env vars > the config file's [server] section > defaults (a [[models]] entry sits between
    the env vars and [server]; see app/serving/specs.py).

    `default_config` is used when it exists and neither a config nor a model was named.
    """
    environ = os.environ if environ is None else environ
    from_env: dict[str, Any] = {}
    for field in OPTIONS:
        raw = environ.get(env_var(field.name))
        if raw is not None:
            try:
                from_env[field.name] = field.metadata["parse"](raw)
            except ValueError as error:
                raise ValueError(f"{env_var(field.name)}={raw!r}: {error}") from error
    from_flags = vars(build_parser().parse_args(argv))
    given = {**from_env, **from_flags}
    config = given.get("config")  # an explicit empty --config means none
    if "config" not in given and "model" not in given and default_config is not None and default_config.is_file():
        config = default_config  # --model alone serves that one file, without the default config
    from_file = server_section(config) if config is not None else {}
    origins = {
        **dict.fromkeys(from_file, SERVER_SECTION),
        **dict.fromkeys(from_env, ENV),
        **dict.fromkeys(from_flags, FLAG),
    }
    return Settings(**{**from_file, **from_env, **from_flags, "config": config, "origins": origins})


@dataclasses.dataclass(frozen=True)
class SettingsSource:
    """Where a server's settings came from (its argv and environment at start), to read them again."""

    argv: tuple[str, ...] = ()
    environ: Mapping[str, str] = dataclasses.field(default_factory=dict)
    default_config: Path | None = None

    def load(self) -> Settings:
        return load_settings(self.argv, self.environ, self.default_config)


@dataclasses.dataclass(frozen=True)
class SettingsReload:
    """What a reload gives: the settings to run with, and which changed now or wait for a restart."""

    settings: Settings  # what the server runs with now
    changed: list[str]  # settings that took effect
    needs_restart: list[str]  # settings that changed in the sources but keep their old value until a restart


def reload_settings(current: Settings, source: SettingsSource) -> SettingsReload:
    """The same loader as at start, over the same argv and environment, so precedence holds across a
    reload (a flag still beats the file). Settings a running server cannot change keep their values."""
    fresh = source.load()
    differ = [f.name for f in OPTIONS if getattr(fresh, f.name) != getattr(current, f.name)]
    restart = {f.name for f in OPTIONS if f.metadata["restart"]}
    kept = {name: getattr(current, name) for name in differ if name in restart}
    return SettingsReload(
        dataclasses.replace(fresh, **kept), [n for n in differ if n not in restart], [n for n in differ if n in restart]
    )


def read_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as f:
            return tomllib.load(f)
    except OSError as error:
        raise ConfigError(f"{path}: cannot read the config file ({error.strerror})") from error
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{path}: not valid TOML: {error}") from error


def server_section(path: Path) -> dict[str, Any]:
    """The [server] table as Settings values; unknown keys are an error, not a silent no-op."""
    table = read_toml(path).get("server", {})
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: 'server' must be a table ([server])")
    fields = {field.name: field for field in OPTIONS}
    values: dict[str, Any] = {}
    for key, value in table.items():
        if key not in fields or key == "config":
            raise ConfigError(f"{path}: [server] has an unknown setting {key!r}")
        try:
            values[key] = parse_value(fields[key], value, path.parent)
        except ValueError as error:
            raise ConfigError(f"{path}: [server] {key}: {error}") from error
    return values
