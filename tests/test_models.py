"""Several models from one config file: routing, LRU residency, reload, per-model caches."""

from __future__ import annotations

import shutil
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.testclient import TestClient

from app.answering.service import ModelService
from app.config import Settings
from app.config_sources import ConfigError, SettingsSource, load_settings
from app.engine.caller import Caller, Signal, working_for
from app.errors import Cancelled, ModelUnavailable
from app.fleet.processes import READY, ServerProcess
from app.http.server import create_app
from app.platform.tiny_gguf import write_tiny_gguf
from app.serving.loading import load_spec
from app.serving.registry import ModelRegistry
from app.serving.specs import ModelsConfig, ModelSpec, read_models_config, replace_settings
from app.wire.contract import SystemOneRequest
from tests.support.settings import isolated_settings

QUESTION = {"type": "choice", "instructions": "Which?", "criteria": {"Alpha": None, "Beta": None, "Gamma": None}}


@pytest.fixture(scope="module")
def ggufs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("models")
    return {
        "one": write_tiny_gguf(folder / "one.gguf", seed=11),
        "two": write_tiny_gguf(folder / "two.gguf", seed=22, extra_words=("hello", "world")),
        "three": write_tiny_gguf(folder / "three.gguf", seed=33, chat_template=None, extra_words=("zeta",)),
    }


def write_config(
    path: Path,
    ggufs: dict[str, Path],
    models_max: int = 2,
    names: tuple[str, ...] = ("one", "two", "three"),
    default: str = "one",
    extra: str = "",
) -> Path:
    lines = [
        "[server]",
        f'default_model = "{default}"',
        f"models_max = {models_max}",
        "threads = 1",
        "session_cache_disk_bytes = 0",
        "",
    ]
    for name in names:
        lines += [
            "[[models]]",
            f'name = "{name}"',
            f'path = "{ggufs[name]}"',
            f'aliases = ["{name}-alias"]',
            "n_ctx = 2048",
            "",
        ]
    path.write_text("\n".join(lines) + extra)
    return path


def settings_for(config: Path) -> Settings:
    return load_settings(["--config", str(config)], {})


def ask(client: TestClient, model: str, state: str = "the same state for every model") -> Any:
    return client.post("/v1/systemone", json={"model": model, "state": state, "questions": {"q": QUESTION}})


@pytest.fixture
def served(tmp_path: Path, ggufs: dict[str, Path]) -> Iterator[tuple[TestClient, Path]]:
    config = write_config(tmp_path / "onepass.toml", ggufs)
    source = SettingsSource(("--config", str(config)))
    app = create_app(source.load(), source=source)
    with TestClient(app) as client:
        assert app.state.runtime.loaded.wait(30)
        yield client, config


def test_the_config_file_sets_server_settings_below_flags_and_env(tmp_path: Path, ggufs: dict[str, Path]) -> None:
    config = write_config(tmp_path / "c.toml", ggufs, models_max=3)
    assert settings_for(config).models_max == 3
    assert load_settings(["--config", str(config)], {"ONEPASS_MODELS_MAX": "4"}).models_max == 4
    assert load_settings(["--config", str(config), "--models-max", "5"], {"ONEPASS_MODELS_MAX": "4"}).models_max == 5
    assert load_settings([], {}, default_config=config).config == config
    assert load_settings([], {}, default_config=tmp_path / "absent.toml").config is None


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ('[[models]]\nname = "one"\npath = "x.gguf"\n', "used twice"),
        ('[[models]]\nname = "four"\n', "needs a string 'name' and a string 'path'"),
        ('[[models]]\nname = "four"\npath = "x.gguf"\nn_ctx = "big"\n', "n_ctx: expected a whole number, not 'big'"),
        ('[[models]]\nname = "four"\npath = "x.gguf"\ncolour = "red"\n', "unknown setting"),
        ('[[models]]\nname = "four"\npath = "x.gguf"\ntemplate = "fancy"\n', "template must be one of"),
        ("this is not toml = = =\n", "not valid TOML"),
        ('[[models]]\nname = "four"\npath = "x.gguf"\ncalibration_temperature = 0\n', "expected a positive number"),
        ('[[models]]\nname = "four"\npath = "x.gguf"\nn_ctx = [1]\n', "expected a single value"),
        (
            '[[models]]\nname = "four"\npath = "x.gguf"\ncontext_path = "typo.md"\n',
            "context_path .*typo.md is not a file",
        ),
        (
            '[[models]]\nname = "four"\npath = "x.gguf"\nmmproj = "no-such.gguf"\n',
            "mmproj .*no-such.gguf is not a file",
        ),
    ],
)
def test_a_config_with_errors_is_rejected_with_a_clear_message(
    tmp_path: Path, ggufs: dict[str, Path], extra: str, message: str
) -> None:
    config = write_config(tmp_path / "bad.toml", ggufs, extra=extra)
    with pytest.raises(ConfigError, match=message):
        read_models_config(settings_for(config))


def test_a_models_setting_comes_from_flag_then_env_then_its_entry_then_server_then_default(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text(
        "[server]\nn_ctx = 1000\nthreads = 2\ncontexts = 3\n\n"
        '[[models]]\nname = "m"\npath = "m.gguf"\nn_ctx = 2000\nthreads = 4\ncontexts = 5\nlayout = "question-first"\n'
    )

    def spec(argv: list[str], environ: dict[str, str]) -> ModelSpec:
        return read_models_config(load_settings(["--config", str(config), *argv], environ)).models[0]

    from_files = spec([], {})
    assert (from_files.settings.n_ctx, from_files.settings.threads, from_files.settings.contexts) == (2000, 4, 5)
    assert from_files.settings.calibration == "contextual"  # no source sets it: the default
    assert from_files.origins == {
        "n_ctx": "[[models]]",
        "threads": "[[models]]",
        "contexts": "[[models]]",
        "layout": "[[models]]",
    }
    env = spec([], {"ONEPASS_N_CTX": "3000", "ONEPASS_THREADS": "6"})
    assert (env.settings.n_ctx, env.settings.threads, env.settings.contexts) == (3000, 6, 5)
    flagged = spec(["-c", "4000"], {"ONEPASS_N_CTX": "3000"})
    assert flagged.settings.n_ctx == 4000 and flagged.origins["n_ctx"] == "flag"
    # an entry without the key takes [server]'s
    config.write_text(config.read_text().replace("threads = 4\n", ""))
    assert spec([], {}).settings.threads == 2 and spec([], {}).origins["threads"] == "[server]"


def test_relative_paths_in_a_config_are_relative_to_its_folder_from_any_working_directory(
    tmp_path: Path, ggufs: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "conf"
    (folder / "ctx").mkdir(parents=True)
    (folder / "ctx" / "support.md").write_text("You triage tickets.")
    shutil.copyfile(ggufs["one"], folder / "one.gguf")
    config = folder / "onepass.toml"
    config.write_text(
        '[server]\nsession_cache_dir = "snaps"\napi_key_file = "~/keys.txt"\n\n'
        '[[models]]\nname = "one"\npath = "one.gguf"\ncontext_path = "ctx/support.md"\n'
        '[[models]]\nname = "eyes"\npath = "one.gguf"\nmmproj = "ctx/support.md"\n'  # any file: not loaded here
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    settings = load_settings(["--config", "../conf/onepass.toml"], {})  # relative to the working directory
    spec, eyes = read_models_config(settings).models
    assert spec.path == folder.resolve() / "one.gguf"
    assert eyes.settings.mmproj == folder.resolve() / "ctx" / "support.md" and eyes.takes_images
    assert spec.settings.context_path == folder.resolve() / "ctx" / "support.md"
    assert not spec.takes_images
    assert spec.settings.session_cache_dir == folder.resolve() / "snaps"
    assert settings.api_key_file == Path.home() / "keys.txt"
    service = load_spec(replace_settings(spec, threads=1, session_cache_disk_bytes=0))
    try:
        assert service.name == "one"
    finally:
        service.close()


def test_unknown_default_and_server_keys_are_rejected(tmp_path: Path, ggufs: dict[str, Path]) -> None:
    with pytest.raises(ConfigError, match="default_model 'nope'"):
        read_models_config(settings_for(write_config(tmp_path / "a.toml", ggufs, default="nope")))
    bad = tmp_path / "b.toml"
    bad.write_text("[server]\nprot = 8080\n")
    with pytest.raises(ConfigError, match="unknown setting 'prot'"):
        settings_for(bad)


def test_requests_route_by_name_and_alias_and_models_answer_differently(served: tuple[TestClient, Path]) -> None:
    client, _ = served
    answers = {}
    for name in ("one", "two", "three"):
        by_name, by_alias = ask(client, name), ask(client, f"{name}-alias")
        assert by_name.status_code == 200, by_name.text
        assert by_name.json()["model"] == by_alias.json()["model"] == name
        assert by_name.json()["answers"] == by_alias.json()["answers"]
        answers[name] = by_name.json()["answers"]["q"]["probabilities"]
    assert answers["one"] != answers["two"] != answers["three"] != answers["one"]
    assert ask(client, "jev-latest").json()["model"] == "one"


def test_unknown_names_get_404_listing_every_name(served: tuple[TestClient, Path]) -> None:
    client, _ = served
    response = ask(client, "four")
    assert response.status_code == 404
    assert response.json()["detail"]["message"] == (
        "model 'four' is not served here; known models: one, one-alias, two, two-alias, three, three-alias, jev-latest"
    )


def test_models_lists_every_name_with_its_load_state_and_settings(served: tuple[TestClient, Path]) -> None:
    client, _ = served
    listing = client.get("/v1/models").json()
    names = [m["name"] for m in listing["models"]]
    assert names == ["one", "one-alias", "two", "two-alias", "three", "three-alias", "jev-latest"]
    assert [d["id"] for d in listing["data"]] == names
    loaded = {m["name"]: m["x_loaded"] for m in listing["models"]}
    assert loaded["one"] and not loaded["two"] and not loaded["three"]  # the default loads at startup
    assert listing["models"][0]["x_n_ctx"] == 2048


def test_at_most_models_max_stay_resident_least_recently_used_first(served: tuple[TestClient, Path]) -> None:
    client, _ = served
    ask(client, "two")
    ask(client, "three")  # one, two, three: one is the least recently used
    loaded = {m["name"]: m["x_loaded"] for m in client.get("/v1/models").json()["models"]}
    assert (loaded["one"], loaded["two"], loaded["three"]) == (False, True, True)
    assert set(client.get("/v1/cache").json()) == {"two", "three"}


def test_load_and_unload_routes(served: tuple[TestClient, Path]) -> None:
    client, _ = served
    assert client.post("/v1/models/two-alias/load").json() == {"name": "two", "loaded": True}
    assert client.post("/v1/models/two/unload").json() == {"name": "two", "unloaded": True}
    assert client.post("/v1/models/two/unload").json() == {"name": "two", "unloaded": False}
    assert client.post("/v1/models/nope/load").status_code == 404


def test_each_model_has_its_own_cache(served: tuple[TestClient, Path]) -> None:
    client, _ = served
    assert ask(client, "one", "shared state").json()["x_cache"] == "miss"
    assert ask(client, "two", "shared state").json()["x_cache"] == "miss"
    assert ask(client, "one", "shared state").json()["x_cache"] == "hit"
    stats = client.get("/v1/cache").json()
    assert stats["one"]["hits"] == 1 and stats["two"]["hits"] == 0


def test_reload_adds_removes_and_rejects(served: tuple[TestClient, Path], ggufs: dict[str, Path]) -> None:
    client, config = served
    write_config(config, ggufs, names=("one", "two"))
    assert client.post("/v1/config/reload").json() == {
        "reloaded": True,
        "added": [],
        "removed": ["three"],
        "changed": [],
        "settings_changed": [],
        "needs_restart": [],
    }
    assert ask(client, "three").status_code == 404
    write_config(config, ggufs, names=("one", "two", "three"))
    assert client.post("/v1/config/reload").json()["added"] == ["three"]
    assert ask(client, "three").status_code == 200
    config.write_text(config.read_text() + '[[models]]\nname = "two"\npath = "dup.gguf"\n')
    rejected = client.post("/v1/config/reload")
    assert rejected.status_code == 400
    assert rejected.json()["detail"]["error_type"] == "invalid_config"
    assert "used twice" in rejected.json()["detail"]["message"]
    assert ask(client, "three").status_code == 200  # the previous config keeps serving


def test_a_reload_keeps_flag_over_env_over_file_and_reports_what_changed(
    tmp_path: Path, ggufs: dict[str, Path]
) -> None:
    config = write_config(tmp_path / "onepass.toml", ggufs, models_max=2)
    source = SettingsSource(("--config", str(config), "--models-max", "3"), {"ONEPASS_MAX_QUEUE": "7"})
    app = create_app(source.load(), source=source)
    with TestClient(app) as client:
        assert app.state.runtime.loaded.wait(30)
        edited = "threads = 1\nmax_questions = 1\nmax_queue = 9\nport = 9999"
        config.write_text(config.read_text().replace("models_max = 2", "models_max = 1").replace("threads = 1", edited))
        report = client.post("/v1/config/reload").json()
        assert report["settings_changed"] == ["max_questions"]  # the file's models_max and max_queue lose
        assert report["needs_restart"] == ["port"]
        settings = app.state.runtime.settings
        assert (settings.models_max, settings.max_queue, settings.max_questions, settings.port) == (3, 7, 1, 8080)
        two = {"model": "one", "state": "s", "questions": {"a": QUESTION, "b": QUESTION}}
        assert client.post("/v1/systemone", json=two).status_code == 422  # the new limit is live


def test_a_server_started_with_a_model_alone_reloads_its_api_key_file(tmp_path: Path, ggufs: dict[str, Path]) -> None:
    keys = tmp_path / "keys"
    keys.write_text("first\n")
    source = SettingsSource(("-m", str(ggufs["one"]), "--api-key-file", str(keys), "-t", "1"), {})
    app = create_app(source.load(), source=source)
    with TestClient(app) as client:
        assert app.state.runtime.loaded.wait(30)
        assert client.get("/v1/models", headers={"Authorization": "Bearer first"}).status_code == 200
        keys.write_text("second\n")  # a key rotated: no config file, yet a reload applies it
        reloaded = client.post("/v1/config/reload", headers={"Authorization": "Bearer first"})
        assert reloaded.status_code == 200 and reloaded.json()["changed"] == [], reloaded.text
        assert reloaded.json()["settings_changed"] == ["api_key_file"]  # its keys, not its path
        assert client.get("/v1/models", headers={"Authorization": "Bearer first"}).status_code == 401
        assert client.get("/v1/models", headers={"Authorization": "Bearer second"}).status_code == 200


def test_a_changed_model_reloads_with_its_new_settings(served: tuple[TestClient, Path], ggufs: dict[str, Path]) -> None:
    client, config = served
    ask(client, "one")
    config.write_text(config.read_text().replace("n_ctx = 2048", "n_ctx = 1024", 1))
    assert client.post("/v1/config/reload").json()["changed"] == ["one"]
    assert ask(client, "one").status_code == 200
    one = next(m for m in client.get("/v1/models").json()["models"] if m["name"] == "one")
    assert one["x_n_ctx"] == 1024 and one["x_loaded"]


def test_a_missing_or_broken_model_file_is_503_for_that_model_only(tmp_path: Path, ggufs: dict[str, Path]) -> None:
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"GGUF but not really")
    config = write_config(
        tmp_path / "c.toml",
        ggufs,
        names=("one",),
        extra=(
            f'[[models]]\nname = "missing"\npath = "{tmp_path / "absent.gguf"}"\n\n'
            f'[[models]]\nname = "junk"\npath = "{junk}"\n'
        ),
    )
    app = create_app(settings_for(config))
    with TestClient(app) as client:
        assert app.state.runtime.loaded.wait(30)
        for name, reason in (("missing", "not found"), ("junk", "could not load")):
            response = ask(client, name)
            assert response.status_code == 503
            assert response.json()["detail"]["error_type"] == "model_unavailable"
            assert reason in response.json()["detail"]["message"]
        assert ask(client, "one").status_code == 200
        listed = {m["name"]: m["x_error"] for m in client.get("/v1/models").json()["models"]}
        assert "not found" in listed["missing"]


def test_a_model_is_never_unloaded_under_an_in_flight_request(ggufs: dict[str, Path]) -> None:
    specs = tuple(
        ModelSpec(name, ggufs[name], settings=isolated_settings(n_ctx=1024, threads=1, session_cache_disk_bytes=0))
        for name in ("one", "two")
    )
    entered, release = threading.Event(), threading.Event()

    def loader(spec: ModelSpec) -> ModelService:
        return load_spec(spec)

    registry = ModelRegistry(ModelsConfig(specs, "one", models_max=1), loader=loader)
    results: list[bool] = []

    def hold_one() -> None:
        with registry.lease("one") as service:
            entered.set()
            results.append(release.wait(60))
            results.append(service.engine.model is not None)  # still loaded while we hold it

    holder = threading.Thread(target=hold_one, daemon=True)
    holder.start()
    try:
        assert entered.wait(60), "the lease on 'one' was never granted"
        registry.load("two")  # over models_max, but "one" is busy: it stays until released
        assert set(registry.loaded()) == {"one", "two"}
    finally:
        release.set()
        holder.join(60)
    assert not holder.is_alive() and results == [True, True]
    assert set(registry.loaded()) == {"two"}
    registry.close()


def test_a_closed_registry_loads_no_model_again(ggufs: dict[str, Path]) -> None:
    """At shutdown the models close for good: a lease after close (a job's thread that outlived the
    jobs' cancelling) is refused, and a load under way when the registry closes is closed as it ends."""
    spec = ModelSpec("one", ggufs["one"], settings=isolated_settings(n_ctx=1024, threads=1, session_cache_disk_bytes=0))
    loading, release, loaded = threading.Event(), threading.Event(), list[ModelService]()

    def loader(spec: ModelSpec) -> ModelService:
        loading.set()
        assert release.wait(60)
        loaded.append(load_spec(spec))
        return loaded[-1]

    registry = ModelRegistry(ModelsConfig((spec,), "one", models_max=1), loader=loader)
    refused: list[Exception] = []

    def lease() -> None:
        try:
            with registry.lease("one"):
                pass
        except ModelUnavailable as error:
            refused.append(error)

    during = threading.Thread(target=lease, daemon=True)
    during.start()
    assert loading.wait(60)
    registry.close()  # while the model loads
    release.set()
    during.join(60)
    assert not during.is_alive() and len(refused) == 1 and "shutting down" in str(refused[0])
    assert registry.loaded() == {} and loaded[0].engine.model is None  # the model it loaded is closed
    with pytest.raises(ModelUnavailable, match="shutting down"):
        registry.load("one")
    assert len(loaded) == 1  # never loaded again
    with TestClient(create_app(isolated_settings(), registry=registry)) as client:
        refused_request = ask(client, "one")
    assert refused_request.status_code == 503
    assert refused_request.json()["detail"]["error_type"] == "model_unavailable"


def test_a_model_still_leased_at_close_closes_when_its_lease_ends_not_under_it(ggufs: dict[str, Path]) -> None:
    """A job's thread that outlived shutdown still holds a lease: its model stays whole until it lets go."""
    spec = ModelSpec("one", ggufs["one"], settings=isolated_settings(n_ctx=1024, threads=1, session_cache_disk_bytes=0))
    registry = ModelRegistry(ModelsConfig((spec,), "one", models_max=1), loader=load_spec)
    body = {"model": "one", "state": "Still leased at shutdown.", "questions": {"q": {"type": "noul"}}}
    with registry.lease("one") as service:
        registry.close()
        assert service.engine.model is not None  # not freed under the lease
        assert service.answer(SystemOneRequest.model_validate(body)).answers["q"].type == "noul"
    assert service.engine.model is None  # closed as the lease ended
    with pytest.raises(ModelUnavailable, match="shutting down"):
        registry.load("one")


def test_a_request_waiting_for_a_model_to_load_leaves_its_wait_once_stopped(ggufs: dict[str, Path]) -> None:
    spec = ModelSpec("one", ggufs["one"], settings=isolated_settings(n_ctx=1024, threads=1, session_cache_disk_bytes=0))
    loading, release = threading.Event(), threading.Event()

    def loader(spec: ModelSpec) -> ModelService:
        loading.set()
        assert release.wait(60)
        return load_spec(spec)

    registry = ModelRegistry(ModelsConfig((spec,), "one", models_max=1), loader=loader)
    gone = Caller("interactive", Signal())
    outcomes: dict[str, BaseException | None] = {}

    def lease(name: str, caller: Caller) -> None:
        try:
            with working_for(caller), registry.lease("one"):
                outcomes[name] = None
        except BaseException as error:  # the test reads it
            outcomes[name] = error

    first = threading.Thread(target=lease, args=("first", Caller()), daemon=True)
    first.start()
    assert loading.wait(60)
    second = threading.Thread(target=lease, args=("second", gone), daemon=True)
    second.start()
    gone.stop.set()  # its client leaves while the model loads for the first
    second.join(60)
    assert not second.is_alive() and isinstance(outcomes["second"], Cancelled)
    assert "first" not in outcomes  # still loading
    release.set()
    first.join(60)
    assert not first.is_alive() and outcomes["first"] is None
    registry.close()


def test_sighup_reloads_the_config(tmp_path: Path, ggufs: dict[str, Path]) -> None:
    config = write_config(tmp_path / "onepass.toml", ggufs, names=("one", "two"))
    server = ServerProcess(["--config", str(config)])
    try:
        server.wait_for(READY)  # the model loads after the port opens
        names = [m["name"] for m in httpx.get(f"{server.url}/v1/models").json()["models"]]
        assert "two" in names
        write_config(config, ggufs, names=("one", "three"))
        server.process.send_signal(signal.SIGHUP)
        server.wait_for("config reloaded")
        names = [m["name"] for m in httpx.get(f"{server.url}/v1/models").json()["models"]]
        assert "two" not in names and "three" in names
    finally:
        server.stop()
