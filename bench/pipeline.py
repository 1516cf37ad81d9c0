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
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

import httpx

from app.config import DEFAULT_MODEL_PATH, LAYOUTS
from app.engine.llama import Engine
from bench.client import ask, sized_text
from bench.output import Progress, median
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


def main() -> None:

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL_PATH)
    parser.add_argument("--states", type=int, default=40)
    args = parser.parse_args()
    found = pipeline(args.model, args.states, onepass_server)
    print(json.dumps(found, indent=2))
    print("\n".join(markdown(found)))


if __name__ == "__main__":
    main()
