"""What the middle-layer tap (the state probe's vector, Snapshot.state_mean) costs, in-process.

Every engine onepass loads reads layer (n_layer - 1) // 2 through llama.cpp's eval callback
(app/engine/layer_tap.py). This loads the model twice, as served (with the tap) and without it, and
times the two in interleaved pairs on the same work: a state's prefill from the system prompt's
snapshot, and a hit (the state's snapshot restored, then one batched decode of the questions'
suffixes), for a few state lengths. Medians and the with / without ratios, and how many pairs read
the same logits bit for bit (on the CPU, all: reading a layer moves no number there).

.venv/bin/python -m bench.tap_cost [--model GGUF] [--pairs N]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from app.answering.service import distinct_suffixes
from app.config_sources import load_settings
from app.engine.engine import Engine
from app.engine.snapshot import Prefix
from app.serving.loading import load_spec, speed_settings_for
from app.serving.specs import ModelSpec
from app.wire.contract import SystemOneRequest
from bench.native_decision import DEFAULT_MODEL
from bench.native_speed import QUESTIONS
from bench.output import Progress, table
from bench.workloads import StateMaker

LENGTHS = (64, 256, 1024)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--pairs", type=int, default=8)
    parser.add_argument("--n-gpu-layers", type=int, default=0, help="layers on a GPU (a GPU build)")
    args = parser.parse_args()
    flags = ["--model", str(args.model), "--n-ctx", "4096", "--calibration", "none", "--session-cache-disk-bytes", "0"]
    flags += ["--n-gpu-layers", str(args.n_gpu_layers)]
    spec = ModelSpec.from_settings(load_settings(flags, {}))
    speed = speed_settings_for(spec)  # what the served engine got: the plain one gets the same
    served = load_spec(spec)
    tapped = served.engine
    plain = Engine(
        args.model,
        n_ctx=tapped.n_ctx,
        n_gpu_layers=args.n_gpu_layers,
        threads=speed.threads,
        contexts=1,
        repack=speed.repack,
        flash_attn=speed.flash_attn,
        probe_layer=None,
    )
    rows: list[list[object]] = []
    progress = Progress(len(LENGTHS) * args.pairs, "tap on / off, interleaved pairs")
    maker = StateMaker(tapped)
    try:
        for length in LENGTHS:
            spent: dict[str, list[float]] = {
                f"{work} {side}": [] for work in ("prefill", "hit") for side in ("on", "off")
            }
            same = 0  # pairs whose logits were the same bit for bit
            for pair in range(args.pairs):
                request = SystemOneRequest.model_validate(
                    {"model": "m", "state": maker.make(length), "questions": QUESTIONS}
                )
                plan = served.plan(request)
                suffixes = distinct_suffixes(v for _, _, reading in plan.questions for v in reading.variants)
                order = (("on", tapped), ("off", plain)) if pair % 2 == 0 else (("off", plain), ("on", tapped))
                answers = {}
                for side, engine in order:
                    head = Prefix(plan.prefix.tokens[: served.base.n_tokens])
                    base, _ = engine.prefill(head)
                    began = time.perf_counter()
                    snapshot, _ = engine.prefill(plan.prefix, base)
                    spent[f"prefill {side}"].append((time.perf_counter() - began) * 1000)
                    engine.prefill(head)  # the context now holds another prefix: the hit restores
                    began = time.perf_counter()
                    decoded = engine.decode_suffixes(snapshot, suffixes)
                    spent[f"hit {side}"].append((time.perf_counter() - began) * 1000)
                    answers[side] = [readout.label_logits for readout in decoded.readouts]
                same += answers["on"] == answers["off"]
                progress.step()
            medians = {key: statistics.median(values) for key, values in spent.items()}
            for work in ("prefill", "hit"):
                on, off = medians[f"{work} on"], medians[f"{work} off"]
                rows.append([str(length), work, f"{on:,.1f}", f"{off:,.1f}", f"{on / off:.3f}", f"{same}/{args.pairs}"])
    finally:
        plain.close()
        served.close()
    print("\n".join(table(["state tokens", "work", "tap on (ms)", "tap off (ms)", "on / off", "same logits"], rows)))


if __name__ == "__main__":
    main()
