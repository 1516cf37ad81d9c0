"""onepass's decision path against llama.cpp's own /v1/systemone, on the same decision GGUF.

    python -m bench.native_decision --server PATH/llama-server [--model GGUF] [--limit N]

llama.cpp's server answers decision models natively (tools/server/server-decision.cpp, in
releases newer than the one onepass runs; `make native-server` builds one). This serves one
decision GGUF with both, onepass with --calibration none (the file's temperatures, as llama.cpp
applies them) and both on the plain kernels, asks each every tests/eval item, and reports how
often they give the same answer and how far apart their probabilities are. They read the same
weights; they differ in llama.cpp build (kernels round differently across releases), in how a
JSON float is printed (docs/decision-models.md), and in how the prompt is cut into batches.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from app.answering.service import ModelService
from app.config import Settings
from app.paths import REPO_ROOT
from app.serving.loading import load_spec
from app.serving.specs import ModelSpec
from app.wire.contract import SystemOneRequest
from bench.eval import load_items
from bench.output import Progress, table
from bench.peer import llama_server

DEFAULT_MODEL = REPO_ROOT / "models" / "qwen2.5-coder-1.5b-instruct-q4_k_m-decision.gguf"


def probabilities(answer: Mapping[str, Any]) -> dict[str, float]:
    """An answer's distribution over its labels, whichever server gave it."""
    if answer["type"] == "noul":
        return {"true": float(answer["noul"]), "false": 1 - float(answer["noul"])}
    return {key: float(p) for key, p in answer["probabilities"].items()}


@dataclass(frozen=True)
class Agreement:
    kind: str
    same_answer: bool
    largest_gap: float  # the largest difference between the two probabilities of any label


def agreement(kind: str, ours: Mapping[str, Any], theirs: Mapping[str, Any]) -> Agreement:
    mine, native = probabilities(ours), probabilities(theirs)
    if mine.keys() != native.keys():
        raise ValueError(f"the answers have different labels: {sorted(mine)} and {sorted(native)}")
    same = max(mine, key=mine.__getitem__) == max(native, key=native.__getitem__)
    return Agreement(kind, same, max(abs(mine[k] - native[k]) for k in mine))


def summary(found: Sequence[Agreement]) -> list[list[object]]:
    rows: list[list[object]] = []
    for kind in ["all", *sorted({a.kind for a in found})]:
        chosen = [a for a in found if kind in ("all", a.kind)]
        gaps = sorted(a.largest_gap for a in chosen)
        rows.append(
            [
                kind,
                str(len(chosen)),
                f"{sum(a.same_answer for a in chosen)}",
                f"{gaps[len(gaps) // 2]:.1e}",
                f"{gaps[int(0.9 * (len(gaps) - 1))]:.1e}",
                f"{gaps[-1]:.1e}",
            ]
        )
    return rows


def onepass_service(model: Path, threads: int) -> ModelService:
    settings = Settings(
        model=model,
        n_ctx=4096,
        threads=threads,
        calibration="none",
        repack="off",
        flash_attn="off",
        session_cache_disk_bytes=0,
    )
    return load_spec(ModelSpec.from_settings(settings))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", type=Path, required=True, help="a llama-server with /v1/systemone")
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--limit", type=int, help="only the first N items")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    items = load_items(limit=args.limit)
    service = onepass_service(args.model, args.threads)
    found: list[Agreement] = []
    ids: list[str] = []
    progress = Progress(len(items), f"onepass and llama-server on {args.model.name}")
    try:
        with (
            llama_server(args.server, args.model, 4096, args.threads, False, False) as peer,
            httpx.Client(timeout=600) as client,
        ):
            for item in items:
                body = {"state": item["state"], "questions": {"q": item["question"]}}
                response = client.post(peer.url + "/v1/systemone", json=body)
                response.raise_for_status()
                theirs = response.json()["answers"]["q"]
                ours = service.answer(SystemOneRequest.model_validate({"model": "m", **body})).wire()["answers"]["q"]
                found.append(agreement(item["question"]["type"], ours, theirs))
                ids.append(item["id"])
                progress.step(item["id"])
    finally:
        service.close()
    print(f"\n{args.model.name}: onepass's decision path against {args.server} (plain kernels, file temperatures)\n")
    header = ["questions", "n", "same answer", "median gap", "90th pct gap", "largest gap"]
    print("\n".join(table(header, summary(found))))
    apart = sorted(((a.largest_gap, i) for a, i in zip(found, ids, strict=True) if a.largest_gap > 0), reverse=True)
    print(f"\n{len(apart)} answers differ at all; the largest gaps: " + ", ".join(f"{i} {g:.1e}" for g, i in apart[:6]))


if __name__ == "__main__":
    main()
