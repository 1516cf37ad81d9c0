"""The user pages say what is true once: one machine of record for speed, no lab-notebook verdicts,
no claim that the code or a later run has since made false, and sample output of today's shape.

Each check names the contradiction it catches, as the read-through of 2026-12-03 found them
(../shared/review-2026-12-03.md, part A). The dated notes (docs/notes/) and CHANGELOG.md are history
and left out. What a program cannot check (that a figure was measured as its page says) is the
reviewer's.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

from app.answering.service import ModelService
from app.paths import REPO_ROOT
from app.wire.contract import SystemOneRequest, SystemOneResponse
from tests.support.pages import PAGES, Page, read_page, report

USER_PAGES = [page for page in PAGES if "notes" not in page.relative_to(REPO_ROOT).parts]
PERFORMANCE = REPO_ROOT / "docs" / "performance.md"

# Sentences that were true once, or never, each with what made it false. A page may say the thing
# again only in words that are true.
RETIRED = {
    r"current (development )?machine": "one machine of record, named in performance.md: link it",
    r"\btarget of\s+0\.\d": "an issue's target, not defined for the reader: say what was measured against what",
    r"\bnot settled\b": "a diary's word: say what is known, or move it to docs/notes/",
    r"not yet run on an NVIDIA|nobody has run it": "CUDA ran on an NVIDIA H200 on 2026-12-04 (docs/gpu.md)",
    r"(sub)?folder per model file and prompt": "fits are kept per model file; each applies under its prompt",
}


def sentences_matching(pattern: str, pages: list[Path]) -> list[str]:
    found = []
    for source in pages:
        page: Page = read_page(source)
        for text in page.plain:
            for match in re.finditer(pattern, text.text, re.IGNORECASE):
                found.append(f"{text.at(match.start())}: {match[0]!r}")
    return found


def test_no_user_page_says_what_has_become_false() -> None:
    problems = []
    for pattern, why in RETIRED.items():
        problems += [f"{where} ({why})" for where in sentences_matching(pattern, USER_PAGES)]
    assert not problems, report(problems, "retired claims on the user pages")


def test_the_machine_of_record_is_named_with_its_commit() -> None:
    """performance.md names one machine and one commit for its figures, and that commit exists."""
    page = read_page(PERFORMANCE)
    assert "The machine of record" in page.headings
    section = PERFORMANCE.read_text().split("## The machine of record", 1)[1].split("\n## ", 1)[0]
    assert re.search(r"CPU family \d+, model \d+", section), "the machine: its CPU family and model"
    commits = re.findall(r"commit ([0-9a-f]{7,40})\b", section)
    assert len(commits) == 1, f"one commit for every figure, found {commits}"
    subprocess.run(["git", "cat-file", "-e", f"{commits[0]}^{{commit}}"], cwd=REPO_ROOT, check=True)
    results = set(re.findall(r"bench/results/\d{4}-\d\d-\d\d-([0-9a-f]{7,40})-", PERFORMANCE.read_text()))
    assert results <= {commits[0]}, f"performance.md cites runs of other commits: {sorted(results - {commits[0]})}"


def test_other_pages_take_speed_figures_from_the_machine_of_record() -> None:
    """A page that calls a machine 'of record' links the section that names it."""
    problems = []
    for source in USER_PAGES:
        if source == PERFORMANCE:
            continue
        for text in read_page(source).plain:
            if "machine of record" in text.text and "performance.md#the-machine-of-record" not in source.read_text():
                problems.append(f"{text.at()}: names the machine of record without linking it")
    assert not problems, report(problems, "pages")


def recorded_outputs(source: Path) -> list[tuple[int, dict[str, object]]]:
    """The JSON blocks a page labels as real output (the paragraph before them says "Real output")."""
    blocks, lines = [], source.read_text().splitlines()
    for number, line in enumerate(lines):
        if line.strip() == "```json" and "real output" in " ".join(lines[max(0, number - 5) : number]).lower():
            end = lines.index("```", number + 1)
            blocks.append((number + 1, json.loads("\n".join(lines[number + 1 : end]))))
    return blocks


def test_recorded_output_has_the_shape_of_an_answer_today(tiny_service: ModelService) -> None:
    """quickstart.md's recorded answer is one the contract reads, with every field the same request gets
    now (the tiny model's answer to examples/ticket.json: its fields, not its numbers)."""
    request = SystemOneRequest.model_validate(json.loads((REPO_ROOT / "examples" / "ticket.json").read_text()))
    today = tiny_service.answer(request).wire()
    recorded = recorded_outputs(REPO_ROOT / "docs" / "quickstart.md")
    assert recorded, "quickstart.md records a real answer"
    for line, body in recorded:
        SystemOneResponse.model_validate(body)
        missing = sorted(set(today) - set(body))
        assert not missing, f"docs/quickstart.md:{line}: the recorded answer lacks {missing}"
