"""Where a fit cannot reach a policy, ask its facts: the support workload's priority asked as its facts.

The support priority (bench/pipelines.py) is an additive policy over several facts of a ticket: P1
when an Enterprise customer cannot work at all; P2 when the customer has waited more than 7 days or
more than $500 is at stake; P3 when the customer is angry; P4 otherwise. A fit of the priority
question alone stays well below the other questions (docs/calibration.md). This asks each fact as a
yes/no question of its own about the same tickets, with the served default model, and keeps what
calibration reads of each answer (raw probabilities and content-free prior; no hidden vectors: the
question-set fit reads the answers' ratios), in bench/results/priority-facts-evidence.json.

    .venv/bin/python -m bench.priority_facts [--fit 100]

The tickets are those of bench/results/calibration-evidence.json (seed 0: the first `--fit` items,
to fit on) and calibration-evidence-test.json (seed 1, less the tickets seen in the first: held out),
whose evidence for escalate, queue and priority is reused. bench/labelling.py fits and scores them.
"""

from __future__ import annotations

import argparse
import json
import re
import time
from pathlib import Path
from typing import Any

from app.paths import REPO_ROOT
from app.serving.known_models import default_model_path
from app.wire.contract import SystemOneRequest
from bench.evidence import OUT as EVIDENCE
from bench.evidence import load_served
from bench.output import Progress, write_atomically
from bench.pipelines import ANGRY, BLOCKED, PROBLEMS

TEST = REPO_ROOT / "bench" / "results" / "calibration-evidence-test.json"
OUT = REPO_ROOT / "bench" / "results" / "priority-facts-evidence.json"

FACTS: dict[str, Any] = {
    "enterprise": {"type": "noul", "instructions": "Is the customer on the Enterprise plan?"},
    "blocked": {"type": "noul", "instructions": "Does the customer say they cannot work at all?"},
    "waited": {"type": "noul", "instructions": "Did the customer first write more than 7 days ago?"},
    "money": {"type": "noul", "instructions": "Is more than $500 at stake in this ticket?"},
    "angry": {"type": "noul", "instructions": "Is the customer angry?"},
}


def facts_of(ticket: str) -> dict[str, bool]:
    """Each fact's right answer, read back from the ticket's text: bench/pipelines.py writes every fact
    in a phrase of its own (the plan in brackets, a BLOCKED or ANGRY sentence, the days waited, a
    billing problem with its amount)."""
    days = re.search(r"wrote to you (\d+) day", ticket)
    amount = re.search(r"\$(\d+)", ticket)
    billing = any(problem.split("{")[0] in ticket for problem in PROBLEMS["Billing"])
    if days is None:
        raise ValueError(f"not a support ticket of bench/pipelines.py: {ticket[:60]!r}")
    return {
        "enterprise": ticket.startswith("[Enterprise plan]"),
        "blocked": any(sentence in ticket for sentence in BLOCKED),
        "waited": int(days.group(1)) > 7,
        "money": billing and amount is not None and int(amount.group(1)) > 500,
        "angry": any(sentence in ticket for sentence in ANGRY),
    }


def priority_of(facts: dict[str, bool]) -> int:
    """The support priority's policy over its facts, as bench/pipelines.py computes it (0 = P4 ... 3 = P1)."""
    if facts["enterprise"] and facts["blocked"]:
        return 3
    if facts["waited"] or facts["money"]:
        return 2
    return 1 if facts["angry"] else 0


def tickets(n_fit: int) -> dict[str, list[str]]:
    """The support tickets to ask about: those fitted on (seed 0) and those held out (seed 1, unseen)."""
    fit = [item["state"] for item in json.loads(EVIDENCE.read_text())["workloads"]["support"]["items"][:n_fit]]
    seen = set(fit)
    held = [i["state"] for i in json.loads(TEST.read_text())["workloads"]["support"]["items"] if i["state"] not in seen]
    return {"fit": fit, "held_out": held}


def collect(model: Path, states: dict[str, list[str]]) -> dict[str, Any]:
    spec, service = load_served(model)
    found: dict[str, Any] = {
        "model": spec.name,
        "fingerprint": service.engine.fingerprint.hex(),
        "questions": FACTS,
        "sets": {},
    }
    progress = Progress(sum(len(s) for s in states.values()), f"facts {spec.name}")
    began = time.perf_counter()
    try:
        for name, texts in states.items():
            rows = found["sets"].setdefault(name, [])
            for state in texts:
                request = SystemOneRequest.model_validate({"model": "jev-latest", "state": state, "questions": FACTS})
                evidence = service.evidence(request)
                rows.append(
                    {
                        "state": state,
                        "evidence": {
                            q: {"labels": e.labels, "raw": e.raw, "prior": e.prior} for q, e in evidence.items()
                        },
                    }
                )
                progress.step(name)
    finally:
        service.close()
    found["seconds"] = round(time.perf_counter() - began, 1)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=default_model_path())
    parser.add_argument("--fit", type=int, default=100, help="the first N tickets of seed 0 are fitted on")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    found = collect(args.model, tickets(args.fit))
    write_atomically(args.out, json.dumps(found, indent=1))
    print(f"wrote {args.out} ({found['seconds']} s)")


if __name__ == "__main__":
    main()
