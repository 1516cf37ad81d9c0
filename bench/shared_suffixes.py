"""What decoding the tokens question suffixes begin with once saves, in-process.

Questions rendered after the same state all begin "Question: ...", and a family of questions
("Does the ticket mention a refund?", "... a date?") shares more. The engine decodes each such
token once, in every sequence that reaches it (app/engine/suffix_tree.py `suffix_rows`). Here the same
suffixes are decoded after the same 256-token state with that sharing on and off, alternating,
with the speed settings the server chose for this machine: rows in the batch and the decode's
time, best of the runs.

python -m bench.shared_suffixes [--model PATH] [--runs N]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from app.answering.prompting import OwnPrompter
from app.answering.service import distinct_suffixes
from app.config import Settings
from app.engine.engine import Engine
from app.engine.snapshot import Prefix
from app.engine.suffix_tree import suffix_rows
from app.serving.known_models import default_model_path
from app.serving.loading import prompter_for, speed_settings_for
from app.serving.specs import ModelSpec
from app.wire.contract import SystemOneRequest
from bench.client import sized_text
from bench.output import Progress, table
from bench.workloads import QUESTIONS, SENTENCES

STATE_TOKENS = 256
TOPICS = ["a refund", "a late delivery", "a broken item", "a wrong address", "a discount"]
TOPICS += ["an invoice", "a password reset", "a cancellation", "rude staff", "a legal threat"]
FAMILY = [{"type": "noul", "instructions": f"Does the ticket mention {topic}?"} for topic in TOPICS]


def question_sets(mixed: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    return {f"{len(mixed)} mixed questions": mixed, f"{len(FAMILY)} yes/no questions that begin alike": FAMILY}


def shared_suffixes(
    model: Path, sets: dict[str, list[dict[str, Any]]], sentences: list[str], runs: int = 5
) -> list[dict[str, Any]]:
    speed = speed_settings_for(ModelSpec.from_settings(Settings(model=model)))
    engine = Engine(model, n_ctx=4096, threads=speed.threads, repack=speed.repack, flash_attn=speed.flash_attn)
    try:
        prompter = prompter_for(engine)
        assert isinstance(prompter, OwnPrompter)  # the default model, onepass's own prompt
        state = sized_text(engine, sentences, STATE_TOKENS, 1)
        prefix, _ = engine.prefill(Prefix((*prompter.head_tokens, *prompter.state_tokens(state))))
        rows = []
        progress = Progress(len(sets) * runs, "shared suffix tokens")
        for name, questions in sets.items():
            request = SystemOneRequest.model_validate(
                {"model": "m", "state": state, "questions": {f"q{i}": q for i, q in enumerate(questions)}}
            )
            suffixes = distinct_suffixes(
                prompter.question(question) for question in request.questions.values()
            )  # as served
            times: dict[bool, list[float]] = {True: [], False: []}
            for _ in range(runs):
                for share in (True, False):
                    engine.shares_suffix_tokens = share
                    times[share].append(engine.decode_suffixes(prefix, suffixes).timing.decode_ms)
                progress.step(name)
            shared_ms, whole_ms = min(times[True]), min(times[False])
            rows.append(
                {
                    "questions": name,
                    "suffix_tokens": sum(len(suffix.tokens) for suffix in suffixes),
                    "rows_shared": len(suffix_rows([suffix.tokens for suffix in suffixes], 0)[0]),
                    "decode_ms_whole": round(whole_ms, 1),
                    "decode_ms_shared": round(shared_ms, 1),
                    "saved": round(1 - shared_ms / whole_ms, 3),
                }
            )
        return rows
    finally:
        engine.close()


def markdown(rows: list[dict[str, Any]]) -> list[str]:
    return [
        "",
        f"## Shared suffix tokens (in-process, after a {STATE_TOKENS}-token state, best of the runs)",
        "",
        *table(
            ["questions", "suffix tokens", "batch rows shared", "decode whole (ms)", "decode shared (ms)", "saved"],
            [
                [
                    r["questions"],
                    r["suffix_tokens"],
                    r["rows_shared"],
                    f"{r['decode_ms_whole']:,.0f}",
                    f"{r['decode_ms_shared']:,.0f}",
                    f"{r['saved']:.1%}",
                ]
                for r in rows
            ],
        ),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=default_model_path())
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()

    rows = shared_suffixes(args.model, question_sets(QUESTIONS[:5]), SENTENCES, args.runs)
    print(json.dumps(rows, indent=2))
    print("\n".join(markdown(rows)))


if __name__ == "__main__":
    main()
