"""The labelling loop, simulated on the project's pipelines: labels chosen by the ranking against labels
chosen at random, and the answer sets' coverage on items no fit saw.

Reads the stored evidence of the pipeline workloads (bench/evidence.py: the default model's answers,
hidden vectors beside them). Per workload, seed 0's items are the unlabelled states a user has; seeds
1 and 2's items whose states are not among them are held out. Two ways to choose which states get labels:

- ranked, as `onepass label` does: no fit at first; take the next BATCH states app/labelling/ranking.py
  offers (one in four drawn at random, on which the answer sets are calibrated; the others ranked by
  their answers as served now, with the fits so far, and their mean vectors), label them (the
  generator's right answers stand in for the user), refit as the fitting run does (app/fitting/
  runner.py's fit_all), and so on;
- random: the same numbers of states drawn at random from the pool, REPEATS draws each.

After 20, 40, 60 and 100 labels each question is scored on the held-out items as a request would be
answered (Calibration.answer_evidence): accuracy, and for a fitted question its 90% sets' coverage
and mean size. Beside the loop, what choosing can buy at all: one fixed learner after 40 labels
drawn at random, chosen by margin sampling, and chosen by an oracle that sees answers no user has
(what_choosing_buys). With bench/results/priority-facts-evidence.json (bench/priority_facts.py) it also
fits the support priority with its facts asked beside it (the question-set fit) on the first 100
items and scores it on the held-out ones. Writes bench/results/<date>-<sha>-labelling.{json,md}.

    .venv/bin/python -m bench.labelling [--repeats 10] [--workloads support logs]
"""

from __future__ import annotations

import argparse
import datetime
import json
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from app.calibration import Calibration, Evidence, FitRecord, FitsFound, FitStore, fits_among
from app.calibration.candidates import ProbeCandidate
from app.calibration.evidence import Example, example_of
from app.fitting.examples import UserExample
from app.fitting.runner import fit_all
from app.labelling.ranking import directions
from app.labelling.step import answered, content, drawn_states, picked, refit
from app.wire.contract import SystemOneRequest
from bench.calibration_study import TEST, fitting_at, load, load_hidden, parsed
from bench.evidence import OUT as EVIDENCE
from bench.output import RESULTS, Progress, git_sha, machine, table, write_atomically
from bench.priority_facts import FACTS, facts_of, priority_of
from bench.priority_facts import OUT as FACTS_EVIDENCE

# Held out: seeds 1 and 2 (make bench-labelling answers seed 2 where it is missing).
HELD_OUT = (TEST, TEST.with_name("calibration-evidence-test2.json"))
SIZES = (20, 40, 60, 100)
BATCH = 10
COVERAGE = 0.9
# The targets on this machine and the default model (issue 51, item 3).
COVERED = (0.87, 0.95)
SMALL_SET, SURE = 1.3, 0.95
# Random draws at max(SIZES) labels, where the coverage is judged: one draw's coverage moves by about
# 0.05 with which states set the bound, so that the mean of 10 draws still moves by 0.015.
COVERAGE_DRAWS = 30
# What choosing can buy on these pipelines, with one fixed learner (a state probe at MARGIN_PENALTY: no
# choice among fits, no drawn share), from MARGIN_START random labels one label at a time: the textbook
# way (margin sampling: the state whose two likeliest labels are closest), and an oracle no user has
# (of ORACLE_OFFERS pool states, the one whose label most raises accuracy on labelled states outside
# the pool), which sees answers no ranking has, so that no ranking should expect more. Pool: seed 0's first
# CHOICE_POOL states, so that its other states can be the oracle's yardstick.
MARGIN_PENALTY, MARGIN_START, MARGIN_RUNS, MARGIN_AT = 1e-4, 10, 3, 40
CHOICE_POOL, ORACLE_OFFERS = 150, 50


@dataclass
class Data:
    """One workload's pool (states a user has, with the answers a user would give) and held-out items."""

    questions: dict[str, Any]
    pool: tuple[list[UserExample], list[dict[str, Evidence]]]
    test: tuple[list[UserExample], list[dict[str, Evidence]]]
    # the pool's states as a states file holds them (state and questions): what decides which are drawn
    items: list[dict[str, Any]] = field(default_factory=list)


def workloads(names: Sequence[str] | None) -> tuple[dict[str, Data], float, str]:
    data = load(EVIDENCE)
    hidden = load_hidden(EVIDENCE)
    for path in HELD_OUT:
        if not path.is_file():
            raise SystemExit(f"{path} is missing: make bench-labelling answers it (bench/evidence.py)")
    tests = [(load(path), load_hidden(path)) for path in HELD_OUT]
    for path, (test, _) in zip(HELD_OUT, tests, strict=True):
        if test["fingerprint"] != data["fingerprint"]:
            raise SystemExit(f"{path} was answered by another model or build than {EVIDENCE}: answer it again")
    found = {}
    for name, workload in data["workloads"].items():
        if names and name not in names:
            continue
        seen = {item["state"] for item in workload["items"]}
        held_examples, held_evidence = [], []
        for test, test_hidden in tests:
            fresh = [i for i, item in enumerate(test["workloads"][name]["items"]) if item["state"] not in seen]
            examples, evidence = parsed(name, test["workloads"][name], test_hidden, fresh)
            held_examples += examples
            held_evidence += evidence
        pool = parsed(name, workload, hidden)
        found[name] = Data(workload["questions"], pool, (held_examples, held_evidence), states_of(workload))
    return found, float(data["calibration_temperature"]), str(data["fingerprint"])


def states_of(workload: dict[str, Any]) -> list[dict[str, Any]]:
    """A workload's states as a states file for `onepass label` holds them: each state with the questions."""
    return [{"state": item["state"], "questions": workload["questions"]} for item in workload["items"]]


def fitted(
    calibration: Calibration, examples: list[UserExample], evidence: list[dict[str, Evidence]]
) -> dict[str, FitRecord]:
    _, records = fit_all(examples, evidence, calibration, question_set=False)
    return {record.key: record for record in records}


def fits_of(records: dict[str, FitRecord], request: SystemOneRequest) -> FitsFound:
    """The fits that answer the request's questions, as a served model finds them: a question-set fit
    where the request asks its whole set, else the question's own."""
    single = {r.key: r for r in records.values() if r.question_set is None}
    return FitsFound(fits_among(request.questions, records.values(), single.get))


Pair = tuple[list[UserExample], list[dict[str, Evidence]]]


def scored(calibration: Calibration, records: dict[str, FitRecord], test: Pair) -> dict[str, dict[str, Any]]:
    """Each question on the held-out items, answered as a request would be: accuracy; a fitted
    question's 90% sets' coverage and mean size."""
    examples, evidence = test
    request = examples[0].request
    fits = fits_of(records, request)
    rows: dict[str, dict[str, list[float]]] = {q: {"right": [], "covered": [], "size": []} for q in request.questions}
    for example, row in zip(examples, evidence, strict=True):
        for qid, answer in calibration.answer_evidence(request.questions, row, fits, COVERAGE).items():
            if qid not in example.answers:  # asked beside the labelled questions (a policy's facts)
                continue
            right = example.answers[qid]
            rows[qid]["right"].append(float(int(np.argmax(answer.probabilities)) == right))
            if answer.answer_set is not None:
                rows[qid]["covered"].append(float(right in answer.answer_set))
                rows[qid]["size"].append(float(len(answer.answer_set)))
    found = {}
    for qid, got in rows.items():
        if not got["right"]:
            continue
        record = fits.by_id.get(qid)
        found[qid] = {
            "method": record.method if record else "contextual",
            "accuracy": float(np.mean(got["right"])),
            "coverage": float(np.mean(got["covered"])) if got["covered"] else None,
            "size": float(np.mean(got["size"])) if got["size"] else None,
        }
    return found


def ranked(calibration: Calibration, data: Data, sizes: Sequence[int], progress: Progress) -> dict[int, Any]:
    """The loop `onepass label` runs, labels standing in for the user's: its step (app/labelling/step.py)
    of answering the states with the fits stored now, picking a batch, and refitting, with the fits
    stored in a folder of their own as a served model's are."""
    examples, evidence = data.pool
    request = examples[0].request
    unit = directions([next(iter(row.values())).state_mean for row in evidence])
    offered = drawn_states([content(item) for item in data.items])
    examples = [replace(e, drawn=i in set(offered)) for i, e in enumerate(examples)]
    labelled: list[int] = []
    found = {}
    with tempfile.TemporaryDirectory(prefix="bench-labelling-") as folder:
        fits = FitStore(Path(folder), "bench")
        stored = Calibration(calibration.mode, calibration.temperature, calibration.priors, fits, COVERAGE)
        while len(labelled) < max(sizes):
            answers = [answered(stored, request.questions, row, same_set=False) for row in evidence]
            upto = min(size for size in sizes if size > len(labelled))
            labelled += picked(answers, unit, labelled, min(BATCH, upto - len(labelled)), offered)
            refit(stored, [examples[i] for i in labelled], [evidence[i] for i in labelled])
            if len(labelled) in sizes:
                found[len(labelled)] = scored(calibration, {r.key: r for r in fits.records()}, data.test)
                progress.step(f"ranked {len(labelled)}")
    return found


def at_random(
    calibration: Calibration, data: Data, sizes: Sequence[int], repeats: int, progress: Progress
) -> dict[int, Any]:
    """The same numbers of labels drawn at random: each question's scores averaged over `repeats` draws
    (COVERAGE_DRAWS at the largest size)."""
    examples, evidence = data.pool
    rng = np.random.default_rng(0)
    found = {}
    for size in sizes:
        runs = []
        for _ in range(draws_at(size, repeats)):
            chosen = sorted(int(i) for i in rng.choice(len(examples), size, replace=False))
            records = fitted(calibration, [examples[i] for i in chosen], [evidence[i] for i in chosen])
            runs.append(scored(calibration, records, data.test))
            progress.step(f"random {size}")
        found[size] = {qid: averaged([run[qid] for run in runs]) for qid in runs[0]}
    return found


def draws_at(size: int, repeats: int) -> int:
    return max(repeats, COVERAGE_DRAWS) if size == max(SIZES) else repeats


def averaged(runs: list[dict[str, Any]]) -> dict[str, Any]:
    def mean(key: str) -> float | None:
        values = [run[key] for run in runs if run[key] is not None]
        return float(np.mean(values)) if values else None

    methods = sorted({run["method"] for run in runs})
    return {
        "method": ", ".join(methods),
        "accuracy": mean("accuracy"),
        "coverage": mean("coverage"),
        "coverage_sd": float(np.std(covered))
        if (covered := [r["coverage"] for r in runs if r["coverage"] is not None])
        else None,
        "size": mean("size"),
        "draws": len(runs),
    }


def what_choosing_buys(temperature: float, data: Data, progress: Progress) -> dict[str, dict[str, float]] | None:
    """Per question, one fixed state probe's held-out accuracy on MARGIN_AT labels drawn at random,
    chosen by margin sampling, and chosen by the oracle; and on max(SIZES) random ones. All from the
    pool's first CHOICE_POOL states; the oracle's yardstick is the pool's other states. None without the
    states' mean vectors."""
    if not has_vectors(data):
        return None
    examples, evidence = data.pool
    inside = {str(e.request.state) for e in examples[:CHOICE_POOL]}
    yardstick = [i for i in range(CHOICE_POOL, len(examples)) if str(examples[i].request.state) not in inside]
    found = {}
    for qid in examples[0].request.questions:
        labels = sorted(evidence[0][qid].labels)
        every = [example_of(row[qid], e.answers[qid], labels) for e, row in zip(examples, evidence, strict=True)]
        test = [example_of(row[qid], e.answers[qid], labels) for e, row in zip(*data.test, strict=True)]
        learner = ProbeCandidate(temperature, MARGIN_PENALTY, "state_mean")
        found[qid] = _choosing_runs(learner, every[:CHOICE_POOL], [every[i] for i in yardstick], test)
        progress.step(f"choosing {qid}")
    return found


def has_vectors(data: Data) -> bool:
    """Whether every pool state has its mean vector, which the choosing section's probe reads."""
    return all(next(iter(row.values())).state_mean is not None for row in data.pool[1])


def _choosing_runs(
    learner: ProbeCandidate, pool: list[Example], yardstick: list[Example], test: list[Example]
) -> dict[str, float]:
    def probabilities(chosen: list[int], on: list[Example]) -> NDArray[np.float64]:
        fit = learner.fit([pool[i] for i in chosen])
        return np.asarray([fit.apply_to_state(e.labels, e.state_mean) for e in on])

    def accuracy(chosen: list[int], on: list[Example]) -> float:
        return float(np.mean(probabilities(chosen, on).argmax(1) == np.asarray([e.right for e in on])))

    def margin_next(chosen: list[int]) -> int:
        top = np.sort(probabilities(chosen, pool), axis=1)
        margin = top[:, -1] - top[:, -2]
        margin[chosen] = np.inf
        return int(np.argmin(margin))

    def oracle_next(chosen: list[int]) -> int:  # of ORACLE_OFFERS drawn with the runs' rng
        offered = rng.choice([i for i in range(len(pool)) if i not in chosen], ORACLE_OFFERS, replace=False)
        return max((accuracy([*chosen, int(i)], yardstick), int(i)) for i in offered)[1]

    rng = np.random.default_rng(0)
    drawn = {
        n: [[int(i) for i in rng.choice(len(pool), n, replace=False)] for _ in range(MARGIN_RUNS)]
        for n in (MARGIN_AT, max(SIZES))
    }
    found = {f"random_{n}": float(np.mean([accuracy(c, test) for c in runs])) for n, runs in drawn.items()}
    for way, next_of in (("margin", margin_next), ("oracle", oracle_next)):
        runs = []
        for _ in range(MARGIN_RUNS):
            chosen = [int(i) for i in rng.choice(len(pool), MARGIN_START, replace=False)]
            while len(chosen) < MARGIN_AT:
                chosen.append(next_of(chosen))
            runs.append(accuracy(chosen, test))
        found[f"{way}_{MARGIN_AT}"] = float(np.mean(runs))
    return found


def with_facts(calibration: Calibration, data: Data, n_fit: int) -> dict[str, Any] | None:
    """The support priority where its fit alone stays unsure: fitted alone; with its facts asked beside
    it as nouls (their answers labelled too, read back from the ticket) and the question-set fit offered;
    and the policy applied to the facts' fitted answers. Fitted on the first `n_fit` pool items, scored
    on the held-out ones."""
    if not FACTS_EVIDENCE.is_file():
        return None
    facts = json.loads(FACTS_EVIDENCE.read_text())
    asked = {**data.questions, **FACTS}

    def joined(pair: Pair, rows: list[dict[str, Any]]) -> Pair:
        by_state = {row["state"]: row["evidence"] for row in rows}
        examples, evidence = [], []
        for example, row in zip(*pair, strict=True):
            state = str(example.request.state)
            if state in by_state:
                request = SystemOneRequest.model_validate({"model": "jev-latest", "state": state, "questions": asked})
                right = {q: 0 if yes else 1 for q, yes in facts_of(state).items()}  # a noul's labels: true, false
                examples.append(UserExample(request, {**example.answers, **right}))
                mean = next(iter(row.values())).state_mean  # the state's: the facts' state probes read it
                extra = {q: Evidence(e["labels"], e["raw"], e["prior"], None, mean) for q, e in by_state[state].items()}
                evidence.append({**row, **extra})
        return examples, evidence

    train = joined((data.pool[0][:n_fit], data.pool[1][:n_fit]), facts["sets"]["fit"])
    test = joined(data.test, facts["sets"]["held_out"])
    alone = fitted(calibration, *_only(train, data.questions))
    found: dict[str, Any] = {"fit": len(train[0]), "held_out": len(test[0])}
    found["alone"] = scored(calibration, alone, _only(test, data.questions))["priority"]
    reports, records = fit_all(train[0], train[1], calibration, question_set=True)
    with_set = scored(calibration, {r.key: r for r in records}, test)
    found["facts"] = {q: with_set[q] for q in FACTS}
    report = next(r.to_json() for r in reports if r.ids == ["priority"])
    offered = {name: loss for name, loss in report["candidates"].items() if name.startswith("question_set")}
    found["question_set"] = {
        **with_set["priority"],
        "best_set_candidate": min(offered, key=offered.__getitem__) if offered else None,
        "its_log_loss": min(offered.values()) if offered else None,
        "chosen_log_loss": report["after"]["log_loss"],
    }
    found["policy_over_facts"] = policy_accuracy(calibration, {r.key: r for r in records}, test)
    return found


def _only(pair: Pair, questions: dict[str, Any]) -> Pair:
    """The examples with only `questions` asked (and answered), their evidence likewise."""
    examples, evidence = [], []
    for example, row in zip(*pair, strict=True):
        request = example.request.model_copy(update={"questions": {q: example.request.questions[q] for q in questions}})
        examples.append(UserExample(request, {q: example.answers[q] for q in questions}))
        evidence.append({q: row[q] for q in questions})
    return examples, evidence


def policy_accuracy(calibration: Calibration, records: dict[str, FitRecord], test: Pair) -> float:
    """How often the priority's policy, applied to the facts' fitted answers, gives the right priority."""
    examples, evidence = test
    fits = fits_of(records, examples[0].request)
    right = []
    for example, row in zip(examples, evidence, strict=True):
        answers = calibration.answer_evidence(example.request.questions, row, fits, COVERAGE)
        said = {q: int(np.argmax(answers[q].probabilities)) == 0 for q in FACTS}
        right.append(priority_of(said) == example.answers["priority"])
    return float(np.mean(right))


def mean_over(rows: dict[str, Any], key: str) -> float:
    return float(np.mean([row[key] for row in rows.values()]))


def targets(report: dict[str, Any]) -> dict[str, Any]:
    """The issue's three targets, each with what was measured. The coverage is judged on random labels,
    the setting the guarantee is for, averaged over COVERAGE_DRAWS draws; the labelling loop's one run,
    its sets bounded on its drawn quarter, is counted beside it."""
    rows_at = {
        way: [
            row
            for w in report["workloads"].values()
            for size, rows in w[way].items()
            for row in rows.values()
            if row["coverage"] is not None and int(size) == max(SIZES)
        ]
        for way in ("ranked", "random")
    }
    within = {way: [COVERED[0] <= row["coverage"] <= COVERED[1] for row in rows] for way, rows in rows_at.items()}
    small = [row["size"] < SMALL_SET for rows in rows_at.values() for row in rows if row["accuracy"] > SURE]
    at_40 = float(np.mean([mean_over(w["ranked"][40], "accuracy") for w in report["workloads"].values()]))
    at_100 = float(np.mean([mean_over(w["random"][100], "accuracy") for w in report["workloads"].values()]))
    return {
        "coverage_within": {
            "met": all(within["random"]),
            "range": list(COVERED),
            "at_labels": max(SIZES),
            "random_within": f"{sum(within['random'])} of {len(within['random'])}",
            "ranked_within": f"{sum(within['ranked'])} of {len(within['ranked'])}",
        },
        "small_sets_where_sure": {"met": all(small), "questions": len(small)},
        "ranked_40_vs_random_100": {"met": at_40 >= at_100, "ranked_40": at_40, "random_100": at_100},
    }


def markdown(report: dict[str, Any]) -> str:
    lines = [
        f"# The labelling loop on the pipelines: {report['model']}",
        "",
        f"{report['date']}, commit {report['git']}, {report['machine']}.",
        "",
        f"Pool: seed 0's items per workload (the states a user has); held out: seeds 1 and 2's items whose states "
        "are not in the pool. "
        f"Ranked: {BATCH} states at a time as app/labelling/ranking.py orders them, refit after each batch. Random: "
        f"{report['repeats']} draws per size ({COVERAGE_DRAWS} at {max(SIZES)} labels), averaged. Accuracy of every "
        f"question on the held-out items as a request is answered; for a fitted question its {COVERAGE:.0%} sets' "
        "coverage (after random labels, ± the spread of one draw's) and mean size.",
        "",
    ]
    for w in report["workloads"].values():  # sizes are keys: numbers in memory, strings once read from JSON
        for way in ("ranked", "random"):
            w[way] = {int(size): rows for size, rows in w[way].items()}
    for name, w in report["workloads"].items():
        lines += [f"## {name} (pool {w['pool']}, held out {w['held_out']})", ""]
        rows = []
        for size in SIZES:
            for way in ("ranked", "random"):
                for qid, row in w[way][size].items():
                    cov = "-" if row["coverage"] is None else f"{row['coverage']:.3f}"
                    if row.get("coverage_sd") is not None:
                        cov += f" ± {row['coverage_sd']:.3f}"
                    size_cell = "-" if row["size"] is None else f"{row['size']:.2f}"
                    rows.append([size, way, qid, row["method"], f"{row['accuracy']:.3f}", cov, size_cell])
        lines += table(["labels", "chosen", "question", "method", "accuracy", "90% coverage", "set size"], rows)
        lines.append("")
    lines += ["## Mean accuracy over questions", ""]
    rows = []
    for size in SIZES:
        ranked_mean = np.mean([mean_over(w["ranked"][size], "accuracy") for w in report["workloads"].values()])
        random_mean = np.mean([mean_over(w["random"][size], "accuracy") for w in report["workloads"].values()])
        rows.append([size, f"{ranked_mean:.3f}", f"{random_mean:.3f}"])
    lines += table(["labels", "ranked", "random"], rows)
    margin = {
        (name, qid): row for name, w in report["workloads"].items() for qid, row in (w.get("margin") or {}).items()
    }
    if margin:
        keys = [f"random_{MARGIN_AT}", f"margin_{MARGIN_AT}", f"oracle_{MARGIN_AT}", f"random_{max(SIZES)}"]
        lines += [
            "",
            "## What choosing states can buy here",
            "",
            f"One fixed learner (a state probe, penalty {MARGIN_PENALTY:g}; no choice among fits, no drawn share), "
            f"its labels from seed 0's first {CHOICE_POOL} states: {MARGIN_AT} drawn at random; {MARGIN_AT} chosen by "
            f"margin sampling ({MARGIN_START} random, then one at a time the state whose two likeliest labels are "
            f"closest); {MARGIN_AT} chosen by an oracle no user has ({MARGIN_START} random, then one at a time, of "
            f"{ORACLE_OFFERS} states offered at random, the one whose label most raises the accuracy on seed 0's other "
            f"states, labelled: it sees answers no ranking has, so no ranking should expect more); {max(SIZES)} drawn "
            f"at random. Means of {MARGIN_RUNS} draws or starts; held-out accuracy.",
            "",
        ]
        rows = [[name, qid, *(f"{row[k]:.3f}" for k in keys)] for (name, qid), row in margin.items()]
        rows.append(["mean", "", *(f"{np.mean([row[k] for row in margin.values()]):.3f}" for k in keys)])
        lines += table(["workload", "question", *(k.replace("_", " ") for k in keys)], rows)
    t = report["targets"]
    met = {key: "met" if value["met"] else "NOT met" for key, value in t.items()}
    lines += [
        "",
        "## Targets (issue 51)",
        "",
        f"- every fitted question's 90% sets cover between {COVERED[0]} and {COVERED[1]} of the held-out items "
        f"at {max(SIZES)} random labels ({COVERAGE_DRAWS} draws): {met['coverage_within']} "
        f"({t['coverage_within']['random_within']}; the ranked loop's one run, bounded on its drawn quarter: "
        f"{t['coverage_within']['ranked_within']})",
        f"- mean set size under {SMALL_SET} where the accuracy is above {SURE} "
        f"({t['small_sets_where_sure']['questions']} such rows): {met['small_sets_where_sure']}",
        f"- ranked with 40 labels ({t['ranked_40_vs_random_100']['ranked_40']:.3f}) at least random with 100 "
        f"({t['ranked_40_vs_random_100']['random_100']:.3f}): {met['ranked_40_vs_random_100']}",
    ]
    facts = report.get("priority_facts")
    if facts:
        lines += [
            "",
            "## Where a fit cannot reach: the support priority asked as its facts",
            "",
            f"Fitted on {facts['fit']} tickets, scored on {facts['held_out']} held out. bench/priority_facts.py asks "
            f"{', '.join(FACTS)} as nouls about each ticket; their right answers are read back from the ticket.",
            "",
        ]
        shown = [("priority alone", facts["alone"]), ("priority, question-set fit offered", facts["question_set"])]
        shown += [(f"fact: {q}", row) for q, row in facts["facts"].items()]
        rows = [
            [name, r["method"], f"{r['accuracy']:.3f}", "-" if r["size"] is None else f"{r['size']:.2f}"]
            for name, r in shown
        ]
        rows.append(
            ["priority by its policy over the facts' fitted answers", "-", f"{facts['policy_over_facts']:.3f}", "-"]
        )
        lines += table(["what", "method", "accuracy", "90% set size"], rows)
        offered = facts["question_set"]
        if offered["best_set_candidate"]:
            lines += [
                "",
                f"The question-set fit's best candidate ({offered['best_set_candidate']}) had a cross-validated "
                f"log loss of {offered['its_log_loss']:.3f}; the fit chosen, {offered['chosen_log_loss']:.3f}.",
            ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=10, help="random draws per number of labels")
    parser.add_argument("--workloads", nargs="*", help="only these (default: every workload)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    data, t0, fingerprint = workloads(args.workloads)
    calibration = fitting_at(t0)
    steps = len(SIZES) + sum(draws_at(size, args.repeats) for size in SIZES)
    questions = sum(len(d.questions) for d in data.values() if has_vectors(d))  # the choosing section's steps
    progress = Progress(len(data) * steps + questions, "labelling loop")
    report: dict[str, Any] = {
        "model": load(EVIDENCE)["model"],
        "fingerprint": fingerprint,
        "date": datetime.date.today().isoformat(),
        "git": git_sha(),
        "machine": machine(),
        "repeats": args.repeats,
        "workloads": {},
    }
    for name, d in data.items():
        report["workloads"][name] = {
            "pool": len(d.pool[0]),
            "held_out": len(d.test[0]),
            "ranked": ranked(calibration, d, SIZES, progress),
            "random": at_random(calibration, d, SIZES, args.repeats, progress),
            "margin": what_choosing_buys(t0, d, progress),
        }
    if "support" in data:
        report["priority_facts"] = with_facts(calibration, data["support"], max(SIZES))
    report["targets"] = targets(report)
    stem = f"{report['date']}-{report['git']}-labelling"
    write_atomically(args.out / f"{stem}.json", json.dumps(report, indent=1))
    write_atomically(args.out / f"{stem}.md", markdown(report))
    print(markdown(report))
    print(f"wrote {args.out / stem}.{{json,md}}")


if __name__ == "__main__":
    main()
