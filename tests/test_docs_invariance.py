"""The pages promise no invariance the table does not grant: docs/exactness.md's table is the one
app/answering/dependence.py declares (and tests/test_properties.py observes), and every other
paragraph that says what an answer does or does not depend on (ids, the order of questions or
options, the other questions) links that table."""

from __future__ import annotations

import re

from app.answering.dependence import TABLE, Cell, Invariances
from app.paths import REPO_ROOT
from app.wire.contract import DEPENDS_ON, DependsOn
from tests.support.pages import PAGES, Page, Text, read_page, report

HOME = REPO_ROOT / "docs" / "exactness.md"
HEADING = "What an answer depends on"
ANCHOR = "what-an-answer-depends-on"

COLUMNS: dict[DependsOn, str] = {
    "ids": "renaming ids",
    "question_order": "reordering the questions",
    "option_order": "reordering a choice's options",
    "other_questions": "asking other questions too",
}
CELLS: dict[Cell, str] = {"holds": "holds", "rounding": "holds to rounding", "breaks": "**changes**"}
GIVEN: dict[DependsOn, str] = {"ids": "`id`", "question_order": "`questions`", "other_questions": "`questions`"}
OWN = {"state-first": "onepass's own, state-first", "question-first": "onepass's own, question-first"}


def cell(row: Invariances, what: DependsOn) -> str:
    text = CELLS[row.cell(what)]
    if what == "option_order" and row.cell(what) == "breaks" and row.options_from > 2:
        text += f" ({row.options_from} options or more)"
    if what in row.template:
        text += f", unless the template prints {GIVEN[what]}"
    return text


def table() -> list[str]:
    """TABLE as docs/exactness.md shows it."""
    lines = [
        "| prompt | " + " | ".join(COLUMNS[what] for what in DEPENDS_ON) + " | why |",
        "|---" * (len(DEPENDS_ON) + 2) + "|",
    ]
    for name, row in TABLE.items():
        cells = [cell(row, what) for what in DEPENDS_ON]
        lines.append(f"| {OWN.get(name, f'`{name}`')} | " + " | ".join(cells) + f" | {row.why} |")
    return lines


def test_the_table_on_the_page_is_the_one_the_code_declares() -> None:
    assert HEADING in read_page(HOME).headings, f"docs/exactness.md has no section {HEADING!r}"
    expected = "\n".join(table())
    assert expected in HOME.read_text(encoding="utf-8"), "docs/exactness.md should show:\n" + expected


# A paragraph is about what an answer depends on when it names one of these...
SUBJECT = re.compile(
    r"order of (?:the |a choice's |its )?(?:questions|options)|(?:question|option)s? order|reorder\w*|"
    r"renam\w* (?:a |an |the )?(?:question )?id|ids? never|question ids|other questions",
    re.IGNORECASE,
)
# ...and says it does not change.
PROMISE = re.compile(
    r"\bnever\b|does not change|do not change|doesn't change|not depend|bit-identical|bit for bit|no: ",
    re.IGNORECASE,
)
# Paragraphs that say such a thing of something other than an answer, each for the reason given.
NOT_ABOUT_ANSWERS = {
    "in any option order), never by its id": "docs/calibration.md: how a fit is matched to its question",
}
# The sentences that promised every prompt what only onepass's own gets (review of 2026-12-03, A1).
WITHDRAWN = [
    "renaming one does not change its answer, nor does the order of the questions or which other questions are asked",
    "The order of a choice's options does not change its answer.",
    "An answer never depends on question ids, on the order of questions or options",
    "whatever the question ids or the order of questions and options",
    "Will an answer change if I reorder questions or options, or rename question ids? No: those are bit-identical.",
]


def links_the_table(page: Page, paragraph: Text) -> bool:
    last = paragraph.line + paragraph.text.count("\n")
    targets = [link.text for link in page.links if paragraph.line <= link.line <= last]
    return any(target.endswith(f"#{ANCHOR}") for target in targets)


def in_the_tables_section(page: Page, paragraph: Text) -> bool:
    """On docs/exactness.md, the section of the table itself, up to the next heading."""
    if page.source != HOME:
        return False
    lines = HOME.read_text(encoding="utf-8").splitlines()
    start = next((i for i, line in enumerate(lines, 1) if line.lstrip("#").strip() == HEADING), None)
    if start is None:
        return False
    end = next((i for i, line in enumerate(lines, 1) if i > start and line.startswith("#")), len(lines) + 1)
    return start <= paragraph.line < end


def promises(page: Page, excused: set[str]) -> list[str]:
    problems = []
    for paragraph in page.plain:
        text = " ".join(paragraph.text.replace("*", "").split())
        problems += [f"{paragraph.at()}: withdrawn promise: {gone!r}" for gone in WITHDRAWN if gone in text]
        excuse = next((phrase for phrase in NOT_ABOUT_ANSWERS if phrase in text), None)
        if excuse is not None:
            excused.add(excuse)
            continue
        subject, promise = SUBJECT.search(text), PROMISE.search(text)
        if subject and promise and not links_the_table(page, paragraph) and not in_the_tables_section(page, paragraph):
            problems.append(
                f"{paragraph.at()}: says what an answer does not depend on ({subject[0]!r}, {promise[0]!r}) "
                f"without linking exactness.md#{ANCHOR}"
            )
    return problems


def test_no_page_promises_an_invariance_without_the_table() -> None:
    excused: set[str] = set()
    problems = [
        problem for source in PAGES if "notes" not in source.parts for problem in promises(read_page(source), excused)
    ]
    problems += [
        f"NOT_ABOUT_ANSWERS: {phrase!r} is on no page now: drop it" for phrase in NOT_ABOUT_ANSWERS.keys() - excused
    ]
    assert not problems, report(problems, "promises of invariance that do not point to the table")
