"""The CLI: `python -m app` (or `onepass`) serves System One answers over HTTP; `onepass calibrate`
fits calibrations to examples; `onepass label STATES.jsonl` serves with a labelling session."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import uvicorn

from app.config_sources import DEFAULT_CONFIG_PATH, ConfigError, SettingsSource
from app.engine.devices import backends, devices, gpu_layers_problem
from app.fitting.examples import ExampleError
from app.fleet.processes import listening_socket, url_of
from app.fleet.routing import replica_name
from app.http.server import create_app
from app.labelling.labels import LabelsFile, labels_path
from app.labelling.session import LabellingFiles, read_states
from app.platform.build_check import run_check
from app.serving.specs import read_models_config


def main(argv: Sequence[str] | None = None) -> None:
    given = list(sys.argv[1:] if argv is None else argv)
    if given[:1] == ["calibrate"]:
        from app.fitting.cli import main as calibrate  # loads a model itself: only for this command

        calibrate(given[1:])
        return
    if given[:1] == ["label"]:
        flags, files = labelling_files(given[1:])
        serve(flags, files)
        return
    serve(given)


def labelling_files(argv: Sequence[str]) -> tuple[list[str], LabellingFiles]:
    """`onepass label STATES.jsonl [--labels FILE] [server flags]`: the server flags, and the files."""
    parser = argparse.ArgumentParser(
        prog="onepass label",
        usage="onepass label STATES.jsonl [--labels FILE] [FLAG VALUE ...]",
        description="Serve as onepass does, with a labelling session for STATES.jsonl on the default model: "
        "label its states in the page's Label tab; each label is kept in the labels file as it is given.",
        epilog="The server's flags (--port, --model and the others `onepass -h` lists) follow STATES.jsonl.",
        allow_abbrev=False,
    )
    parser.add_argument("states", type=Path, help="JSON lines: {state, questions, answers?} per line")
    parser.add_argument("--labels", type=Path, help="the labels file (default: STATES.labels.jsonl beside it)")
    ours, flags = parser.parse_known_args(argv)
    if flags[:1] and flags[0].startswith("-") and not ours.states.is_file():  # `--port 8081 states.jsonl`
        sys.exit(f"onepass label: {ours.states} is not a states file: the states file comes first, then the flags")
    try:
        states = read_states(ours.states)
        labels = LabelsFile(ours.labels or labels_path(ours.states))
    except (ExampleError, OSError) as error:
        sys.exit(f"onepass label: {error}")
    return flags, LabellingFiles(states, labels)


def serve(given: list[str], labelling: LabellingFiles | None = None) -> None:
    try:
        source = SettingsSource(tuple(given), dict(os.environ), DEFAULT_CONFIG_PATH)
        settings = source.load()
        models = read_models_config(settings)  # a config with errors stops us before binding the port
    except (ValueError, ConfigError) as error:  # a malformed ONEPASS_* value or config file
        sys.exit(f"onepass: {error}")
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    default = next(spec for spec in models.models if spec.name == models.default_model)
    if not default.path.is_file():
        sys.exit(f"onepass: model file {default.path} not found (run `make model`, or pass --model PATH)")
    started = logging.getLogger("onepass")
    started.info("config: %s", settings.config or "none (--model alone)")
    for spec in models.models:
        started.info("model %s", spec.summary())
    problem = run_check()  # a llama.cpp built for another CPU explains itself here, not with SIGILL later
    if problem is not None:
        sys.exit(problem)
    started.info("llama.cpp backends: %s; devices: %s", ", ".join(backends()), "; ".join(map(str, devices())))
    for spec in models.models:  # layers asked for and no GPU to put them on: say so, do not run on the CPU
        problem = gpu_layers_problem(spec.settings.n_gpu_layers)
        if problem is not None:
            sys.exit(f"onepass: model {spec.name}: {problem}")
    # We bind the socket ourselves so that with --port 0 the port the OS picked can be logged.
    try:
        listener = listening_socket(settings.host, settings.port)
    except OSError as error:
        sys.exit(f"onepass: cannot listen on {settings.host}:{settings.port}: {error.strerror}")
    url = url_of(listener)
    port = listener.getsockname()[1]
    started.info("listening on %s", url)
    if not settings.no_ui:
        started.info("try it in a browser: %s/", url)
    if labelling is not None:  # on stdout: what the user of `onepass label` needs, whatever the log level
        page = f"{url}/#label" if not settings.no_ui else f"{url}/v1/labelling (the page is off: --no-ui)"
        print(f"label the states of {labelling.states.path} at {page}", flush=True)
        print(f"labels are kept in {labelling.labels.path}", flush=True)
    app = create_app(settings, source=source, replica=replica_name(settings.replica_name, port), labelling=labelling)
    config = uvicorn.Config(
        app,
        log_level=settings.log_level.lower(),
        access_log=False,  # RequestObserver logs one JSON line per request, with more in it
        timeout_graceful_shutdown=int(settings.shutdown_timeout),
    )
    uvicorn.Server(config).run(sockets=[listener])


if __name__ == "__main__":
    main()
