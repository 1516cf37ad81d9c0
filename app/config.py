"""Settings: one frozen object. Precedence: CLI flag > ONEPASS_<FLAG> env var > default.

Every option is declared once, as a field of `Settings` with its help text; the argparse
flags and their env var fallbacks are generated from those fields.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_MODEL_PATH = REPO_ROOT / "models" / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
ENV_PREFIX = "ONEPASS_"


def _option(default: Any, help: str, parse: Callable[[str], Any] = str) -> Any:
    return dataclasses.field(default=default, metadata={"help": help, "parse": parse})


def _optional_path(text: str) -> Path | None:
    return Path(text) if text else None


def _optional_str(text: str) -> str | None:
    return text or None


def _calibration(text: str) -> str:
    if text not in ("none", "contextual"):
        raise ValueError(f"calibration must be 'none' or 'contextual', not {text!r}")
    return text


@dataclasses.dataclass(frozen=True)
class Settings:
    host: str = _option("127.0.0.1", "address to bind")
    port: int = _option(8080, "port to bind", int)
    model: Path = _option(DEFAULT_MODEL_PATH, "GGUF model file to serve", Path)
    served_model_name: str | None = _option(
        None, "name the model answers as (default: the GGUF file name without .gguf)", _optional_str
    )
    context_path: Path | None = _option(
        None, "text file prepended to every prompt as system context (missing = none)", _optional_path
    )
    n_ctx: int = _option(8192, "context length in tokens: system + state + question suffixes", int)
    n_gpu_layers: int = _option(0, "layers to offload to the GPU (-1 = all; needs a GPU build)", int)
    threads: int = _option(0, "CPU threads per decode (0 = all cores)", int)
    contexts: int = _option(1, "llama.cpp contexts in the pool = requests decoded in parallel", int)
    session_cache_entries: int = _option(16, "most prefix snapshots kept (0 disables the cache)", int)
    session_cache_tokens: int = _option(32768, "most prefix tokens kept across snapshots (0 disables the cache)", int)
    calibration: str = _option(
        "contextual",
        "label-prior correction: 'contextual' (content-free states, Zhao et al. 2021) or 'none'",
        _calibration,
    )
    api_key: str | None = _option(None, "require 'Authorization: Bearer <key>' (default: no auth)", _optional_str)
    max_body_bytes: int = _option(8 * 1024 * 1024, "largest request body accepted (413 beyond)", int)
    log_level: str = _option("info", "logging level: debug, info, warning, error")

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
        parser.add_argument(
            "--" + field.name.replace("_", "-"),
            dest=field.name,
            type=field.metadata["parse"],
            default=argparse.SUPPRESS,
            help=f"{field.metadata['help']} [env {env_var(field.name)}; default {field.default}]",
        )
    return parser


def load_settings(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> Settings:
    environ = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    for field in dataclasses.fields(Settings):
        raw = environ.get(env_var(field.name))
        if raw is not None:
            try:
                values[field.name] = field.metadata["parse"](raw)
            except ValueError as error:
                raise ValueError(f"{env_var(field.name)}={raw!r}: {error}") from error
    values.update(vars(build_parser().parse_args(argv)))
    return Settings(**values)
