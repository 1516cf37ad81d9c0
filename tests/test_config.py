"""Settings: CLI flag > ONEPASS_<FLAG> environment variable > default, and the generated --help."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from app.config import DEFAULT_FITS_DIR, DEFAULT_SNAPSHOT_DIR, OPTIONS, Settings, env_var
from app.config_sources import DEFAULT_CONFIG_PATH, build_parser, load_settings, package_version
from app.paths import REPO_ROOT
from app.serving.known_models import default_model_path, read_known_models
from app.serving.specs import read_models_config

FIELD_NAMES = [field.name for field in OPTIONS]


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def test_defaults_with_no_flags_and_no_environment() -> None:
    settings = load_settings([], {})
    assert settings == Settings() and settings.origins == {}
    assert {field.name: getattr(settings, field.name) for field in OPTIONS} == {
        "config": None,
        "host": "127.0.0.1",
        "port": 8080,
        "model": None,
        "served_model_name": None,
        "context_path": None,
        "mmproj": None,
        "n_ctx": 8192,
        "n_gpu_layers": 0,
        "threads": 0,
        "contexts": 1,
        "batch_requests": False,
        "answer_during_prefill": True,
        "repack": "auto",
        "flash_attn": "auto",
        "template": "auto",
        "session_cache_entries": 16,
        "session_cache_tokens": 32768,
        "session_cache_dir": DEFAULT_SNAPSHOT_DIR,
        "session_cache_disk_bytes": 4 * 1024**3,
        "calibration": "contextual",
        "calibration_temperature": 1.0,
        "answer_set_coverage": 0.9,
        "calibration_dir": DEFAULT_FITS_DIR,
        "layout": "state-first",
        "default_model": None,
        "models_max": 2,
        "api_key": None,
        "api_key_file": None,
        "max_body_bytes": 8 * 1024 * 1024,
        "max_questions": 256,
        "max_text_chars": 20_000,
        "max_prompt_tokens": 32768,
        "max_queue": 32,
        "request_timeout": 300.0,
        "max_batch_items": 1000,
        "max_sync_batch_items": 16,
        "batch_timeout": 300.0,
        "batch_job_timeout": 3600.0,
        "max_batch_jobs": 4,
        "max_fitting_jobs": 2,
        "shutdown_timeout": 30.0,
        "log_level": "info",
        "replica_name": None,
        "no_ui": False,
    }


def test_env_var_names_are_the_prefixed_upper_case_field_names() -> None:
    assert [env_var(name) for name in FIELD_NAMES] == [
        "ONEPASS_CONFIG",
        "ONEPASS_HOST",
        "ONEPASS_PORT",
        "ONEPASS_MODEL",
        "ONEPASS_SERVED_MODEL_NAME",
        "ONEPASS_CONTEXT_PATH",
        "ONEPASS_MMPROJ",
        "ONEPASS_N_CTX",
        "ONEPASS_N_GPU_LAYERS",
        "ONEPASS_THREADS",
        "ONEPASS_CONTEXTS",
        "ONEPASS_BATCH_REQUESTS",
        "ONEPASS_ANSWER_DURING_PREFILL",
        "ONEPASS_REPACK",
        "ONEPASS_FLASH_ATTN",
        "ONEPASS_TEMPLATE",
        "ONEPASS_SESSION_CACHE_ENTRIES",
        "ONEPASS_SESSION_CACHE_TOKENS",
        "ONEPASS_SESSION_CACHE_DIR",
        "ONEPASS_SESSION_CACHE_DISK_BYTES",
        "ONEPASS_CALIBRATION",
        "ONEPASS_CALIBRATION_TEMPERATURE",
        "ONEPASS_ANSWER_SET_COVERAGE",
        "ONEPASS_CALIBRATION_DIR",
        "ONEPASS_LAYOUT",
        "ONEPASS_DEFAULT_MODEL",
        "ONEPASS_MODELS_MAX",
        "ONEPASS_API_KEY",
        "ONEPASS_API_KEY_FILE",
        "ONEPASS_MAX_BODY_BYTES",
        "ONEPASS_MAX_QUESTIONS",
        "ONEPASS_MAX_TEXT_CHARS",
        "ONEPASS_MAX_PROMPT_TOKENS",
        "ONEPASS_MAX_QUEUE",
        "ONEPASS_REQUEST_TIMEOUT",
        "ONEPASS_MAX_BATCH_ITEMS",
        "ONEPASS_MAX_SYNC_BATCH_ITEMS",
        "ONEPASS_BATCH_TIMEOUT",
        "ONEPASS_BATCH_JOB_TIMEOUT",
        "ONEPASS_MAX_BATCH_JOBS",
        "ONEPASS_MAX_FITTING_JOBS",
        "ONEPASS_SHUTDOWN_TIMEOUT",
        "ONEPASS_LOG_LEVEL",
        "ONEPASS_REPLICA_NAME",
        "ONEPASS_NO_UI",
    ]


# (field, text given as flag, its parsed value, text given in the environment, its parsed value)
PRECEDENCE_CASES: list[tuple[str, str, Any, str, Any]] = [
    ("port", "9001", 9001, "9002", 9002),
    ("n_ctx", "2048", 2048, "4096", 4096),
    ("session_cache_tokens", "100", 100, "200", 200),
    ("n_gpu_layers", "-1", -1, "12", 12),
    ("model", "/flag/a.gguf", Path("/flag/a.gguf"), "/env/b.gguf", Path("/env/b.gguf")),
    ("context_path", "/flag/ctx.txt", Path("/flag/ctx.txt"), "/env/ctx.txt", Path("/env/ctx.txt")),
    ("mmproj", "/flag/mmproj.gguf", Path("/flag/mmproj.gguf"), "/env/mmproj.gguf", Path("/env/mmproj.gguf")),
    ("api_key", "flag-key", "flag-key", "env-key", "env-key"),
    ("served_model_name", "flag-name", "flag-name", "env-name", "env-name"),
    ("host", "0.0.0.0", "0.0.0.0", "10.0.0.1", "10.0.0.1"),
    ("log_level", "debug", "debug", "warning", "warning"),
    ("replica_name", "replica1", "replica1", "gpu-host-2:8080", "gpu-host-2:8080"),
    ("no_ui", "yes", True, "1", True),
]


@pytest.mark.parametrize(
    ("name", "flag_text", "flag_value", "env_text", "env_value"), PRECEDENCE_CASES, ids=[c[0] for c in PRECEDENCE_CASES]
)
def test_flag_beats_env_beats_default(
    name: str, flag_text: str, flag_value: Any, env_text: str, env_value: Any
) -> None:
    default = getattr(Settings(), name)
    assert default not in (flag_value, env_value)
    environ = {env_var(name): env_text}
    argv = [flag(name), flag_text]

    assert getattr(load_settings([], {}), name) == default
    assert getattr(load_settings([], environ), name) == env_value
    assert getattr(load_settings(argv, {}), name) == flag_value
    assert getattr(load_settings(argv, environ), name) == flag_value
    # Only the named option moves; every other one keeps its default.
    loaded = load_settings(argv, environ)
    others = {f.name: getattr(loaded, f.name) for f in OPTIONS if f.name != name}
    assert others == {f.name: getattr(Settings(), f.name) for f in OPTIONS if f.name != name}
    assert loaded.origins == {name: "flag"} and load_settings([], environ).origins == {name: "env"}


def test_a_switch_is_on_alone_and_takes_a_word_from_the_environment_or_the_file(tmp_path: Path) -> None:
    assert load_settings(["--no-ui"], {}).no_ui is True
    assert load_settings(["--no-ui", "false"], {"ONEPASS_NO_UI": "true"}).no_ui is False
    for word, value in {"0": False, "off": False, "No": False, "1": True, "on": True, "TRUE": True}.items():
        assert load_settings([], {"ONEPASS_NO_UI": word}).no_ui is value, word
    config = tmp_path / "onepass.toml"
    config.write_text("[server]\nno_ui = true\n")
    assert load_settings(["--config", str(config)], {}).no_ui is True
    with pytest.raises(ValueError, match="expected true or false, not 'maybe'"):
        load_settings([], {"ONEPASS_NO_UI": "maybe"})


def test_parsed_values_have_the_field_types() -> None:
    settings = load_settings(
        ["--port", "1234", "--context-path", "ctx.txt"],
        {"ONEPASS_N_CTX": "512", "ONEPASS_MODEL": "m.gguf", "ONEPASS_API_KEY": "k"},
    )
    assert type(settings.port) is int and type(settings.n_ctx) is int
    assert isinstance(settings.context_path, Path) and isinstance(settings.model, Path)
    assert type(settings.api_key) is str


def test_empty_values_of_optional_options_mean_none() -> None:
    environ = {"ONEPASS_API_KEY": "", "ONEPASS_SERVED_MODEL_NAME": "", "ONEPASS_CONTEXT_PATH": ""}
    settings = load_settings([], environ)
    assert (settings.api_key, settings.served_model_name, settings.context_path) == (None, None, None)
    # An empty flag overrides a set environment variable back to "none".
    settings = load_settings(["--api-key", ""], {"ONEPASS_API_KEY": "env-key"})
    assert settings.api_key is None


def test_several_sources_combine() -> None:
    settings = load_settings(
        ["--port", "7000", "--api-key", "flag-key"],
        {"ONEPASS_PORT": "7001", "ONEPASS_SESSION_CACHE_ENTRIES": "4", "ONEPASS_HOST": "0.0.0.0"},
    )
    assert (settings.port, settings.api_key, settings.session_cache_entries, settings.host) == (
        7000,
        "flag-key",
        4,
        "0.0.0.0",
    )
    assert settings.session_cache_tokens == 32768


def test_unrelated_environment_variables_are_ignored() -> None:
    environ = {"PORT": "1", "ONEPASS": "x", "onepass_port": "2", "ONEPASS_PORTS": "3", "ONEPASS_UNKNOWN": "4"}
    assert load_settings([], environ) == Settings()


def test_the_process_environment_is_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in FIELD_NAMES:
        monkeypatch.delenv(env_var(name), raising=False)
    monkeypatch.setenv("ONEPASS_PORT", "9123")
    monkeypatch.setenv("ONEPASS_API_KEY", "from-os-environ")
    settings = load_settings([])
    assert (settings.port, settings.api_key) == (9123, "from-os-environ")


def test_invalid_env_value_raises_value_error() -> None:
    with pytest.raises(ValueError, match="abc"):
        load_settings([], {"ONEPASS_PORT": "abc"})
    with pytest.raises(ValueError, match="many"):
        load_settings([], {"ONEPASS_SESSION_CACHE_TOKENS": "many"})


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--port", "abc"], "argument --port: expected a whole number, not 'abc'"),
        (["--port", "70000"], "argument --port: expected a whole number from 0 to 65535, not 70000"),
        (["--repack", "x"], "argument --repack: repack must be one of auto, on, off; not 'x'"),
        (["--log-level", "foo"], "argument --log-level: log_level must be one of debug, info, warning, error"),
        (["--calibration-temperature", "0"], "expected a positive number, not '0'"),
        (["--session-cache-disk-bytes", "lots"], "expected a size such as 4096, 512M or 4G, not 'lots'"),
        (["-c", "0"], "argument -c/--ctx-size/--n-ctx: expected a whole number at least 1, not 0"),
    ],
)
def test_an_invalid_flag_value_is_an_argparse_error_that_says_what_is_wrong(
    argv: list[str], words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as raised:
        load_settings(argv, {})
    assert raised.value.code == 2
    assert words in capsys.readouterr().err


def test_unknown_flag_is_an_argparse_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as raised:
        load_settings(["--no-such-flag", "1"], {})
    assert raised.value.code == 2
    assert "unrecognized arguments: --no-such-flag 1" in capsys.readouterr().err


def test_a_prefix_of_a_flag_is_not_taken_for_it(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        load_settings(["--n-c", "4096"], {})
    assert "unrecognized arguments: --n-c 4096" in capsys.readouterr().err


def test_llama_server_short_flags_and_aliases() -> None:
    settings = load_settings(
        ["-m", "x.gguf", "-c", "4096", "-ngl", "-1", "-t", "3", "-a", "jev-local", "-np", "2", "-fa", "on"], {}
    )
    assert (settings.model, settings.n_ctx, settings.n_gpu_layers, settings.threads) == (Path("x.gguf"), 4096, -1, 3)
    assert (settings.served_model_name, settings.contexts, settings.flash_attn) == ("jev-local", 2, "on")
    longer = load_settings(["--ctx-size", "2048", "--gpu-layers", "5", "--parallel", "3"], {})
    assert (longer.n_ctx, longer.n_gpu_layers, longer.contexts) == (2048, 5, 3)


def test_sizes_take_binary_units() -> None:
    assert load_settings(["--session-cache-disk-bytes", "4G"], {}).session_cache_disk_bytes == 4 * 1024**3
    assert load_settings([], {"ONEPASS_MAX_BODY_BYTES": "512M"}).max_body_bytes == 512 * 1024**2
    assert load_settings(["--max-body-bytes", "64KiB"], {}).max_body_bytes == 64 * 1024
    assert load_settings(["--max-body-bytes", "1.5g"], {}).max_body_bytes == 3 * 1024**3 // 2
    assert load_settings(["--max-body-bytes", "1000"], {}).max_body_bytes == 1000


def test_paths_expand_the_home_folder() -> None:
    settings = load_settings(["-m", "~/models/x.gguf"], {"ONEPASS_SESSION_CACHE_DIR": "~/snaps"})
    assert settings.model == Path.home() / "models" / "x.gguf"
    assert settings.session_cache_dir == Path.home() / "snaps"


def test_version_prints_the_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as raised:
        load_settings(["--version"], {})
    assert raised.value.code == 0
    assert capsys.readouterr().out.strip() == f"onepass {package_version()}"


def test_help_lists_every_field_flag_and_env_var(monkeypatch: pytest.MonkeyPatch) -> None:
    aliases = {alias for field in OPTIONS for alias in field.metadata["aliases"] if alias.startswith("--")}
    for columns in ("50", "80", "117"):  # a flag named inside a help text is never cut at its hyphen
        monkeypatch.setenv("COLUMNS", columns)
        text = build_parser().format_help()
        assert set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", text)) == {
            "--help",
            "--version",
            *aliases,
            *(flag(name) for name in FIELD_NAMES),
        }, f"at {columns} columns"
        assert set(re.findall(r"ONEPASS_[A-Z_]+", text)) == {env_var(name) for name in FIELD_NAMES}
    # Unwrapped, each option's entry names its own env var and its default.
    monkeypatch.setenv("COLUMNS", "1000")
    flat = " ".join(build_parser().format_help().split())
    for field in OPTIONS:
        # a switch's value is optional: `--no-ui [NO_UI]`
        metavar = rf"\[?{field.name.upper()}\]?"
        entry = re.search(rf"{flag(field.name)} {metavar} [^\[]*\[env (\w+); default ([^\]]*)\]", flat)
        assert entry is not None, field.name
        assert entry.groups() == (env_var(field.name), str(field.default))


def test_model_name_is_the_gguf_file_stem() -> None:
    assert Settings(model=Path("/models/tiny-chat.gguf")).model_name == "tiny-chat"
    assert Settings(model=Path("weights/my.model.Q8_0.gguf")).model_name == "my.model.Q8_0"
    assert Settings(model=Path("/models/plain.bin")).model_name == "plain.bin"
    assert load_settings(["--model", "/m/tiny-chat.gguf"], {}).model_name == "tiny-chat"
    assert load_settings([], {"ONEPASS_MODEL": "/m/env-model.gguf"}).model_name == "env-model"


def test_served_model_name_overrides_the_file_stem() -> None:
    assert load_settings(["--model", "/m/tiny-chat.gguf", "--served-model-name", "jev-local"], {}).model_name == (
        "jev-local"
    )
    assert load_settings([], {"ONEPASS_SERVED_MODEL_NAME": "from-env"}).model_name == "from-env"
    assert Settings(model=Path("/m/a.gguf"), served_model_name="b").model_name == "b"
    assert Settings(model=Path("/m/a.gguf"), served_model_name="").model_name == "a"


def test_python_m_app_help_exits_zero_and_lists_the_flags() -> None:
    environ = {key: value for key, value in os.environ.items() if not key.startswith("ONEPASS_")}
    result = subprocess.run(
        [sys.executable, "-m", "app", "--help"],
        cwd=REPO_ROOT,
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: onepass")
    assert "onepass calibrate EXAMPLES.jsonl" in result.stdout  # the subcommands, dispatched before the flags
    assert "onepass label STATES.jsonl" in result.stdout
    assert "--session-cache-tokens" in result.stdout
    assert "ONEPASS_SESSION_CACHE_TOKENS" in result.stdout


def test_the_shipped_config_serves_the_pinned_default_model_from_its_own_folder() -> None:
    # app/known_models.toml names the model files once; the user-editable config must point at the same file,
    # written relative to the config's folder
    settings = load_settings([], {}, default_config=DEFAULT_CONFIG_PATH)
    config = read_models_config(settings)
    default = next(spec for spec in config.models if spec.name == config.default_model)
    assert default.path == default_model_path().resolve()
    assert {spec.path for spec in config.models} <= {
        DEFAULT_CONFIG_PATH.parent.resolve() / model.filename for model in read_known_models()
    }
