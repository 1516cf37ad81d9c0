"""What a probe fit costs at answer time: the same requests decoded with and without hidden states.

A request with a probe fit decodes with llama.cpp's hidden states on, which makes every suffix row
an output (the output layer then runs on each). `python -m bench.probe_cost` answers pipeline
requests (bench/pipelines.py) with the default model as `make run` serves it, each state once to
warm the cache, then alternately without and with hidden states, and reports the median time of
each and their ratio.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from app.serving.known_models import default_model_path
from app.wire.contract import SystemOneRequest
from bench.evidence import load_served
from bench.output import Progress
from bench.pipelines import WORKLOADS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=default_model_path())
    parser.add_argument("--per-workload", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    spec, service = load_served(args.model)
    requests = [
        SystemOneRequest.model_validate({"model": "jev-latest", "state": e["state"], "questions": e["questions"]})
        for w in WORKLOADS
        for e in w.examples(args.per_workload, seed=2)
    ]
    times: dict[bool, list[float]] = {False: [], True: []}
    progress = Progress(len(requests) * (1 + 2 * args.repeats), f"probe cost {spec.name}")
    try:
        for request in requests:
            service.evidence(request)  # prefills the state and measures the questions' priors
            progress.step("warm")
            for _ in range(args.repeats):
                for hidden in (False, True):
                    began = time.perf_counter()
                    service.evidence(request, hidden=hidden)
                    times[hidden].append((time.perf_counter() - began) * 1000)
                    progress.step("hidden" if hidden else "plain")
    finally:
        service.close()
    plain, probed = statistics.median(times[False]), statistics.median(times[True])
    print(
        f"{spec.name}, {len(requests)} requests (3 questions each) from the state tier, {args.repeats} times each: "
        f"median {plain:.0f} ms without hidden states, {probed:.0f} ms with them ({probed / plain:.2f}x)"
    )


if __name__ == "__main__":
    main()
