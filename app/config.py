"""Settings: one frozen object. Precedence: CLI flag > ONEPASS_<FLAG> env var > the config
file's [server] section > default.

Every option is declared once, as a field of `Settings` with its help text; the argparse
flags and their env var fallbacks are generated from those fields.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import tomllib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
with (REPO_ROOT / "models" / "sources.toml").open("rb") as _sources:  # the pinned models (models/fetch.py)
    DEFAULT_MODEL_PATH: Path = REPO_ROOT / "models" / tomllib.load(_sources)["default"]["filename"]
DEFAULT_CONFIG_PATH = REPO_ROOT / "models" / "onepass.toml"
ENV_PREFIX = "ONEPASS_"


def cache_home() -> Path:
    """onepass's per-user cache folder (the wheels, the build check, the tuning, the snapshots)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "onepass"


DEFAULT_SNAPSHOT_DIR = cache_home() / "snapshots"


def _option(default: Any, help: str, parse: Callable[[str], Any] = str, *, restart: bool = False) -> Any:
    """A setting. `restart`: a reload cannot change it in a running server (it binds or logs at start)."""
    return dataclasses.field(default=default, metadata={"help": help, "parse": parse, "restart": restart})


def _optional_path(text: str) -> Path | None:
    return Path(text) if text else None


def _optional_str(text: str) -> str | None:
    return text or None


def parse_bool(text: str) -> bool:
    """A switch: `--no-ui` alone turns it on; the env var and the file take a word (TOML `true` too)."""
    word = text.strip().lower()
    if word in ("1", "true", "yes", "on"):
        return True
    if word in ("", "0", "false", "no", "off"):
        return False
    raise ValueError(f"expected true or false, not {text!r}")


def _one_of(name: str, choices: tuple[str, ...]) -> Callable[[str], str]:
    """A parser for a setting that takes one of a few words."""

    def parse(text: str) -> str:
        if text not in choices:
            raise ValueError(f"{name} must be one of {choices}, not {text!r}")
        return text

    return parse


CALIBRATIONS = ("none", "contextual")
LAYOUTS = ("state-first", "question-first")
REPACK = ("auto", "on", "off")
FLASH_ATTN = ("auto", "on", "off")
parse_calibration = _one_of("calibration", CALIBRATIONS)
parse_layout = _one_of("layout", LAYOUTS)
parse_repack = _one_of("repack", REPACK)
parse_flash_attn = _one_of("flash_attn", FLASH_ATTN)


class ConfigError(ValueError):
    """A config file that cannot be used; the message says where and why."""


@dataclasses.dataclass(frozen=True)
class Settings:
    config: Path | None = _option(
        None,
        "TOML file with server settings and the models to serve (the CLI reads models/onepass.toml if present)",
        _optional_path,
    )
    host: str = _option("127.0.0.1", "address to bind", restart=True)
    port: int = _option(8080, "port to bind (0: any free port, logged at start)", int, restart=True)
    model: Path = _option(DEFAULT_MODEL_PATH, "GGUF model file to serve when no config file lists models", Path)
    served_model_name: str | None = _option(
        None, "name the model answers as (default: the GGUF file name without .gguf)", _optional_str
    )
    context_path: Path | None = _option(
        None, "text file prepended to every prompt as system context (missing = none)", _optional_path
    )
    n_ctx: int = _option(8192, "context length in tokens: system + state + question suffixes", int)
    n_gpu_layers: int = _option(0, "layers to offload to the GPU (-1 = all; needs a GPU build)", int)
    threads: int = _option(0, "CPU threads per decode (0 = one per core, or per CPU where measured faster)", int)
    contexts: int = _option(1, "llama.cpp contexts in the pool = requests decoded in parallel", int)
    repack: str = _option(
        "auto",
        "ggml's repacked CPU weights: 'auto' times a prefill both ways at first start (cached per CPU, "
        "build and model), 'on' or 'off'",
        parse_repack,
    )
    flash_attn: str = _option(
        "auto",
        "llama.cpp's flash attention on the CPU: 'auto' times a prefill both ways at first start (cached "
        "like repack), 'on' or 'off'",
        parse_flash_attn,
    )
    session_cache_entries: int = _option(16, "most prefix snapshots kept (0 disables the cache)", int)
    session_cache_tokens: int = _option(32768, "most prefix tokens kept across snapshots (0 disables the cache)", int)
    session_cache_dir: Path = _option(
        DEFAULT_SNAPSHOT_DIR,
        "folder of the snapshot disk tier, one subfolder per model (may be shared by several servers)",
        Path,
    )
    session_cache_disk_bytes: int = _option(
        4 * 1024**3, "most bytes of snapshots kept on disk per model (0 turns the disk tier off)", int
    )
    calibration: str = _option(
        "contextual",
        "label-prior correction: 'contextual' (content-free states, Zhao et al. 2021) or 'none'",
        parse_calibration,
    )
    calibration_temperature: float = _option(
        1.0, "divides calibrated log-probabilities: below 1 sharpens, above 1 softens (argmax unchanged)", float
    )
    layout: str = _option(
        "state-first",
        "prompt layout: 'state-first' (system + state, then each question; repeated states are cheap) or "
        "'question-first' (system + all questions, then the state; many states with the same questions are cheap)",
        parse_layout,
    )
    default_model: str | None = _option(None, "the model 'jev-latest' means (default: the first one)", _optional_str)
    models_max: int = _option(2, "models resident at once; the least recently used idle one is unloaded", int)
    api_key: str | None = _option(None, "require 'Authorization: Bearer <key>' (default: no auth)", _optional_str)
    api_key_file: Path | None = _option(
        None, "file with one accepted API key per line (adds to --api-key)", _optional_path
    )
    max_body_bytes: int = _option(8 * 1024 * 1024, "largest request body accepted (413 beyond)", int)
    max_questions: int = _option(256, "most questions in one request (422 beyond)", int)
    max_text_chars: int = _option(20_000, "longest instruction, option or level text in characters (422 beyond)", int)
    max_queue: int = _option(32, "requests that may wait for a busy model; beyond: 503 overloaded", int)
    request_timeout: float = _option(
        300.0, "seconds before a request is answered 504 and its pending work dropped", float
    )
    shutdown_timeout: float = _option(
        30.0, "seconds SIGTERM waits for in-flight requests before exiting", float, restart=True
    )
    log_level: str = _option("info", "logging level: debug, info, warning, error", restart=True)
    replica_name: str | None = _option(
        None,
        "name this server gives in the X-Onepass-Replica response header, for a fleet behind a proxy "
        "(default: this host's name and the port it listens on)",
        _optional_str,
        restart=True,
    )
    no_ui: bool = _option(False, "serve only the API: no page to try it at /", parse_bool, restart=True)

    @property
    def model_name(self) -> str:
        return self.served_model_name or self.model.name.removesuffix(".gguf")


def env_var(name: str) -> str:
    return ENV_PREFIX + name.upper()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="onepass",
        description="Serve System One answers (POST /v1/systemone) from a local GGUF model.",
        epilog=f"Every flag can also be set by an environment variable {ENV_PREFIX}<FLAG>, "
        "e.g. ONEPASS_N_CTX=4096; a flag given on the command line wins.",
    )
    for field in dataclasses.fields(Settings):
        switch: dict[str, Any] = {"nargs": "?", "const": True} if field.metadata["parse"] is parse_bool else {}
        parser.add_argument(
            "--" + field.name.replace("_", "-"),
            dest=field.name,
            type=field.metadata["parse"],
            default=argparse.SUPPRESS,
            help=f"{field.metadata['help']} [env {env_var(field.name)}; default {field.default}]",
            **switch,
        )
    return parser


def load_settings(
    argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None, default_config: Path | None = None
) -> Settings:
    """Flags > env vars > the config file's [server] section > defaults.

    `default_config` is used when it exists and neither a config nor a model was named.
    """
    environ = os.environ if environ is None else environ
    from_env: dict[str, Any] = {}
    for field in dataclasses.fields(Settings):
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
    return Settings(**{**from_file, **from_env, **from_flags, "config": config})


@dataclasses.dataclass(frozen=True)
class SettingsSource:
    """Where a server's settings came from (its argv and environment at start), to read them again."""

    argv: tuple[str, ...] = ()
    environ: Mapping[str, str] = dataclasses.field(default_factory=dict)
    default_config: Path | None = None

    def load(self) -> Settings:
        return load_settings(self.argv, self.environ, self.default_config)


@dataclasses.dataclass(frozen=True)
class Reloaded:
    settings: Settings  # what the server runs with now
    changed: list[str]  # settings that took effect
    needs_restart: list[str]  # settings that changed in the sources but keep their old value until a restart


def reload_settings(current: Settings, source: SettingsSource) -> Reloaded:
    """The same loader as at start, over the same argv and environment, so precedence holds across a
    reload (a flag still beats the file). Settings a running server cannot change keep their values."""
    fresh = source.load()
    differ = [f.name for f in dataclasses.fields(Settings) if getattr(fresh, f.name) != getattr(current, f.name)]
    restart = {f.name for f in dataclasses.fields(Settings) if f.metadata["restart"]}
    kept = {name: getattr(current, name) for name in differ if name in restart}
    return Reloaded(
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
    fields = {field.name: field for field in dataclasses.fields(Settings)}
    values: dict[str, Any] = {}
    for key, value in table.items():
        if key not in fields or key == "config":
            raise ConfigError(f"{path}: [server] has an unknown setting {key!r}")
        try:
            values[key] = fields[key].metadata["parse"](str(value))
        except ValueError as error:
            raise ConfigError(f"{path}: [server] {key}: {error}") from error
    return values
