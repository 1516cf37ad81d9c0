"""`onepass calibrate EXAMPLES.jsonl [server flags]`: fit calibrations to your examples and store them
where the server finds them (its calibration_dir); writes a Markdown report and a reliability PNG."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from app.config import LAYOUTS
from app.config_sources import DEFAULT_CONFIG_PATH, ConfigError, load_settings
from app.engine.devices import gpu_layers_problem
from app.errors import ModelNotFound
from app.fitting.examples import ExampleError, UserExample, read_examples
from app.fitting.layouts import LayoutRun, recommend
from app.fitting.layouts import markdown as compared
from app.fitting.report import markdown, reliability_png
from app.fitting.runner import answer_all, fit_all, journal_for, served_seconds, store_all
from app.progress import Progress
from app.serving.loading import load_spec
from app.serving.specs import ModelSpec, read_models_config

# Examples answered again as new states, with the fits stored, to measure what a new state costs as served.
SERVED_SAMPLE = 5


def main(argv: Sequence[str]) -> None:
    parser = argparse.ArgumentParser(
        prog="onepass calibrate",
        description="Fit calibrations to your examples (JSON lines: state, questions, answers) and store them "
        "for the server. Any server flag after the file chooses the model and its settings.",
        allow_abbrev=False,
    )
    parser.add_argument("examples", type=Path, help="JSON lines: {state, questions, answers?} per line")
    parser.add_argument("--report", type=Path, help="the Markdown report (default: EXAMPLES.report.md)")
    parser.add_argument(
        "--question-set",
        action="store_true",
        help="also try fits that read every question's answer about the same state (opt-in: such an answer then "
        "depends on the other questions, and the fit applies only when a request asks the whole set)",
    )
    parser.add_argument(
        "--layout",
        choices=(*LAYOUTS, "both"),
        help="the prompt layout to fit in (default: the model's); both: fit in each, store both sets of fits, "
        "compare them and say which to serve",
    )
    parser.add_argument(
        "--serve-model",
        help="which model to fit: any name a request's model may be (a model's name, an alias, jev-latest; "
        "default: the default model)",
    )
    ours, server_flags = parser.parse_known_args(argv)
    try:
        settings = load_settings(server_flags, dict(os.environ), DEFAULT_CONFIG_PATH)
        config = read_models_config(settings)
        examples = read_examples(ours.examples.read_text(encoding="utf-8"))
    except (ConfigError, ExampleError, ValueError, OSError) as error:
        sys.exit(f"onepass calibrate: {error}")
    try:
        spec = config.spec(ours.serve_model or config.default_model)
    except ModelNotFound as error:
        sys.exit(f"onepass calibrate: {error}")
    problem = gpu_layers_problem(spec.settings.n_gpu_layers)
    if problem is not None:
        sys.exit(f"onepass calibrate: model {spec.name}: {problem}")
    layouts = list(LAYOUTS) if ours.layout == "both" else [ours.layout or spec.settings.layout]
    report = ours.report or ours.examples.with_suffix(".report.md")
    runs, text, failed = [], [], 0
    for layout in layouts:
        chosen = replace(spec, settings=replace(spec.settings, layout=layout))
        run, section, errors = fit_layout(chosen, examples, ours.question_set, report, len(layouts) > 1)
        runs.append(run)
        text.append(section)
        failed += errors
    if len(runs) == 2:
        verdict = recommend(*runs)
        text.append("\n".join(compared(runs, verdict)) + "\n")
        print(f"recommended layout: {verdict.layout} ({verdict.why}); serve it with {verdict.flag}")
    report.write_text("\n".join(text), encoding="utf-8")
    print(f"report: {report}")
    if failed:
        sys.exit(f"onepass calibrate: {failed} question(s) could not be fitted (above); the other fits are stored")


def fit_layout(
    spec: ModelSpec, examples: list[UserExample], question_set: bool, report: Path, several: bool
) -> tuple[LayoutRun, str, int]:
    """Answer the examples with the model in `spec`'s layout, fit and store each question's calibration;
    (the run, its section of the report, how many questions failed). Prints what it did."""
    layout = spec.settings.layout
    began = time.monotonic()
    service = load_spec(spec)
    try:
        fits, journal = service.calibration.store, journal_for(service)
        assert fits is not None and journal is not None
        progress = Progress(len(examples), f"answering ({layout})" if several else "answering")
        try:
            answered = answer_all(service, examples, progress, journal=journal)
        except ExampleError as error:
            sys.exit(f"onepass calibrate: {error}")
        except KeyboardInterrupt:
            sys.exit(
                f"\nonepass calibrate: interrupted after {progress.done} of {len(examples)} examples; their evidence "
                f"is kept in {journal.folder}: run the same command again to resume"
            )
        if answered.reused:
            print(
                f"reused the evidence of {answered.reused} of {len(examples)} examples answered before "
                f"({journal.folder})"
            )
        reports, records = fit_all(examples, answered.evidence, service.calibration, question_set)
        stored, reports = store_all(fits, reports, records)
        served = served_seconds(service, examples, SERVED_SAMPLE)
    finally:
        service.close()
    shown = [r.to_json() for r in reports]
    title = f"{spec.name}, {layout}" if several else spec.name
    picture = report.with_suffix(f".{layout}.png" if several else ".png")
    drawn = reliability_png(shown, picture)
    section = markdown(shown, title, len(examples), time.monotonic() - began, answered.reused) + f"\n{drawn}\n"
    for r in shown:
        if r["error"]:
            print(f"{r['name']}: {r['labelled']} labelled, NOT FITTED: {r['error']}")
            continue
        verdict = f"adopted {r['method']}" if r["adopted"] else "kept contextual calibration"
        after = r["after"] or r["before"]
        accuracy = "" if after is None else f", accuracy {r['before']['accuracy']:.3f} -> {after['accuracy']:.3f}"
        print(f"{r['name']}: {r['labelled']} labelled, {verdict}{accuracy}")
        if r["warning"]:
            print(f"  warning ({r['name']}): {r['warning']}", file=sys.stderr)  # stderr alone still says which
    print(f"{len(stored)} fits stored in {fits.folder} ({layout})")
    print(drawn)
    print(
        json.dumps(
            {
                "layout": layout,
                "fits": [{"id": s.id, "key": s.key, "method": s.method, "examples": s.examples} for s in stored],
            }
        )
    )
    per_state = statistics.median(answered.seconds) if answered.seconds else None
    served_per_state = statistics.median(served) if served else None
    return LayoutRun(layout, shown, per_state, served_per_state), section, sum(1 for r in shown if r["error"])
