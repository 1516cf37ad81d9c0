"""Whether two `make eval` reports differ by more than the noise of the items they share.

    python -m bench.compare_evals A.json B.json [--figures served|raw]

Both reports answer the same items, so the comparison is paired: what matters is the items one
got right and the other wrong. It prints the accuracies, those discordant counts, an exact
McNemar test on them (two-sided), and a paired bootstrap interval for B's accuracy minus A's,
overall and per question type.
"""

from __future__ import annotations

import argparse
import json
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.eval import load_items, top_answer

BOOTSTRAP_SAMPLES = 10_000
INTERVAL = 0.95


@dataclass(frozen=True)
class Paired:
    items: int
    accuracy_a: float
    accuracy_b: float
    only_a: int  # right in A, wrong in B
    only_b: int
    p_value: float  # exact McNemar, two-sided
    interval: tuple[float, float]  # of accuracy_b - accuracy_a


def right_by_item(report: Mapping[str, Any], figures: str) -> dict[str, bool]:
    """Item id -> whether the report's most probable answer was the labelled one. "served": the
    answers as the server gave them (a run with --calibration none has only raw ones)."""
    if figures == "served":
        figures = "calibrated" if report["items"]["calibrated"] else "raw"
    return {item_id: top_answer(probabilities) == label for item_id, probabilities, label in report["items"][figures]}


def mcnemar_p(only_a: int, only_b: int) -> float:
    """Two-sided exact test that discordant items fall on either side with equal chance."""
    n, k = only_a + only_b, min(only_a, only_b)
    if n == 0:
        return 1.0
    tail: float = sum(math.comb(n, j) for j in range(k + 1)) / 2**n
    return min(1.0, 2 * tail)


def bootstrap_interval(differences: Sequence[int], seed: int = 0) -> tuple[float, float]:
    """Percentile interval of the mean per-item difference, items drawn with replacement."""
    chance = random.Random(seed)
    n = len(differences)
    means = sorted(sum(chance.choices(differences, k=n)) / n for _ in range(BOOTSTRAP_SAMPLES))
    cut = int(BOOTSTRAP_SAMPLES * (1 - INTERVAL) / 2)
    return means[cut], means[-cut - 1]


def compare(a: Mapping[str, bool], b: Mapping[str, bool]) -> Paired:
    if a.keys() != b.keys():
        raise ValueError(f"the reports answer different items ({len(a.keys() ^ b.keys())} not in both)")
    ids = sorted(a)
    only_a = sum(a[i] and not b[i] for i in ids)
    only_b = sum(b[i] and not a[i] for i in ids)
    return Paired(
        items=len(ids),
        accuracy_a=sum(a[i] for i in ids) / len(ids),
        accuracy_b=sum(b[i] for i in ids) / len(ids),
        only_a=only_a,
        only_b=only_b,
        p_value=mcnemar_p(only_a, only_b),
        interval=bootstrap_interval([int(b[i]) - int(a[i]) for i in ids]),
    )


def table(a: Mapping[str, bool], b: Mapping[str, bool], types: Mapping[str, str]) -> str:
    rows = [
        "| items | n | A | B | right in A only | in B only | McNemar p | B - A, 95% interval |",
        "|---|---|---|---|---|---|---|---|",
    ]
    kinds = sorted(set(types.values()))
    groups = {"all": sorted(a)} | {kind: sorted(i for i in a if types.get(i) == kind) for kind in kinds}
    for name, ids in groups.items():
        if not ids:
            continue
        paired = compare({i: a[i] for i in ids}, {i: b[i] for i in ids})
        low, high = paired.interval
        rows.append(
            f"| {name} | {paired.items} | {paired.accuracy_a:.3f} | {paired.accuracy_b:.3f} | {paired.only_a} | "
            f"{paired.only_b} | {paired.p_value:.3f} | {low:+.3f} to {high:+.3f} |"
        )
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("a", type=Path)
    parser.add_argument("b", type=Path)
    parser.add_argument("--figures", choices=["served", "raw"], default="served")
    args = parser.parse_args()
    reports = [json.loads(path.read_text(encoding="utf-8")) for path in (args.a, args.b)]
    a, b = (right_by_item(report, args.figures) for report in reports)
    print(f"A: {args.a.name} ({reports[0]['model']}), B: {args.b.name} ({reports[1]['model']}), {args.figures}")
    print(table(a, b, {item["id"]: item["question"]["type"] for item in load_items()}))


if __name__ == "__main__":
    main()
