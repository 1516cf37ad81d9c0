"""Accuracy and calibration of onepass on the labelled set in tests/eval/items.jsonl.

Every item goes through the real server path (Starlette app, validation, prompting, cache,
engine, scoring) in-process. With calibration on, each answer also carries the raw
probabilities (x_raw), so one run reports both "raw" and "calibrated" figures.

    python -m bench.eval [--model PATH] [--calibration contextual|none] [--limit N] [--out DIR]

Writes <out>/eval-<model>.json, .md and a reliability diagram .png.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from starlette.testclient import TestClient

from app.answering.decision import DecisionPrompter
from app.config import LAYOUTS, Settings
from app.config_sources import DEFAULT_CONFIG_PATH, load_settings
from app.http.server import create_app
from app.paths import REPO_ROOT
from app.serving.known_models import default_model_path
from app.serving.loading import load_spec
from app.serving.registry import ModelRegistry
from app.serving.specs import ModelSpec, read_models_config, replace_settings
from bench.figure import figure
from bench.output import Progress, write_atomically

ITEMS = REPO_ROOT / "tests" / "eval" / "items.jsonl"
N_BINS = 10


def top_answer(probabilities: Sequence[float]) -> int:
    """The most probable answer's index (the first of a tie)."""
    return max(range(len(probabilities)), key=probabilities.__getitem__)


@dataclass(frozen=True)
class Outcome:
    """One item's predicted distribution over its answers, and which one is right."""

    item_id: str
    kind: str
    category: str
    probabilities: list[float]
    correct: int
    label_mass: float

    @property
    def predicted(self) -> int:
        return top_answer(self.probabilities)

    @property
    def confidence(self) -> float:
        return max(self.probabilities)

    @property
    def right(self) -> bool:
        return self.predicted == self.correct

    @property
    def brier(self) -> float:
        return math.fsum((p - (i == self.correct)) ** 2 for i, p in enumerate(self.probabilities))


def load_items(path: Path = ITEMS, limit: int | None = None) -> list[dict[str, Any]]:
    items = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return items[:limit] if limit else items


def outcome(item: dict[str, Any], answer: dict[str, Any], raw: bool) -> Outcome:
    kind, expected = item["question"]["type"], item["answer"]
    if kind == "noul":
        p_yes = answer["x_raw"] if raw else answer["noul"]
        probabilities, correct = [p_yes, 1 - p_yes], 0 if expected else 1
    elif kind == "choice":
        by_name = answer["x_raw"] if raw else answer["probabilities"]
        names = list(item["question"]["criteria"])
        probabilities, correct = [by_name[n] for n in names], names.index(expected)
    else:
        by_level = answer["x_raw"] if raw else answer["probabilities"]
        probabilities, correct = [by_level[str(i)] for i in range(len(by_level))], expected
    return Outcome(item["id"], kind, item["category"], probabilities, correct, answer["x_label_mass"])


def reliability(outcomes: Sequence[Outcome]) -> list[dict[str, Any]]:
    """Bins of the top-answer confidence; ECE weighs each bin's |accuracy - confidence| by its size."""
    rows = []
    for b in range(N_BINS):
        low, high = b / N_BINS, (b + 1) / N_BINS
        members = [o for o in outcomes if low <= o.confidence < high or (b == N_BINS - 1 and o.confidence == 1.0)]
        rows.append(
            {
                "bin": f"{low:.1f}-{high:.1f}",
                "count": len(members),
                "confidence": statistics.fmean(o.confidence for o in members) if members else None,
                "accuracy": statistics.fmean(o.right for o in members) if members else None,
            }
        )
    return rows


def metrics(outcomes: Sequence[Outcome]) -> dict[str, Any]:
    table = reliability(outcomes)
    ece = math.fsum(r["count"] * abs(r["accuracy"] - r["confidence"]) for r in table if r["count"]) / len(outcomes)
    masses = sorted(o.label_mass for o in outcomes)
    return {
        "items": len(outcomes),
        "accuracy": statistics.fmean(o.right for o in outcomes),
        "accuracy_by_type": {
            kind: statistics.fmean(o.right for o in outcomes if o.kind == kind)
            for kind in ("noul", "choice", "score")
            if any(o.kind == kind for o in outcomes)
        },
        "brier": statistics.fmean(o.brier for o in outcomes),
        "ece": ece,
        "reliability": table,
        "label_mass": {
            "mean": statistics.fmean(masses),
            "min": masses[0],
            "p10": masses[len(masses) // 10],
            "median": statistics.median(masses),
        },
    }


def model_spec(model: Path, calibration: str, config: Path | None) -> ModelSpec:
    """The model as the server would configure it: its [[models]] entry in the config if it has one,
    else --model alone (both with the model file's own settings), with the eval's calibration and
    context size given as flags (which beat the entry)."""
    # no fits from the user's examples (a folder of its own): the eval measures what a question gets without one
    flags = ["--calibration", calibration, "--n-ctx", "4096", "--session-cache-disk-bytes", "0"]
    flags += ["--calibration-dir", str(Path(tempfile.gettempdir()) / "onepass-eval-no-fits")]
    if config is not None and config.is_file():
        for spec in read_models_config(load_settings([*flags, "--config", str(config)], {})).models:
            if spec.path.resolve() == model.resolve():
                return spec
    return read_models_config(load_settings([*flags, "--model", str(model)], {})).models[0]


def run(
    model: Path, calibration: str, limit: int | None, config: Path | None = None, layout: str | None = None
) -> dict[str, Any]:
    items = load_items(limit=limit)
    spec = model_spec(model, calibration, config)
    if layout is not None:
        spec = replace_settings(spec, layout=layout)
    settings = Settings(model=model)
    service = load_spec(spec)
    registry = ModelRegistry.serving(service, spec)
    # A decision model brings its own prompt and temperatures; the layout and temperature settings do not apply.
    decision = service.prompter if isinstance(service.prompter, DecisionPrompter) else None
    shown_layout = f"{decision.decision_type} decision" if decision else spec.settings.layout
    outcomes: dict[str, list[Outcome]] = {"raw": [], "calibrated": []}
    began = time.perf_counter()
    progress = Progress(len(items), f"eval {spec.name} ({shown_layout})")
    with TestClient(create_app(settings, registry=registry)) as client:
        for item in items:
            body = {"model": "jev-latest", "state": item["state"], "questions": {"q": item["question"]}}
            response = client.post("/v1/systemone", json=body)
            response.raise_for_status()
            answer = response.json()["answers"]["q"]
            if calibration == "contextual":
                outcomes["raw"].append(outcome(item, answer, raw=True))
                outcomes["calibrated"].append(outcome(item, answer, raw=False))
            else:
                outcomes["raw"].append(outcome(item, answer, raw=False))
            progress.step(item["id"])
    registry.close()
    return {
        "model": registry.default_name,
        "calibration": calibration,
        "calibration_temperature": decision.format.temperatures if decision else spec.settings.calibration_temperature,
        "layout": shown_layout,
        "seconds": round(time.perf_counter() - began, 1),
        "results": {name: metrics(found) for name, found in outcomes.items() if found},
        "misses": [o.item_id for o in outcomes["calibrated" if outcomes["calibrated"] else "raw"] if not o.right],
        "items": {name: [[o.item_id, o.probabilities, o.correct] for o in found] for name, found in outcomes.items()},
    }


def markdown(report: dict[str, Any]) -> str:
    lines = [
        f"# Eval: {report['model']}, {report.get('layout', 'state-first')} layout "
        f"({report['results'][next(iter(report['results']))]['items']} items, {report['seconds']} s)",
        "",
        "| | accuracy | noul | choice | score | Brier | ECE | label mass (mean) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, m in report["results"].items():
        by_type = m["accuracy_by_type"]
        lines.append(
            f"| {name} | {m['accuracy']:.3f} | "
            + " | ".join(f"{by_type[k]:.3f}" if k in by_type else "-" for k in ("noul", "choice", "score"))
            + f" | {m['brier']:.3f} | {m['ece']:.3f} | {m['label_mass']['mean']:.3f} |"
        )
    for name, m in report["results"].items():
        lines += [
            "",
            f"Reliability ({name}):",
            "",
            "| confidence bin | items | mean confidence | accuracy |",
            "|---|---|---|---|",
        ]
        for row in m["reliability"]:
            if row["count"]:
                lines.append(f"| {row['bin']} | {row['count']} | {row['confidence']:.3f} | {row['accuracy']:.3f} |")
    return "\n".join(lines) + "\n"


def plot(report: dict[str, Any], path: Path) -> None:
    with figure(path, (5, 5)) as ax:
        ax.plot([0, 1], [0, 1], linestyle="--", color="grey", label="perfect calibration")
        for name, m in report["results"].items():
            rows = [r for r in m["reliability"] if r["count"]]
            ax.plot(
                [r["confidence"] for r in rows],
                [r["accuracy"] for r in rows],
                marker="o",
                label=f"{name} (acc {m['accuracy']:.2f}, ECE {m['ece']:.3f})",
            )
        ax.set(
            xlabel="confidence of the top answer",
            ylabel="accuracy",
            xlim=(0, 1),
            ylim=(0, 1),
            title=f"Reliability: {report['model']}",
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=default_model_path())
    parser.add_argument("--calibration", choices=["contextual", "none"], default="contextual")
    parser.add_argument("--limit", type=int, help="only the first N items (a quick check)")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "bench" / "results")
    parser.add_argument(
        "--config",
        type=Path,
        default=DEFAULT_CONFIG_PATH,
        help="per-model settings (calibration temperature, template) come from here",
    )
    parser.add_argument("--layout", choices=LAYOUTS, help="the prompt layout (default: the model's in the config)")
    args = parser.parse_args()
    report = run(args.model, args.calibration, args.limit, args.config, args.layout)
    args.out.mkdir(parents=True, exist_ok=True)
    # model names contain dots: no Path.with_suffix
    named = report["layout"] != "state-first" and not report["layout"].endswith(" decision")
    stem = f"eval-{report['model']}" + (f"-{report['layout']}" if named else "")
    write_atomically(args.out / f"{stem}.json", json.dumps(report, indent=2) + "\n")
    write_atomically(args.out / f"{stem}.md", markdown(report))
    plot(report, args.out / f"{stem}.png")
    print(markdown(report))


if __name__ == "__main__":
    main()
