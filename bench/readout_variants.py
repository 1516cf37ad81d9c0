"""How short a question-first readout can be, fitted: held-out accuracy and cost of readout variants.

The question-first layout's readout restates each question after the state (its line, a choice's
option names, the answer line, the chat turn's end), so on the support pipeline the three
readouts are longer than the ticket and a new ticket costs several prefills. For each workload of
bench/pipelines.py and each seed pair, this fits the workload's questions with each variant as
`onepass calibrate` does (`bench.pipeline.fit_layout`, N examples of the first seed), then
answers M held-out examples (the second seed) in-process with those fits, and reports each
question's accuracy and the median cost of a new state over its prefill (x_timing_ms, as
`python -m bench.pipeline --fitted` reports it):

- state-first: the other layout, as served, the accuracy to match;
- shipped: the question-first readout as served;
- named: the turn's end first (one copy, shared by the three readouts' decode), then the
  assistant naming the question, "Question 2";
- last-sentence: the turn's end, then "Question 2: " and the instructions' last sentence (the
  question itself, without a policy before it);
- named-tail: named, its probe also reading the hidden vector at the turn's end (the last row
  the three readouts share);
- named-joint: named, each question's probe reading the hidden vectors of every readout of the
  set (a question-first answer depends on the set anyway).

The last two change what the engine hands the probe, for this run only: experiments, not
something the server can serve.

python -m bench.readout_variants [--variants state-first,shipped,named] [--workloads support,logs]
    [--seeds 0:1,2:3] [--train N] [--test M]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import re
import statistics
import tempfile
from collections.abc import Iterator, Sequence
from datetime import date
from pathlib import Path
from typing import Any

import numpy as np

from app.answering.prompter import QuestionSet, Suffix
from app.answering.prompting import OwnPrompter
from app.config import DEFAULT_MODEL_PATH, load_settings
from app.contract import Question, SystemOneRequest
from app.engine.llama import Answered, Engine, Job, Readout, Snapshot
from app.serving.loading import load_spec
from app.serving.specs import ModelSpec
from bench.output import RESULTS, Progress, git_sha, machine, table, write_atomically
from bench.pipeline import accuracies, fit_layout, mark
from bench.pipelines import WORKLOADS

VARIANTS = ("state-first", "shipped", "named", "last-sentence", "named-tail", "named-joint")


def readout_text(variant: str, number: int, instructions: str) -> str:
    if variant.startswith("named"):
        return f"Question {number}\n"
    last = re.split(r"(?<=[.?!])\s+", instructions.strip())[-1]
    return f"Question {number}: {last}\n"


@contextlib.contextmanager
def readouts(variant: str) -> Iterator[None]:
    """OwnPrompter's question-first readouts replaced by `variant`'s while the block runs (and for
    the named-tail and named-joint probes, what the engine reads as a readout's hidden vector)."""
    shipped = OwnPrompter.question_set
    shipped_read, shipped_decode = Engine._read, Engine.decode_suffixes
    tail = [0]  # the chat turn's end, in tokens: the shared rows every named readout starts with

    def question_set(self: OwnPrompter, questions: dict[str, Question]) -> QuestionSet:
        found = shipped(self, questions)
        suffixes = {}
        for qid, question in questions.items():
            lines, _, label_ids = self._block(question)
            text = readout_text(variant, found.number[qid], lines[0].split(": ", 1)[1])
            tokens = self.tokenizer.tokenize(text, add_bos=False, special=False)
            suffixes[qid] = Suffix(text, (*self._tail_tokens, *tokens), label_ids)
        tail[0] = len(self._tail_tokens)
        return dataclasses.replace(found, suffixes=suffixes)

    def read_with_tail(self: Engine, ctx: Any, rows: Sequence[int], job: Job, hidden: bool) -> Readout:
        found = shipped_read(self, ctx, rows, job, hidden)
        if found.hidden is None:
            return found
        return dataclasses.replace(found, hidden=np.concatenate([found.hidden, self._vector(ctx, rows[tail[0] - 1])]))

    def decode_joint(self: Engine, prefix: Snapshot, jobs: Sequence[Job], *, hidden: bool = False) -> Answered:
        answered = shipped_decode(self, prefix, jobs, hidden=hidden)
        vectors = [r.hidden for r in answered.readouts]
        if hidden and all(v is not None for v in vectors):  # every readout's vector, in the set's order
            joint = np.concatenate([v for v in vectors if v is not None])
            answered.readouts = [dataclasses.replace(r, hidden=joint) for r in answered.readouts]
        return answered

    if variant not in ("state-first", "shipped"):
        OwnPrompter.question_set = question_set  # type: ignore[method-assign]
    if variant == "named-tail":
        Engine._read = read_with_tail  # type: ignore[method-assign]
    if variant == "named-joint":
        Engine.decode_suffixes = decode_joint  # type: ignore[method-assign]
    try:
        yield
    finally:
        OwnPrompter.question_set = shipped  # type: ignore[method-assign]
        Engine._read, Engine.decode_suffixes = shipped_read, shipped_decode  # type: ignore[method-assign]


def measure(variant: str, workload: str, seeds: tuple[int, int], model: Path, train: int, test: int) -> dict[str, Any]:
    """`variant` fitted on `train` examples of `workload` (seed `seeds[0]`), then asked `test` held-out
    ones (seed `seeds[1]`)."""
    pipeline = next(w for w in WORKLOADS if w.name == workload)
    layout = "state-first" if variant == "state-first" else "question-first"
    with readouts(variant), tempfile.TemporaryDirectory(prefix="onepass-readouts-") as folder:
        fitted = fit_layout(model, layout, pipeline.examples(train, seed=seeds[0]), Path(folder))
        flags = ["--model", str(model), "--layout", layout, "--calibration-dir", folder]
        service = load_spec(ModelSpec.from_settings(load_settings([*flags, "--session-cache-disk-bytes", "0"], {})))
        right: dict[str, list[float]] = {}
        costs = []
        progress = Progress(test, f"held-out {workload} ({variant})")
        try:
            for example in pipeline.examples(test, seed=seeds[1]):
                body = {"model": "m", "state": example["state"], "questions": example["questions"]}
                answered = service.answer(SystemOneRequest.model_validate(body)).model_dump()
                mark(right, answered["answers"], example)
                timing = answered["x_timing_ms"]
                if answered["x_cache"] == "miss":
                    costs.append(timing["total"] / timing["prefill"])
                progress.step()
            # the readouts follow the question set, not the state: the same tokens for every example
            readout_tokens = sum(len(s.tokens) for s in service.plan(SystemOneRequest.model_validate(body)).suffixes())
        finally:
            service.close()
    return {
        "variant": variant,
        "workload": workload,
        "seeds": list(seeds),
        "fits": fitted["fits"],
        **accuracies(right),
        "readout_tokens": readout_tokens,
        "cost_over_prefill": round(statistics.median(costs), 3),
        "new_states": len(costs),
    }


def summary(rows: list[dict[str, Any]]) -> list[str]:
    """Each variant's mean accuracy per workload (over the seed pairs) and over all, its gap to
    state-first's where that was measured, and its median cost per workload."""
    variants = list(dict.fromkeys(r["variant"] for r in rows))
    workloads = list(dict.fromkeys(r["workload"] for r in rows))

    def mean_of(variant: str, workload: str | None = None) -> float:
        found = [r["mean_accuracy"] for r in rows if r["variant"] == variant and workload in (None, r["workload"])]
        return statistics.fmean(found)

    headers = ["variant", *(f"{w} accuracy" for w in workloads), "mean", "gap to state-first"]
    headers += [f"{w} cost / prefill" for w in workloads]
    lines = []
    for variant in variants:
        gap = round(mean_of("state-first") - mean_of(variant), 4) if "state-first" in variants else "-"
        costs = [
            statistics.median(r["cost_over_prefill"] for r in rows if r["variant"] == variant and r["workload"] == w)
            for w in workloads
        ]
        accuracy = [round(mean_of(variant, w), 4) for w in workloads]
        lines.append([variant, *accuracy, round(mean_of(variant), 4), gap, *(round(c, 2) for c in costs)])
    return table(headers, lines)


def seed_pairs(text: str) -> list[tuple[int, int]]:
    pairs = []
    for pair in text.split(","):
        fit_on, held_out = (int(seed) for seed in pair.split(":"))
        if fit_on == held_out:
            raise ValueError(f"seed pair {pair}: the held-out seed must differ from the one fitted on")
        pairs.append((fit_on, held_out))
    return pairs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL_PATH)
    parser.add_argument("--variants", default=",".join(VARIANTS[1:]))
    parser.add_argument("--workloads", default="support", help=f"of {', '.join(w.name for w in WORKLOADS)}")
    parser.add_argument("--seeds", default="0:1", help="seed pairs, fitted on:held out, comma separated")
    parser.add_argument("--train", type=int, default=50)
    parser.add_argument("--test", type=int, default=40)
    args = parser.parse_args()
    variants, workloads = args.variants.split(","), args.workloads.split(",")
    for name, chosen, known in (("variant", variants, VARIANTS), ("workload", workloads, [w.name for w in WORKLOADS])):
        unknown = [c for c in chosen if c not in known]
        if unknown:
            parser.error(f"unknown {name} {unknown[0]!r}; one of {', '.join(known)}")
    try:
        pairs = seed_pairs(args.seeds)
    except ValueError as error:
        parser.error(str(error))
    rows = []
    for workload in workloads:
        for seeds in pairs:
            for variant in variants:
                rows.append(measure(variant, workload, seeds, args.model, args.train, args.test))
                print(json.dumps(rows[-1]), flush=True)
    lines = [
        f"Readout variants, fitted on {args.train} examples and {args.test} held out per workload and seed pair "
        f"({args.seeds}); commit {git_sha()}, {machine()}:",
        "",
        *summary(rows),
    ]
    print("\n".join(lines))
    stem = RESULTS / f"{date.today().isoformat()}-{git_sha()}-readout-variants"
    found = {"rows": rows, "args": vars(args) | {"model": str(args.model)}}
    write_atomically(stem.with_suffix(".json"), json.dumps(found, indent=1))
    write_atomically(stem.with_suffix(".md"), "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
