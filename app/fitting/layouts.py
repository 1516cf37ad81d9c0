"""`onepass calibrate --layout both`: the same examples fitted in each prompt layout, side by side, and
which layout to serve.

state-first (system + state, then each question) answers a question the same whatever else is asked
about the state; question-first (system + every question, then the state) prefills the question set
once for every state, so a pipeline of new states asking the same questions pays less per state, but
each answer depends on the other questions in the set. Fitted to the user's examples, the second
loses little accuracy (docs/models.md): this module measures both on the user's own examples.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

# question-first is recommended when its cross-validated accuracy is at most ACCURACY_MARGIN below
# state-first's and a new state costs at most COST_MARGIN of state-first's in it, or when it is more
# than ACCURACY_MARGIN more accurate at a cost no more than state-first's over COST_MARGIN: its
# answers depend on the question set, which only a clear saving or a clear gain pays for.
ACCURACY_MARGIN = 0.02
COST_MARGIN = 0.9


@dataclass(frozen=True)
class LayoutRun:
    """One layout's fitting run: its questions' reports (QuestionReport.to_json) and what a state cost,
    while fitting (every question read out) and as served with the fits stored (runner.served_seconds)."""

    layout: str
    reports: list[dict[str, Any]]
    seconds_per_state: float | None  # median over the examples answered in this run; None: all reused
    served_per_state: float | None = None  # median over a few examples answered as new states, fits on

    @property
    def cost(self) -> float | None:
        """What a new state costs as this layout would be served: measured with its fits where it was."""
        return self.served_per_state if self.served_per_state is not None else self.seconds_per_state

    def scores(self) -> dict[str, float]:
        """The mean accuracy and ECE over its labelled questions, as fitted (cross-validated)."""
        fitted = [r["after"] or r["before"] for r in self.reports if r["before"] is not None]
        if not fitted:
            return {}
        return {
            "accuracy": statistics.fmean(s["accuracy"] for s in fitted),
            "ece": statistics.fmean(s["ece"] for s in fitted),
        }


@dataclass(frozen=True)
class Recommendation:
    layout: str
    why: str
    flag: str  # how to serve it


def recommend(state_first: LayoutRun, question_first: LayoutRun) -> Recommendation:
    """question-first where a new state costs at most COST_MARGIN of state-first's (as served with the
    fits) and its fitted accuracy is within ACCURACY_MARGIN of state-first's, or where its accuracy is
    more than ACCURACY_MARGIN above state-first's at no more than 1 / COST_MARGIN of its cost; otherwise
    state-first, the layout whose answers do not depend on the question set."""
    a, b = state_first.scores(), question_first.scores()
    first_cost, question_cost = state_first.cost, question_first.cost
    ratio = None if first_cost is None or question_cost is None else question_cost / first_cost
    cheaper = ratio is not None and ratio <= COST_MARGIN
    if not a or not b:
        return Recommendation("state-first", "no labelled question to compare the layouts on", "--layout state-first")
    gap = a["accuracy"] - b["accuracy"]
    if cheaper and gap <= ACCURACY_MARGIN:
        why = (
            f"fitted, it answers within {ACCURACY_MARGIN} of state-first's accuracy ({b['accuracy']:.3f} against "
            f"{a['accuracy']:.3f}) at {ratio:.2f} of its cost per new state; its answers depend on the other "
            "questions of the set, so serve it to requests that ask this whole question set"
        )
        return Recommendation("question-first", why, "--layout question-first")
    if ratio is not None and -gap > ACCURACY_MARGIN and ratio <= 1 / COST_MARGIN:
        why = (
            f"fitted, it answers more accurately than state-first ({b['accuracy']:.3f} against {a['accuracy']:.3f}) "
            f"at {ratio:.2f} of its cost per new state; its answers depend on the other questions of the set, so "
            "serve it to requests that ask this whole question set"
        )
        return Recommendation("question-first", why, "--layout question-first")
    if ratio is None:
        why = "no new state's cost was measured in both layouts (every example's evidence reused?)"
    elif not cheaper:
        why = f"a new state cost {ratio:.2f} of state-first's in question-first, not {COST_MARGIN} or less"
    else:
        why = f"question-first's fitted accuracy is {gap:.3f} below state-first's (more than {ACCURACY_MARGIN})"
    return Recommendation("state-first", why, "--layout state-first")


def markdown(runs: list[LayoutRun], chosen: Recommendation) -> list[str]:
    lines = [
        "",
        "## The two layouts",
        "",
        "| layout | mean accuracy (cross-validated) | mean ECE | seconds per new state, served with the fits "
        "(median) | seconds per example while fitting (median) |",
        "|---|---|---|---|---|",
    ]
    for run in runs:
        found = run.scores()
        served = "-" if run.served_per_state is None else f"{run.served_per_state:.3g}"
        fitting = "-" if run.seconds_per_state is None else f"{run.seconds_per_state:.3g}"
        accuracy = f"{found['accuracy']:.3f}" if found else "-"
        ece = f"{found['ece']:.3f}" if found else "-"
        lines.append(f"| {run.layout} | {accuracy} | {ece} | {served} | {fitting} |")
    lines += [
        "",
        f"Recommended: **{chosen.layout}**: {chosen.why}. Serve it with `{chosen.flag}` (or `layout = "
        f'"{chosen.layout}"` in the model\'s `[[models]]` entry); the fits of both layouts are stored, and '
        "each layout's server finds its own.",
    ]
    return lines
