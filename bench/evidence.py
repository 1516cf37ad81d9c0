"""Run labelled examples through a served model once and keep what calibration reads of each answer.

`python -m bench.evidence` answers the pipeline workloads (bench/pipelines.py) with the default model
as `make run` configures it and writes bench/results/calibration-evidence.json: per example and
question the raw label probabilities and the content-free prior, in the answer's label order, and
the right label; and beside it (`*.hidden.npz`, not committed: megabytes) each question's hidden
state and each state's mean (the middle layer's, Snapshot.state_mean), which the probe fits read.
bench/calibration_study.py fits and measures on them in seconds.
"""

from __future__ import annotations

import argparse
import io
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from app.answering.service import ModelService
from app.config_sources import DEFAULT_CONFIG_PATH, load_settings
from app.paths import REPO_ROOT
from app.serving.known_models import default_model_path
from app.serving.loading import load_spec
from app.serving.specs import ModelSpec, read_models_config
from app.wire.contract import SystemOneRequest
from bench.output import Progress, write_atomically
from bench.pipelines import WORKLOADS

OUT = REPO_ROOT / "bench" / "results" / "calibration-evidence.json"


def hidden_path(evidence: Path) -> Path:
    """Where the hidden states of an evidence file are: `<name>.hidden.npz` beside it."""
    return evidence.with_suffix(".hidden.npz")


def hidden_key(workload: str, item: int, qid: str) -> str:
    return f"{workload}/{item}/{qid}"


def state_mean_key(workload: str, item: int) -> str:
    """The key of an item's state mean (Snapshot.state_mean: one per state, what a state probe reads)."""
    return f"{workload}/{item}/state-mean"


def load_served(model: Path) -> tuple[ModelSpec, ModelService]:
    """`model` as `make run` configures it (state-first), with a small RAM cache and no disk tier."""
    flags = ["--n-ctx", "4096", "--session-cache-disk-bytes", "0", "--session-cache-entries", "4"]
    config = read_models_config(load_settings(flags, {}, default_config=DEFAULT_CONFIG_PATH))
    spec = next(s for s in config.models if s.path.resolve() == model.resolve() and s.settings.layout == "state-first")
    return spec, load_spec(spec)


def collect(
    model: Path, per_workload: int, seed: int, names: list[str] | None = None
) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    spec, service = load_served(model)
    found: dict[str, Any] = {
        "model": spec.name,
        "fingerprint": service.engine.fingerprint.hex(),
        "calibration_temperature": spec.settings.calibration_temperature,
        "seed": seed,
        "workloads": {},
    }
    chosen = [w for w in WORKLOADS if names is None or w.name in names]
    examples = [(w, e) for w in chosen for e in w.examples(per_workload, seed)]
    hidden: dict[str, np.ndarray] = {}
    progress = Progress(len(examples), f"evidence {spec.name}")
    began = time.perf_counter()
    try:
        for workload, example in examples:
            request = SystemOneRequest.model_validate(
                {"model": "jev-latest", "state": example["state"], "questions": example["questions"]}
            )
            evidence = service.evidence(request, hidden=True)
            rows = found["workloads"].setdefault(workload.name, {"questions": workload.questions, "items": []})
            for qid, e in evidence.items():
                assert e.hidden is not None and e.state_mean is not None
                hidden[hidden_key(workload.name, len(rows["items"]), qid)] = np.asarray(e.hidden, dtype=np.float32)
                hidden[state_mean_key(workload.name, len(rows["items"]))] = np.asarray(e.state_mean, dtype=np.float32)
            rows["items"].append(
                {
                    "state": example["state"],
                    "answers": example["answers"],
                    "evidence": {
                        qid: {"labels": e.labels, "raw": e.raw, "prior": e.prior} for qid, e in evidence.items()
                    },
                }
            )
            progress.step(workload.name)
    finally:
        service.close()
    found["seconds"] = round(time.perf_counter() - began, 1)
    return found, hidden


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=default_model_path())
    parser.add_argument("--per-workload", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workloads", nargs="*", help="only these (default: every workload)")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    found, hidden = collect(args.model, args.per_workload, args.seed, args.workloads)
    packed = io.BytesIO()
    save: Any = np.savez_compressed  # numpy's stubs do not type arrays passed by name
    save(packed, **hidden)
    write_atomically(hidden_path(args.out), packed.getvalue())
    write_atomically(args.out, json.dumps(found, indent=1))
    print(f"wrote {args.out} and {hidden_path(args.out)}")


if __name__ == "__main__":
    main()
