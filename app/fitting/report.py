"""A fitting run's report: Markdown per question (examples, the choice, before and after, reliability),
and a reliability diagram PNG where matplotlib is installed (the report says when it is not)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def _cell(scores: dict[str, Any] | None, name: str) -> str:
    return "-" if scores is None else f"{scores[name]:.3f}"


def markdown(reports: list[dict[str, Any]], model: str, examples: int, seconds: float, reused: int = 0) -> str:
    answered = f"{examples} examples answered in {seconds:.0f} s" + (
        f" ({reused} of them reused from an earlier run's evidence)" if reused else ""
    )
    lines = [
        f"# Calibration fitted to your examples: {model}",
        "",
        f"{answered}. Scores are cross-validated (5 folds, fewer where a question has few examples: the folds "
        "column): each example is scored by a fit that never saw it. 'before' is the calibration each question "
        "gets without a fit.",
        "",
        "| question | ids | labelled | method | adopted | folds | accuracy before -> after | Brier before -> after "
        "| ECE before -> after |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in reports:
        text = str(r["question"].get("instructions") or r["question"]["type"])[:60].replace("|", "/")
        before, after = r["before"], r["after"]
        method = "**not fitted: error**" if r["error"] else r["method"]
        lines.append(
            f"| {text} ({r['question']['type']}) | {r['name']} | {r['labelled']} | {method} "
            f"| {'yes' if r['adopted'] else 'no'} | {r['folds'] or '-'} "
            f"| {_cell(before, 'accuracy')} -> {_cell(after, 'accuracy')} "
            f"| {_cell(before, 'brier')} -> {_cell(after, 'brier')} | {_cell(before, 'ece')} -> {_cell(after, 'ece')} |"
        )
    lines += _sets_table(reports)
    lines += _unreached(reports)
    errors = [f"- {r['name']} ({r['key']}): {r['error']}" for r in reports if r["error"]]
    if errors:
        lines += [
            "",
            "## Errors (these questions keep the calibration they had; every other fit is stored)",
            "",
            *errors,
        ]
    warnings = [f"- {r['name']}: {r['warning']}" for r in reports if r["warning"]]
    if warnings:
        lines += ["", "## Warnings", "", *warnings]
    for r in reports:
        if r["before"] is None:
            continue
        lines += ["", f"## {r['name']}: reliability (confidence bins)", ""]
        lines += [
            "| bin | n before | confidence | accuracy | n after | confidence | accuracy |",
            "|---|---|---|---|---|---|---|",
        ]
        after = {(b["from"], b["to"]): b for b in r["after"]["reliability"]}
        before = {(b["from"], b["to"]): b for b in r["before"]["reliability"]}
        for edge in sorted(set(before) | set(after)):
            b, a = before.get(edge), after.get(edge)
            row = [f"{edge[0]:.1f}-{edge[1]:.1f}"]
            for found in (b, a):
                row += (
                    ["0", "-", "-"]
                    if found is None
                    else [str(found["n"]), f"{found['confidence']:.2f}", f"{found['accuracy']:.2f}"]
                )
            lines.append("| " + " | ".join(row) + " |")
        candidates = ", ".join(f"{name} {loss:.3f}" for name, loss in sorted(r["candidates"].items()))
        lines += ["", f"Cross-validated log loss: contextual {r['before']['log_loss']:.3f}; {candidates}."]
    return "\n".join(lines) + "\n"


def _sets_table(reports: list[dict[str, Any]]) -> list[str]:
    """Each adopted fit's answer sets on its held-out answers: how often they held the right label, and
    their mean size, at each coverage asked of them."""
    fitted = [r for r in reports if r.get("sets")]
    if not fitted:
        return []
    levels = list(fitted[0]["sets"])
    lines = [
        "",
        "## Answer sets (x_set)",
        "",
        "Each fitted answer carries the smallest set of labels that holds the right one at the coverage a "
        "request asks (90% by default). Measured on the held-out answers: half of them set the bound, the "
        "other half are scored, over 200 random halvings. A question without a fit gets no set.",
        "",
        "| question | " + " | ".join(f"{float(level):.0%} held / mean size" for level in levels) + " |",
        "|---|" + "---|" * len(levels),
    ]
    for r in fitted:
        cells = [f"{r['sets'][level]['coverage']:.3f} / {r['sets'][level]['size']:.2f}" for level in levels]
        lines.append(f"| {r['name']} | " + " | ".join(cells) + " |")
    return lines


def _unreached(reports: list[dict[str, Any]]) -> list[str]:
    """The questions a fit leaves unsure, and what their data suggests (app/fitting/reach.py)."""
    unsure = [r for r in reports if r.get("reach")]
    if not unsure:
        return []
    lines = ["", "## Where the fits stay unsure", ""]
    for r in unsure:
        found = r["reach"]
        width = "" if found["set_size"] is None else f", 90% sets of {found['set_size']:.2f} labels on average"
        lines += [
            f"- **{r['name']}**: cross-validated accuracy {found['accuracy']:.3f}{width}.",
            f"  More labels of the same kind: {found['more_labels']}.",
            f"  Otherwise: {found['advice']}.",
        ]
    return lines


# matplotlib is a dev extra, not a dependency of the server: the report's tables carry the same bins.
NO_MATPLOTLIB = (
    "No reliability diagram: matplotlib is not installed (`.venv/bin/python -m pip install matplotlib`, then run "
    "the same command again: it reuses the examples answered). The tables above hold the same bins."
)


def reliability_png(reports: list[dict[str, Any]], path: Path) -> str:
    """Draw the diagram at `path`, one panel per question; the report's line naming it, or saying why there is none."""
    shown = [r for r in reports if r["before"] is not None]
    if not shown:
        return "No reliability diagram: no question was scored."
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return NO_MATPLOTLIB
    columns = min(3, len(shown))
    rows = (len(shown) + columns - 1) // columns
    figure, axes = plt.subplots(rows, columns, figsize=(4 * columns, 4 * rows), squeeze=False)
    for ax, r in zip(axes.flat, shown, strict=False):
        ax.plot([0, 1], [0, 1], color="grey", linewidth=0.8)
        for name, colour in (("before", "tab:red"), ("after", "tab:blue")):
            bins = r[name]["reliability"]
            ax.plot(
                [b["confidence"] for b in bins],
                [b["accuracy"] for b in bins],
                "o-",
                color=colour,
                label=f"{name}: ECE {r[name]['ece']:.3f}",
            )
        ax.set_title(r["name"][:40], fontsize=9)
        ax.set_xlabel("confidence")
        ax.set_ylabel("accuracy")
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
        ax.legend(fontsize=8, loc="upper left")
    for ax in list(axes.flat)[len(shown) :]:
        ax.axis("off")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return f"Reliability diagram: {path.name}"
