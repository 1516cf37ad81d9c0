"""How much fitted calibration helps, and how much data it needs, on pipeline data no fit saw.

Reads bench/results/calibration-evidence.json (python -m bench.evidence: every workload's examples
answered once by the served default model) and, per workload, splits it by item: the first
`--train` examples to fit on, the rest held out. On the held-out items it compares what a question
gets today (contextual calibration) with the fits `onepass calibrate` would adopt (app/fitting/runner.py),
per question and with the opt-in question-set fit, and with batch calibration (label-free) on
unlabelled samples of several sizes. Writes bench/results/calibration-study.{json,md,png}.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from app.calibration import Calibration, Evidence, Example, FitRecord, Priors, question_key, ratio_of

# A study of the candidates themselves reads the room's insides, as tests/test_fitting.py does.
from app.calibration.candidates import QuestionSetCandidate, fit_batch
from app.calibration.evidence import log_ratio
from app.calibration.fit import softmax
from app.calibration.metrics import scores
from app.fitting.examples import UserExample, parse_examples
from app.fitting.runner import fit_all, set_rows
from app.paths import REPO_ROOT
from bench.evidence import OUT as EVIDENCE
from bench.evidence import hidden_key, hidden_path, state_mean_key
from bench.output import table, write_atomically

RESULTS = REPO_ROOT / "bench" / "results"
TEST = RESULTS / "calibration-evidence-test.json"
SIZES = (10, 20, 50, 100)


def load(path: Path) -> dict[str, Any]:
    return dict(json.loads(path.read_text()))


def load_hidden(path: Path) -> dict[str, np.ndarray]:
    """The hidden states bench/evidence.py wrote beside `path`; none if that file is missing."""
    found = hidden_path(path)
    if not found.is_file():
        print(f"{found} is missing (python -m bench.evidence writes it): measuring without the probe")
        return {}
    with np.load(found) as packed:
        return {key: packed[key] for key in packed.files}


def parsed(
    name: str, workload: dict[str, Any], hidden: dict[str, np.ndarray], indices: list[int] | None = None
) -> tuple[list[UserExample], list[dict[str, Evidence]]]:
    """A workload's items (those at `indices`, default all) as examples and their evidence."""
    chosen = range(len(workload["items"])) if indices is None else indices
    items = [workload["items"][i] for i in chosen]
    examples = parse_examples(
        [{"state": i["state"], "questions": workload["questions"], "answers": i["answers"]} for i in items]
    )
    evidence = []
    for index, item in zip(chosen, items, strict=True):
        found = {}
        for qid, e in item["evidence"].items():
            vector = hidden.get(hidden_key(name, index, qid))
            found[qid] = Evidence(e["labels"], e["raw"], e["prior"], vector, hidden.get(state_mean_key(name, index)))
        evidence.append(found)
    return examples, evidence


def predict(
    record: FitRecord | None, examples: list[UserExample], evidence: list[dict[str, Evidence]], qid: str, t0: float
) -> np.ndarray:
    """Each held-out example's probabilities for `qid` in its label order, with `record`'s fit or today's."""
    found = []
    for example, readouts in zip(examples, evidence, strict=True):
        e = readouts[qid]
        if record is None:
            found.append(softmax(log_ratio(e.raw, e.prior) / t0))
            continue
        by_key = {question_key(q): ratio_of(readouts[i]) for i, q in example.request.questions.items()}
        found.append(np.asarray(record.fit.apply(e.labels, e.raw, e.prior, e.hidden, by_key, e.state_mean)))
    return np.asarray(found)


def fitting_at(t0: float) -> Calibration:
    """A calibration that fits at the model's temperature t0 from stored evidence: it never decodes."""

    def never(*_: Any) -> Any:
        raise AssertionError("the study reads stored evidence; it measures no prior")

    return Calibration("contextual", t0, Priors([], never))


def measure(
    train: tuple[list[UserExample], list[dict[str, Evidence]]],
    test: tuple[list[UserExample], list[dict[str, Evidence]]],
    t0: float,
    question_set: bool,
) -> dict[str, Any]:
    _, records = fit_all(train[0], train[1], fitting_at(t0), question_set)
    by_key = {r.key: r for r in records}
    per_question = {}
    for qid, question in test[0][0].request.questions.items():
        right = np.asarray([example.answers[qid] for example in test[0]])
        record = by_key.get(question_key(question))
        before = scores(predict(None, *test, qid, t0), right)
        after = scores(predict(record, *test, qid, t0), right)
        per_question[qid] = {
            "type": question.type,
            "method": record.method if record else "contextual",
            "before": {k: v for k, v in before.to_json().items() if k != "reliability"},
            "after": {k: v for k, v in after.to_json().items() if k != "reliability"},
        }
    return per_question


def readout_only(
    pair: tuple[list[UserExample], list[dict[str, Evidence]]],
) -> tuple[list[UserExample], list[dict[str, Evidence]]]:
    """The same examples without their hidden states: what the fits that read only the labels reach."""
    examples, evidence = pair
    return examples, [
        {q: replace(e, hidden=None, state_mean=None) for q, e in readouts.items()} for readouts in evidence
    ]


def label_free(
    train: tuple[list[UserExample], list[dict[str, Evidence]]],
    test: tuple[list[UserExample], list[dict[str, Evidence]]],
    t0: float,
    size: int,
) -> dict[str, Any]:
    found = {}
    for qid in test[0][0].request.questions:
        sample = [Example(tuple(e[qid].labels), tuple(e[qid].raw), tuple(e[qid].prior), None) for e in train[1][:size]]
        fit = fit_batch(sample, t0)
        right = np.asarray([example.answers[qid] for example in test[0]])
        p = np.asarray([fit.apply(e[qid].labels, e[qid].raw, e[qid].prior) for e in test[1]])
        found[qid] = {k: v for k, v in scores(p, right).to_json().items() if k != "reliability"}
    return found


def ceiling(test: tuple[list[UserExample], list[dict[str, Evidence]]]) -> dict[str, float]:
    """An upper bound on what a question-set fit can reach: fitted on the held-out items themselves,
    nearly unpenalised, and scored on them. No real fit gets there; where this is low, the
    readouts do not carry the answer and no fit of this kind can."""
    examples, evidence = test
    rows = set_rows(examples, evidence, list(range(len(examples))))
    found = {}
    for qid, question in examples[0].request.questions.items():
        key = question_key(question)
        names = rows[0].ratios[key][0]
        right = [names.index(evidence[i][qid].labels[example.answers[qid]]) for i, example in enumerate(examples)]
        fit = QuestionSetCandidate(key, penalty=1e-4).fit(
            [Example((), (), (), r, row=row) for r, row in zip(right, rows, strict=True)]
        )
        p = np.asarray([fit.apply(names, (), (), None, row.ratios) for row in rows])
        found[qid] = scores(p, np.asarray(right)).accuracy
    return found


def mean(rows: dict[str, dict[str, Any]], which: str, metric: str) -> float:
    return float(np.mean([row[which][metric] for row in rows.values()]))


def run(pool: list[Path], test_path: Path | None, n_train: int, sizes: tuple[int, ...] = SIZES) -> dict[str, Any]:
    """Fits on the first `n_train` items of each workload in `pool` (later files replace a workload);
    held out: `test_path`'s items (another seed) without the states seen in training, or else the
    rest of the pool."""
    data = load(pool[0])
    hidden = load_hidden(pool[0])
    for extra in pool[1:]:
        data["workloads"].update(load(extra)["workloads"])
        hidden.update(load_hidden(extra))
    tests = load(test_path)["workloads"] if test_path is not None else {}
    test_hidden = load_hidden(test_path) if test_path is not None else {}
    t0 = float(data["calibration_temperature"])
    found: dict[str, Any] = {"model": data["model"], "train": n_train, "workloads": {}}
    for name, workload in data["workloads"].items():
        examples, evidence = parsed(name, workload, hidden)
        train = (examples[:n_train], evidence[:n_train])
        if name in tests:
            seen = {item["state"] for item in workload["items"][:n_train]}
            fresh = [i for i, item in enumerate(tests[name]["items"]) if item["state"] not in seen]
            test = parsed(name, tests[name], test_hidden, fresh)
        else:
            test = (examples[n_train:], evidence[n_train:])
        curve = {}
        for size in sizes:
            if size <= n_train:
                small = (train[0][:size], train[1][:size])
                curve[size] = {
                    "readout": measure(readout_only(small), readout_only(test), t0, question_set=False),
                    "per_question": measure(small, test, t0, question_set=False),
                    "question_set": measure(small, test, t0, question_set=True),
                    "batch": label_free(train, test, t0, size),
                }
        found["workloads"][name] = {"held_out": len(test[0]), "curve": curve, "ceiling": ceiling(test)}
    return found


def markdown(found: dict[str, Any]) -> list[str]:
    n = found["train"]
    held = ", ".join(f"{name} {w['held_out']}" for name, w in found["workloads"].items())
    lines = [f"Fits on the first {n} items of each workload; held-out items: {held}.", ""]
    rows, pipelines = [], []
    for name, w in found["workloads"].items():
        top = w["curve"][max(w["curve"], key=int)]
        for qid, row in top["per_question"].items():
            fitted = [top[which][qid]["after"] for which in ("readout", "per_question", "question_set")]
            methods = [top[which][qid]["method"] for which in ("readout", "per_question", "question_set")]
            rows.append(
                [
                    f"{name} / {qid}",
                    row["type"],
                    f"{row['before']['accuracy']:.3f}, {row['before']['ece']:.3f}",
                    *(f"{c['accuracy']:.3f}, {c['ece']:.3f} ({m})" for c, m in zip(fitted, methods, strict=True)),
                    f"{top['batch'][qid]['accuracy']:.3f}, {top['batch'][qid]['ece']:.3f}",
                ]
            )
        pipelines.append(
            [
                name,
                f"{mean(top['per_question'], 'before', 'accuracy'):.3f}",
                *(
                    f"{mean(top[which], 'after', 'accuracy'):.3f}"
                    for which in ("readout", "per_question", "question_set")
                ),
            ]
        )
    lines += table(
        [
            "workload / question",
            "type",
            "today: accuracy, ECE",
            f"readout fits only ({n} examples)",
            "per-question fit (with the probe)",
            "with the question-set opt-in",
            f"batch calibration ({n} unlabelled)",
        ],
        rows,
    )
    lines += ["", "Mean accuracy per pipeline:", ""]
    lines += table(
        ["workload", "today", "readout fits only", "per-question fit", "with the question-set opt-in"], pipelines
    )
    lines += [
        "",
        "Ceiling of the readout fits: a question-set fit fitted on the held-out items themselves (an upper",
        "bound for any fit that reads only the label readouts):",
        "",
    ]
    lines += table(
        ["workload", "question 1", "question 2", "question 3", "mean"],
        [
            [
                name,
                *(f"{qid} {acc:.3f}" for qid, acc in w["ceiling"].items()),
                f"{np.mean(list(w['ceiling'].values())):.3f}",
            ]
            for name, w in found["workloads"].items()
        ],
    )
    lines += ["", "Mean over every question, against the number of examples per question set:", ""]
    kinds = ("readout", "per_question", "question_set")
    curve_rows = []
    sizes = sorted({int(s) for w in found["workloads"].values() for s in w["curve"]})
    for size in sizes:
        cells: dict[str, list[float]] = {k: [] for k in ("today", *kinds, "batch")}
        eces: dict[str, list[float]] = {k: [] for k in cells}
        for w in found["workloads"].values():
            point = w["curve"].get(size) or w["curve"].get(str(size))
            for qid, row in point["per_question"].items():
                cells["today"].append(row["before"]["accuracy"])
                eces["today"].append(row["before"]["ece"])
                for kind in kinds:
                    cells[kind].append(point[kind][qid]["after"]["accuracy"])
                    eces[kind].append(point[kind][qid]["after"]["ece"])
                cells["batch"].append(point["batch"][qid]["accuracy"])
                eces["batch"].append(point["batch"][qid]["ece"])
        curve_rows.append(
            [size, *(f"{np.mean(cells[k]):.3f}, {np.mean(eces[k]):.3f} (max {np.max(eces[k]):.3f})" for k in cells)]
        )
    lines += table(
        [
            "examples",
            "today: accuracy, ECE",
            "readout fits only",
            "per-question fit (with the probe)",
            "with the question-set opt-in",
            "batch calibration (unlabelled)",
        ],
        curve_rows,
    )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--evidence", type=Path, nargs="+", default=[EVIDENCE])
    parser.add_argument(
        "--test", type=Path, default=TEST, help="held-out items (another seed); 'none': the pool's rest"
    )
    parser.add_argument("--train", type=int, default=100)
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES), help="examples per question set")
    args = parser.parse_args()
    found = run(args.evidence, None if str(args.test) == "none" else args.test, args.train, tuple(args.sizes))
    text = "\n".join(markdown(found)) + "\n"
    write_atomically(RESULTS / "calibration-study.json", json.dumps(found, indent=1))
    write_atomically(RESULTS / "calibration-study.md", text)
    print(text)


if __name__ == "__main__":
    main()
