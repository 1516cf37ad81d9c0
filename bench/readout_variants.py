"""How short a question-first readout can be, fitted: held-out accuracy and cost of readout variants.

The question-first layout's readout restates each question after the state (its line, a choice's
option names, the answer line, the chat turn's end), so on the support pipeline the three
readouts are longer than the ticket and a new ticket costs several prefills. This fits the
support questions in question-first with each readout variant, as `onepass calibrate` does
(`bench.pipeline.fit_layout`, N tickets of seed 0), then answers M held-out tickets (seed 1)
in-process with those fits, and reports each question's accuracy and the median cost of a new
ticket over its prefill (x_timing_ms, as `python -m bench.pipeline --fitted` reports it):

- shipped: the readout as served;
- named: the turn's end first (one copy, shared by the three readouts' decode), then the
  assistant naming the question, "Question 2";
- last-sentence: the turn's end, then "Question 2: " and the instructions' last sentence (the
  question itself, without a policy before it).

python -m bench.readout_variants [--variants shipped,named,last-sentence] [--train N] [--test M]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import re
import statistics
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from app.answering.prompter import QuestionSet, Suffix
from app.answering.prompting import OwnPrompter
from app.config import DEFAULT_MODEL_PATH, load_settings
from app.contract import Question, SystemOneRequest
from app.serving.loading import load_spec
from app.serving.specs import ModelSpec
from bench.output import Progress
from bench.pipeline import accuracies, fit_layout, mark
from bench.pipelines import WORKLOADS

VARIANTS = ("shipped", "named", "last-sentence")


def readout_text(variant: str, number: int, instructions: str) -> str:
    if variant == "named":
        return f"Question {number}\n"
    last = re.split(r"(?<=[.?!])\s+", instructions.strip())[-1]
    return f"Question {number}: {last}\n"


@contextlib.contextmanager
def readouts(variant: str) -> Iterator[None]:
    """OwnPrompter's question-first readouts replaced by `variant`'s while the block runs."""
    shipped = OwnPrompter.question_set

    def question_set(self: OwnPrompter, questions: dict[str, Question]) -> QuestionSet:
        found = shipped(self, questions)
        suffixes = {}
        for qid, question in questions.items():
            lines, _, label_ids = self._block(question)
            text = readout_text(variant, found.number[qid], lines[0].split(": ", 1)[1])
            tokens = self.tokenizer.tokenize(text, add_bos=False, special=False)
            suffixes[qid] = Suffix(text, (*self._tail_tokens, *tokens), label_ids)
        return dataclasses.replace(found, suffixes=suffixes)

    if variant != "shipped":
        OwnPrompter.question_set = question_set  # type: ignore[method-assign]
    try:
        yield
    finally:
        OwnPrompter.question_set = shipped  # type: ignore[method-assign]


def measure(variant: str, model: Path, train: int, test: int) -> dict[str, Any]:
    support = next(w for w in WORKLOADS if w.name == "support")
    with readouts(variant), tempfile.TemporaryDirectory(prefix="onepass-readouts-") as folder:
        fitted = fit_layout(model, "question-first", support.examples(train, seed=0), Path(folder))
        flags = ["--model", str(model), "--layout", "question-first", "--calibration-dir", folder]
        service = load_spec(ModelSpec.from_settings(load_settings([*flags, "--session-cache-disk-bytes", "0"], {})))
        right: dict[str, list[float]] = {}
        costs = []
        progress = Progress(test, f"held-out tickets ({variant})")
        try:
            for example in support.examples(test, seed=1):
                body = {"model": "m", "state": example["state"], "questions": example["questions"]}
                answered = service.answer(SystemOneRequest.model_validate(body)).model_dump()
                mark(right, answered["answers"], example)
                timing = answered["x_timing_ms"]
                if answered["x_cache"] == "miss":
                    costs.append(timing["total"] / timing["prefill"])
                progress.step()
            # the readouts follow the question set, not the ticket: the same tokens for every ticket
            readout_tokens = sum(len(s.tokens) for s in service.plan(SystemOneRequest.model_validate(body)).suffixes())
        finally:
            service.close()
    return {
        "variant": variant,
        "fits": fitted["fits"],
        **accuracies(right),
        "readout_tokens": readout_tokens,
        "cost_over_prefill": round(statistics.median(costs), 3),
        "new_tickets": len(costs),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL_PATH)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--train", type=int, default=50)
    parser.add_argument("--test", type=int, default=40)
    args = parser.parse_args()
    for variant in args.variants.split(","):
        if variant not in VARIANTS:
            parser.error(f"unknown variant {variant!r}; one of {', '.join(VARIANTS)}")
        print(json.dumps(measure(variant, args.model, args.train, args.test)), flush=True)


if __name__ == "__main__":
    main()
