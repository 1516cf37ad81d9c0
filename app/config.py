"""Settings: one frozen object, every option declared once, as a field of `Settings` with its help
text and its parser. The argparse flags, their env var fallbacks, the config keys and the per-model
keys are generated from those fields (app/config_sources.py, which also loads them). Precedence: CLI
flag > ONEPASS_<FLAG> env var > the config file (a model's [[models]] entry > its [server] section) >
the settings that belong to the model file (app/known_models.toml) > default.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from app.paths import cache_home

DEFAULT_SNAPSHOT_DIR = cache_home() / "snapshots"
DEFAULT_FITS_DIR = cache_home() / "calibrations"
ENV_PREFIX = "ONEPASS_"


def _option(
    default: Any,
    help: str,
    parse: Callable[[str], Any] = str,
    *,
    restart: bool = False,
    per_model: bool = False,
    aliases: tuple[str, ...] = (),
) -> Any:
    """A setting. `restart`: a reload cannot change it in a running server (it binds or logs at start).
    `per_model`: a [[models]] entry may set it for its model. `aliases`: more flags for it (llama-server's)."""
    metadata = {"help": help, "parse": parse, "restart": restart, "per_model": per_model, "aliases": aliases}
    return dataclasses.field(default=default, metadata=metadata)


def parse_path(text: str) -> Path:
    return Path(text).expanduser()


def _optional_path(text: str) -> Path | None:
    return parse_path(text) if text else None


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


def _integer(least: int | None = None, most: int | None = None) -> Callable[[str], int]:
    def parse_int(text: str) -> int:
        try:
            value = int(text.strip())
        except ValueError:
            raise ValueError(f"expected a whole number, not {text!r}") from None
        if (least is not None and value < least) or (most is not None and value > most):
            bounds = f"at least {least}" if most is None else f"from {least} to {most}"
            raise ValueError(f"expected a whole number {bounds}, not {value}")
        return value

    return parse_int


def parse_coverage(text: str) -> float:
    """A share strictly between 0 and 1: an answer set's coverage."""
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"expected a number, not {text!r}") from None
    if not 0 < value < 1:
        raise ValueError(f"a coverage is between 0 and 1, not {text!r}")
    return value


def _positive_number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"expected a number, not {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise ValueError(f"expected a positive number, not {text!r}")
    return value


SIZE = re.compile(r"(?i)\s*(\d+(?:\.\d+)?)\s*(?:([kmgt])(?:i?b)?|b)?\s*")
UNITS = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}


def parse_size(text: str) -> int:
    """Bytes, as a number or with a binary unit: 4G, 4GiB, 512M, 64k."""
    match = SIZE.fullmatch(text)
    if match is None:
        raise ValueError(f"expected a size such as 4096, 512M or 4G, not {text!r}")
    return int(float(match.group(1)) * UNITS[(match.group(2) or "").lower()])


def _one_of(name: str, choices: tuple[str, ...]) -> Callable[[str], str]:
    """A parser for a setting that takes one of a few words."""

    def parse(text: str) -> str:
        if text not in choices:
            raise ValueError(f"{name} must be one of {', '.join(choices)}; not {text!r}")
        return text

    return parse


CALIBRATIONS = ("none", "contextual")
LAYOUTS = ("state-first", "question-first")
REPACK = ("auto", "on", "off")
FLASH_ATTN = ("auto", "on", "off")
TEMPLATES = ("auto", "plain")
LOG_LEVELS = ("debug", "info", "warning", "error")
parse_calibration = _one_of("calibration", CALIBRATIONS)
parse_layout = _one_of("layout", LAYOUTS)
parse_repack = _one_of("repack", REPACK)
parse_flash_attn = _one_of("flash_attn", FLASH_ATTN)
parse_template = _one_of("template", TEMPLATES)
_log_level_word = _one_of("log_level", LOG_LEVELS)


def parse_log_level(text: str) -> str:
    return _log_level_word(text.lower())


@dataclasses.dataclass(frozen=True)
class Settings:
    config: Path | None = _option(
        None,
        "TOML file with server settings and the models to serve (in a checkout the CLI reads models/onepass.toml "
        "unless --model or --config is given)",
        _optional_path,
    )
    host: str = _option("127.0.0.1", "address to bind", restart=True)
    port: int = _option(8080, "port to bind (0: any free port, logged at start)", _integer(0, 65535), restart=True)
    model: Path | None = _option(
        None, "GGUF model file to serve when no config file lists models", _optional_path, aliases=("-m",)
    )
    served_model_name: str | None = _option(
        None, "name the model answers as (default: the GGUF file name without .gguf)", _optional_str, aliases=("-a",)
    )
    context_path: Path | None = _option(
        None, "text file prepended to every prompt as system context", _optional_path, per_model=True
    )
    mmproj: Path | None = _option(
        None,
        "the model's vision projector, a GGUF (llama-server's --mmproj): with it the model takes images",
        _optional_path,
        per_model=True,
    )
    n_ctx: int = _option(
        8192,
        "context length in tokens: system + state + question suffixes",
        _integer(1),
        per_model=True,
        aliases=("-c", "--ctx-size"),
    )
    n_gpu_layers: int = _option(
        0,
        "layers to offload to the GPU (-1 = all; needs a GPU build)",
        _integer(-1),
        per_model=True,
        aliases=("-ngl", "--gpu-layers"),
    )
    threads: int = _option(
        0,
        "CPU threads per decode (0 = one per core, or per CPU where measured faster)",
        _integer(0),
        per_model=True,
        aliases=("-t",),
    )
    contexts: int = _option(
        1,
        "llama.cpp contexts in the pool = requests decoded in parallel",
        _integer(1),
        per_model=True,
        aliases=("-np", "--parallel"),
    )
    batch_requests: bool = _option(
        False,
        "decode the questions of requests that wait at once in one llama_decode: more requests/s; an answer "
        "decoded beside others moves by the spread docs/exactness.md measured and says so in x_depends_on",
        parse_bool,
        per_model=True,
    )
    answer_during_prefill: bool = _option(
        True,
        "keep one more context, where a request whose prefix is cached is answered on most of the threads while "
        "a new state is prefilled on the rest, instead of waiting for a piece of it (costs a context's memory)",
        parse_bool,
        per_model=True,
    )
    repack: str = _option(
        "auto",
        "ggml's repacked CPU weights: 'auto' times a prefill both ways at first start (cached per CPU, "
        "build and model), 'on' or 'off'",
        parse_repack,
        per_model=True,
    )
    flash_attn: str = _option(
        "auto",
        "llama.cpp's flash attention: 'auto' times a prefill both ways at first start on the CPU (cached "
        "like repack) and is on with layers on a CUDA GPU, off on other GPUs; 'on' or 'off'",
        parse_flash_attn,
        per_model=True,
        aliases=("-fa",),
    )
    template: str = _option(
        "auto",
        "prompt template: 'auto' (the GGUF's chat template if it has one, else plain) or 'plain'",
        parse_template,
        per_model=True,
    )
    session_cache_entries: int = _option(
        16, "most prefix snapshots kept (0 disables the cache)", _integer(0), per_model=True
    )
    session_cache_tokens: int = _option(
        32768, "most prefix tokens kept across snapshots (0 disables the cache)", _integer(0), per_model=True
    )
    session_cache_dir: Path = _option(
        DEFAULT_SNAPSHOT_DIR,
        "folder of the session cache's disk tier, one subfolder per model file and projector (a --mmproj "
        "given, changed or dropped starts another one; may be shared by several servers)",
        parse_path,
        per_model=True,
    )
    session_cache_disk_bytes: int = _option(
        4 * 1024**3,
        "most bytes of snapshots kept on disk per model, e.g. 4G or 512M (0 turns the disk tier off)",
        parse_size,
        per_model=True,
    )
    calibration: str = _option(
        "contextual",
        "label-prior correction: 'contextual' (content-free states, Zhao et al. 2021) or 'none'",
        parse_calibration,
        per_model=True,
    )
    calibration_temperature: float = _option(
        1.0,
        "divides calibrated log-probabilities: below 1 sharpens, above 1 softens (argmax unchanged; "
        "a known model file brings its fitted value)",
        _positive_number,
        per_model=True,
    )
    answer_set_coverage: float = _option(
        0.9,
        "how often a fitted answer's x_set holds the right label, unless a request's x_coverage says "
        "otherwise (split conformal prediction on the fit's held-out answers)",
        parse_coverage,
        per_model=True,
    )
    calibration_dir: Path = _option(
        DEFAULT_FITS_DIR,
        "folder of the calibrations fitted to your examples (POST /v1/calibrations, onepass calibrate), one "
        "subfolder per model file and projector (a --mmproj given, changed or dropped starts another one: "
        "fits made without it are not used with it), each fit valid only for the prompt it was fitted under "
        "(may be shared by several servers)",
        parse_path,
        per_model=True,
    )
    layout: str = _option(
        "state-first",
        "prompt layout: 'state-first' (system + state, then each question; repeated states are cheap) or "
        "'question-first' (system + all questions, then the state; many states with the same questions are cheap)",
        parse_layout,
        per_model=True,
    )
    default_model: str | None = _option(None, "the model 'jev-latest' means (default: the first one)", _optional_str)
    models_max: int = _option(2, "models resident at once; the least recently used idle one is unloaded", _integer(1))
    api_key: str | None = _option(
        None,
        "require 'Authorization: Bearer <key>' on every route but /health, /health/live and the page's own files "
        "(default: no auth; "
        "prefer the env var or --api-key-file, which ps does not show)",
        _optional_str,
    )
    api_key_file: Path | None = _option(
        None, "file with one accepted API key per line (adds to --api-key)", _optional_path
    )
    max_body_bytes: int = _option(
        8 * 1024 * 1024,
        "largest request body accepted, e.g. 8M (413 beyond); where a model takes images, 8 images' room more",
        parse_size,
    )
    max_questions: int = _option(256, "most questions in one request (422 beyond)", _integer(1))
    max_text_chars: int = _option(
        20_000, "longest instruction, option or level text in characters (422 beyond)", _integer(1)
    )
    max_prompt_tokens: int = _option(
        32768,
        "most prompt tokens one request may have its model read: the prefix and each distinct question suffix, "
        "as usage.input_tokens counts them (413 beyond, before any inference; 0: no limit)",
        _integer(0),
        per_model=True,
    )
    max_queue: int = _option(32, "requests that may wait for a busy model; beyond: 503 overloaded", _integer(0))
    request_timeout: float = _option(
        300.0, "seconds before a request is answered 504 and its pending work dropped", _positive_number
    )
    max_batch_items: int = _option(
        1000, "most requests in one batch (a POST /v1/systemone body with 'requests'; 422 beyond)", _integer(1)
    )
    max_sync_batch_items: int = _option(
        16,
        "most requests a batch may have to be answered in its own response; a larger batch, or one with more "
        "requests for a model than it admits at once (contexts + max_queue), runs as a job (202)",
        _integer(0),
    )
    batch_timeout: float = _option(
        300.0,
        "seconds a batch answered in its response may take from admission; its requests not answered by then "
        "get a 504 timeout result",
        _positive_number,
    )
    batch_job_timeout: float = _option(
        3600.0,
        "seconds a batch job may run; its requests not answered by then get a 504 timeout result",
        _positive_number,
    )
    max_batch_jobs: int = _option(4, "batch jobs running at once; beyond: 503 overloaded", _integer(1))
    max_fitting_jobs: int = _option(
        2,
        "fitting jobs running at once (POST /v1/calibrations; a labelling session's jobs count too); beyond: "
        "503 overloaded",
        _integer(1),
    )
    shutdown_timeout: float = _option(
        30.0, "seconds SIGTERM waits for in-flight requests before exiting", _positive_number, restart=True
    )
    log_level: str = _option("info", "logging level: debug, info, warning, error", parse_log_level, restart=True)
    replica_name: str | None = _option(
        None,
        "name this server gives in the X-Onepass-Replica response header, for a fleet behind a proxy "
        "(default: this host's name and the port it listens on)",
        _optional_str,
        restart=True,
    )
    no_ui: bool = _option(False, "serve only the API: no page to try it at /", parse_bool, restart=True)
    # Where each value that is not a default came from (config_sources.FLAG, ENV or SERVER_SECTION), not an option.
    origins: Mapping[str, str] = dataclasses.field(default_factory=dict, compare=False, repr=False)

    @property
    def model_name(self) -> str:
        if self.served_model_name:
            return self.served_model_name
        return self.model.name.removesuffix(".gguf") if self.model is not None else "model"


OPTIONS = tuple(field for field in dataclasses.fields(Settings) if "help" in field.metadata)
PER_MODEL_OPTIONS = tuple(field for field in OPTIONS if field.metadata["per_model"])


def env_var(name: str) -> str:
    return ENV_PREFIX + name.upper()


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")
