"""The pipeline scenario: many new states, the same three questions, in both prompt layouts.

A support-ticket triage: a 6-way queue `choice` with a line per option, a yes/no `noul`, and a
0-4 priority `score` with a policy sentence and a description per level (about 280 suffix
tokens in the state-first layout, four times a 64-token ticket). Each layout's server answers
the same new tickets; we report the first request (it also prefills the question set and
measures the calibration priors), the steady state, and each as a ratio to the engine's bare
prefill of the ticket plus its batched readout decode (both from `x_timing_ms`). Then the
other workloads, so the trade-off is visible: the same ticket again, and a seen ticket asked
new questions.

python -m bench.pipeline [--states N] [--model PATH]

With --fitted, the pipeline mode instead: a workload of bench/pipelines.py (support tickets unless
--workload says another) fitted with `onepass calibrate`'s own code in each layout on N labelled
tickets of one seed, scored on tickets of another seed (each layout with its own fits), and each
layout's cost per new ticket as that ticket's latency divided by its own prefill (x_timing_ms: the
limit is 1.0 plus the readouts still decoded), state-first, question-first, and question-first
through the batch route.

python -m bench.pipeline --fitted [--workload support|logs|guardrail] [--train N] [--test M] [--model PATH]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from datetime import date
from pathlib import Path
from typing import Any

import httpx

from app.config import LAYOUTS
from app.config_sources import load_settings
from app.engine.engine import Engine
from app.fitting.examples import parse_examples
from app.fitting.runner import answer_all, fit_all, journal_for, store_all
from app.serving.known_models import default_model_path
from app.serving.loading import load_spec
from app.serving.specs import ModelSpec
from bench.client import ask, sized_text
from bench.output import RESULTS, Progress, git_sha, median, write_atomically
from bench.pipelines import WORKLOADS, Example
from bench.servers import onepass_server

TRIAGE: dict[str, Any] = {
    "queue": {
        "type": "choice",
        "instructions": "Which support queue should handle this ticket?",
        "criteria": {
            "Billing": "charges, invoices, refunds, payment methods and plan prices",
            "Shipping": "parcels that are late, lost, damaged or sent to the wrong address",
            "Technical": "the app or website failing, errors, crashes, log-in problems",
            "Account": "changing the email, password, name or closing the account",
            "Returns": "sending an item back, exchanges and return labels",
            "Other": "anything that fits none of the queues above",
        },
    },
    "angry": {
        "type": "noul",
        "instructions": "Is the customer angry?",
        "criteria": {"true": "insults, threats to leave, capital letters or repeated complaints"},
    },
    "priority": {
        "type": "score",
        "instructions": "How urgent is this ticket? Our policy: money taken wrongly or a customer "
        "unable to use the service is urgent; questions about the future are not.",
        "criteria": [
            "No action needed: thanks, feedback or a closed matter",
            "Low: a question that can wait a week",
            "Normal: a problem to solve in the next two days",
            "High: money or access is affected today",
            "Critical: many customers affected or a legal threat",
        ],
    },
}
# A different set, for the "new questions" workload.
OTHER: dict[str, Any] = {
    "english": {"type": "noul", "instructions": "Is the ticket written in English?"},
    "sentiment": {"type": "choice", "criteria": {"positive": None, "neutral": None, "negative": None}},
}
TICKET = [
    "Hello, order {n} arrived with a cracked screen and the box was open.",
    "I was charged twice this month and nobody answers my emails.",
    "Can you tell me when the new plan prices start?",
    "The app logs me out every time I open the settings page.",
]


def tickets(engine: Engine, count: int, tokens: int = 64) -> list[str]:
    """`count` different tickets of about `tokens` tokens each."""
    return [sized_text(engine, TICKET, tokens, n, start=n) for n in range(count)]


def run_layout(client: httpx.Client, url: str, states: list[str], progress: Progress) -> dict[str, Any]:
    latencies, prefill_ms, decode_ms, suffix_tokens = [], [], [], 0
    for state in states:
        ms, data = ask(client, url, state, TRIAGE)
        timing = data["x_timing_ms"]
        latencies.append(ms)
        prefill_ms.append(timing["prefill"])  # the state's prefill
        decode_ms.append(timing["decode"])  # the batched suffixes (readouts)
        suffix_tokens = data["usage"]["input_tokens"]
        progress.step()
    repeated = [ask(client, url, states[-1], TRIAGE)[0] for _ in range(3)]
    new_questions = ask(client, url, states[-1], OTHER)[0]
    steady = latencies[1:]
    engine_ms = [a + b for a, b in zip(prefill_ms[1:], decode_ms[1:], strict=True)]
    return {
        "first_ms": round(latencies[0], 1),
        "steady_ms": median(steady),
        "steady_prefill_ms": median(prefill_ms[1:]),
        "steady_decode_ms": median(decode_ms[1:]),
        "steady_engine_prefill_plus_decode_ms": median(engine_ms),
        "steady_over_engine": round(statistics.median(steady) / statistics.median(engine_ms), 3),
        "input_tokens": suffix_tokens,
        "repeated_state_ms": median(repeated),
        "new_questions_ms": round(new_questions, 1),
    }


def pipeline(model: Path, count: int, start_server: Any) -> dict[str, Any]:
    """Both layouts; `start_server(model, *flags)` is bench.servers' onepass_server."""
    engine = Engine(model, n_ctx=512, contexts=1)  # the tokenizer, to size the tickets
    states = tickets(engine, count)
    engine.close()
    found: dict[str, Any] = {"states": count, "state_tokens": 64, "layouts": {}}
    progress = Progress(count * len(LAYOUTS), "pipeline")
    with httpx.Client(timeout=900) as client:
        for layout in LAYOUTS:
            with start_server(model, "--layout", layout) as (url, _):
                found["layouts"][layout] = run_layout(client, url, states, progress)
    state_first, question_first = (found["layouts"][name] for name in LAYOUTS)
    found["steady_speedup"] = round(state_first["steady_ms"] / question_first["steady_ms"], 2)
    # How far any readout could take the question-first layout: its requests minus the readouts'
    # decode is what every design that puts the questions before the state still pays.
    without_readouts = question_first["steady_ms"] - question_first["steady_decode_ms"]
    found["speedup_with_free_readouts"] = round(state_first["steady_ms"] / without_readouts, 2)
    found["readout_budget_for_3x_ms"] = round(state_first["steady_ms"] / 3 - without_readouts, 1)
    return found


def markdown(found: dict[str, Any]) -> list[str]:
    lines = [
        "",
        f"Pipeline: {found['states']} new tickets of ~{found['state_tokens']} tokens, the same 3 triage questions "
        "(latency in ms from the client; engine = the state's prefill + the batched decode, from x_timing_ms):",
        "",
        "| layout | first request | steady state | steady / engine | input tokens | same ticket again "
        "| seen ticket, new questions |",
        "|---|---|---|---|---|---|---|",
    ]
    for layout, r in found["layouts"].items():
        lines.append(
            f"| {layout} | {r['first_ms']} | {r['steady_ms']} | {r['steady_over_engine']} | {r['input_tokens']} "
            f"| {r['repeated_state_ms']} | {r['new_questions_ms']} |"
        )
    lines.append(f"\nquestion-first is {found['steady_speedup']}x faster per new ticket in the steady state.")
    lines.append(
        f"With readouts that cost nothing it would be {found['speedup_with_free_readouts']}x; 3x leaves the "
        f"readouts of the three questions {found['readout_budget_for_3x_ms']} ms of decode in all."
    )
    return lines


def fit_layout(model: Path, layout: str, train: list[Example], folder: Path) -> dict[str, Any]:
    """Fit the workload's questions in `layout` with onepass calibrate's code, fits kept in `folder`."""
    flags = ["--model", str(model), "--layout", layout, "--calibration-dir", str(folder)]
    flags += ["--n-ctx", "8192", "--session-cache-disk-bytes", "0"]
    spec = ModelSpec.from_settings(load_settings(flags, {}))
    service = load_spec(spec)
    try:
        parsed = parse_examples(train)
        progress = Progress(len(parsed), f"fitting ({layout})")
        answered = answer_all(service, parsed, progress, journal=journal_for(service))
        reports, records = fit_all(parsed, answered.evidence, service.calibration, question_set=False)
        assert service.calibration.store is not None
        store_all(service.calibration.store, reports, records)
    finally:
        service.close()
    return {
        "fits": {r.ids[0]: r.to_json()["method"] for r in reports},
        # none where every example's evidence was kept by an earlier run in the same --fits-dir
        "training_seconds_per_ticket": round(statistics.median(answered.seconds), 3) if answered.seconds else None,
        "training_reused": answered.reused,
    }


def picked(answer: dict[str, Any]) -> Any:
    """An answer as a label: true/false, an option name, a level index."""
    if answer["type"] == "noul":
        return answer["noul"] >= 0.5
    if answer["type"] == "choice":
        return answer["choice"]
    return max(range(len(answer["probabilities"])), key=lambda i: answer["probabilities"][str(i)])


def mark(right: dict[str, list[float]], answers: dict[str, Any], example: Example) -> None:
    """Add each answer's correctness (1.0 or 0.0) against the example's label to `right`, by question."""
    for qid, answer in answers.items():
        right.setdefault(qid, []).append(float(picked(answer) == example["answers"][qid]))


def accuracies(right: dict[str, list[float]]) -> dict[str, Any]:
    """Each question's accuracy and their mean, from `mark`'s record."""
    return {
        "accuracy": {qid: round(statistics.fmean(found), 4) for qid, found in right.items()},
        "mean_accuracy": round(statistics.fmean(statistics.fmean(found) for found in right.values()), 4),
    }


def serve_fitted(client: httpx.Client, url: str, test: list[Example], progress: Progress) -> dict[str, Any]:
    """Each held-out ticket, new to the server: its answers' accuracy, and its latency over its prefill."""
    right: dict[str, list[float]] = {}
    ratios, latencies, prefills, seen = [], [], [], 0
    for example in test:
        ms, data = ask(client, url, example["state"], example["questions"])
        mark(right, data["answers"], example)
        progress.step()
        if data["x_cache"] != "miss":  # a ticket whose state came before: no prefill, not a new ticket's cost
            seen += 1
            continue
        prefill = data["x_timing_ms"]["prefill"]
        latencies.append(ms)
        prefills.append(prefill)
        ratios.append(ms / prefill)
    return {
        **accuracies(right),
        "median_ms": median(latencies),
        "median_prefill_ms": median(prefills),
        "cost_over_prefill": round(statistics.median(ratios), 3),
        "new_tickets": len(ratios),
        "seen_tickets": seen,
        "layout": data["x_layout"],
    }


def batch_route(client: httpx.Client, url: str, test: list[Example]) -> dict[str, Any]:
    """The held-out tickets in one POST {"requests": [...]}: the cost per ticket over its prefill."""
    requests = [{"model": "jev-latest", "state": e["state"], "questions": e["questions"]} for e in test]
    began = time.perf_counter()
    response = client.post(url + "/v1/systemone", json={"requests": requests}, timeout=3600)
    response.raise_for_status()
    if response.status_code == 202:  # a batch larger than the server answers at once runs as a job
        job, deadline = url + response.headers["Location"], time.monotonic() + 3600
        while (status := client.get(job).json())["results"] is None:
            if status["status"] not in ("running", "done") or time.monotonic() > deadline:
                raise RuntimeError(f"the batch job ended {status['status']}: {status.get('error')}")
            time.sleep(0.5)  # polling a job the way a client does; the job's own clock is not involved
        results = status["results"]
    else:
        results = response.json()["results"]
    total_ms = (time.perf_counter() - began) * 1000
    prefills = [r["x_timing_ms"]["prefill"] for r in results]
    return {
        "items": len(results),
        "total_ms": round(total_ms, 1),
        "per_ticket_ms": round(total_ms / len(results), 1),
        "cost_over_prefill": round(total_ms / sum(prefills), 3),
    }


def fitted_pipeline(
    model: Path, n_train: int, n_test: int, start_server: Any, fits_dir: Path | None = None, workload: str = "support"
) -> dict[str, Any]:
    chosen = next(w for w in WORKLOADS if w.name == workload)
    train, test = chosen.examples(n_train, seed=0), chosen.examples(n_test, seed=1)
    found: dict[str, Any] = {"workload": workload, "train": n_train, "test": n_test, "layouts": {}}
    with tempfile.TemporaryDirectory(prefix="onepass-pipeline-fits-") as scratch, httpx.Client(timeout=900) as client:
        folder = str(fits_dir or scratch)
        for layout in LAYOUTS:
            found["layouts"][layout] = fit_layout(model, layout, train, Path(folder))
        progress = Progress(n_test * len(LAYOUTS), "held-out tickets")
        for layout in LAYOUTS:
            with start_server(model, "--layout", layout, "--calibration-dir", folder) as (url, _):
                ask(client, url, "A first ticket: the question set and the priors.", chosen.questions)
                found["layouts"][layout] |= serve_fitted(client, url, test, progress)
                if layout == "question-first":
                    found["batch"] = batch_route(client, url, chosen.examples(n_test, seed=2))
    state_first, question_first = (found["layouts"][name] for name in LAYOUTS)
    found["accuracy_gap"] = round(state_first["mean_accuracy"] - question_first["mean_accuracy"], 4)
    return found


def fitted_markdown(found: dict[str, Any]) -> list[str]:
    lines = [
        "",
        f"Pipeline mode, the {found['workload']} workload: fitted on {found['train']} labelled tickets (seed 0) "
        f"in each layout, {found['test']} held-out tickets (seed 1) new to each server, each layout with its fits "
        "(latency and cost over the tickets whose state was new; accuracy over all):",
        "",
        "| layout | held-out accuracy (mean of 3 questions) | median latency (ms) | median prefill (ms) "
        "| cost per ticket / its prefill | new / seen states | adopted fits |",
        "|---|---|---|---|---|---|---|",
    ]
    for layout, r in found["layouts"].items():
        fits = ", ".join(f"{q}: {m}" for q, m in r["fits"].items())
        lines.append(
            f"| {layout} | {r['mean_accuracy']} | {r['median_ms']} | {r['median_prefill_ms']} "
            f"| {r['cost_over_prefill']} | {r['new_tickets']} / {r['seen_tickets']} | {fits} |"
        )
    batch = found["batch"]
    lines += [
        "",
        f"question-first through the batch route ({batch['items']} new tickets in one POST): {batch['per_ticket_ms']} "
        f"ms a ticket, {batch['cost_over_prefill']} of their prefill.",
        f"Accuracy, state-first minus question-first: {found['accuracy_gap']}.",
    ]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=default_model_path())
    parser.add_argument("--states", type=int, default=40)
    parser.add_argument("--fitted", action="store_true", help="the pipeline mode: both layouts fitted, held out")
    parser.add_argument(
        "--workload", default="support", choices=[w.name for w in WORKLOADS], help="--fitted: the pipeline"
    )
    parser.add_argument("--train", type=int, default=100, help="--fitted: labelled tickets to fit on")
    parser.add_argument("--test", type=int, default=40, help="--fitted: held-out tickets")
    parser.add_argument(
        "--fits-dir", type=Path, help="--fitted: keep the fits and answered evidence here (a rerun reuses them)"
    )
    args = parser.parse_args()
    if args.fitted:
        found = fitted_pipeline(args.model, args.train, args.test, onepass_server, args.fits_dir, args.workload)
        lines = fitted_markdown(found)
        name = "pipeline-fitted" if args.workload == "support" else f"pipeline-fitted-{args.workload}"
    else:
        found = pipeline(args.model, args.states, onepass_server)
        lines = markdown(found)
        name = "pipeline"
    print(json.dumps(found, indent=2))
    print("\n".join(lines))
    stem = RESULTS / f"{date.today().isoformat()}-{git_sha()}-{name}"
    write_atomically(stem.with_suffix(".json"), json.dumps(found, indent=1))
    write_atomically(stem.with_suffix(".md"), "\n".join(lines).lstrip() + "\n")


if __name__ == "__main__":
    main()
