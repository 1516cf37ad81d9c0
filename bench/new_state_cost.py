"""Where a new state's time goes in onepass, in-process: the prefill, the suffix decode, the rest.

`make bench-native` finds onepass and llama-server close on new states. This answers the same
requests (bench/native_speed.py's three questions, states of ~80 tokens) in-process, each state
new and then once more, with the snapshot disk tier off and on, and reports each answer's
x_timing_ms: prefill, decode, and what the total spent outside them (saving the snapshot, the
disk tier's background write, calibrating, rendering).

python -m bench.new_state_cost [--model GGUF] [--states N]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from app.config_sources import load_settings
from app.serving.loading import load_spec
from app.serving.specs import ModelSpec
from app.wire.contract import SystemOneRequest
from bench.native_decision import DEFAULT_MODEL
from bench.native_speed import QUESTIONS
from bench.output import Progress, table
from bench.workloads import StateMaker


def measure(model: Path, disk: str, states: int) -> list[list[object]]:
    with tempfile.TemporaryDirectory(prefix="onepass-new-state-") as folder:
        flags = ["--model", str(model), "--n-ctx", "8192", "--calibration", "none"]
        flags += ["--session-cache-disk-bytes", disk, "--session-cache-dir", folder]
        service = load_spec(ModelSpec.from_settings(load_settings(flags, {})))
        found: dict[str, list[tuple[float, float, float]]] = {"miss": [], "hit": []}
        progress = Progress(2 * states, f"new states, disk tier {disk}")
        try:
            maker = StateMaker(service.engine)
            for _ in range(states):
                request = SystemOneRequest.model_validate(
                    {"model": "m", "state": maker.make(80), "questions": QUESTIONS}
                )
                for _ in range(2):
                    answer = service.answer(request)
                    timing = answer.x_timing_ms
                    rest = timing.total - timing.prefill - timing.decode
                    found[answer.x_cache].append((timing.prefill, timing.decode, rest))
                    progress.step()
        finally:
            service.close()
    rows: list[list[object]] = []
    for source, timings in found.items():
        medians = [statistics.median(t[i] for t in timings) for i in range(3)]
        rows.append([f"disk tier {disk}", source, str(len(timings)), *(f"{m:,.1f}" for m in medians)])
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--states", type=int, default=6)
    args = parser.parse_args()
    rows = [row for disk in ("0", "4G") for row in measure(args.model, disk, args.states)]
    header = ["setting", "x_cache", "answers", "prefill ms", "decode ms", "the rest ms (median)"]
    print("\n".join(table(header, rows)))


if __name__ == "__main__":
    main()
