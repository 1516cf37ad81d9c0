"""The documentation pages read for the tests that check them: each page's prose, inline code, code
blocks' lines and comments, links and headings, each with the file and line it came from; the
Makefile's rules."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from functools import cache
from pathlib import Path

from app.paths import REPO_ROOT

PAGES = [REPO_ROOT / "README.md", REPO_ROOT / "bench" / "README.md", *sorted((REPO_ROOT / "docs").rglob("*.md"))]


def report(problems: Sequence[str], what: str) -> str:
    return f"{len(problems)} {what}:\n" + "\n".join(problems)


@dataclasses.dataclass(frozen=True)
class Text:
    """Some text of a file, from the line it starts on (it may run over several lines)."""

    source: Path
    line: int
    text: str

    def line_at(self, offset: int) -> int:
        return self.line + self.text.count("\n", 0, offset)

    def at(self, offset: int = 0) -> str:
        """file:line of the character at `offset`."""
        return f"{self.source.relative_to(REPO_ROOT)}:{self.line_at(offset)}"


@dataclasses.dataclass
class Page:
    source: Path
    plain: list[Text] = dataclasses.field(default_factory=list)  # all of it, without backticks and link targets
    code: list[Text] = dataclasses.field(default_factory=list)  # inline code, and code blocks' shell lines
    comments: list[Text] = dataclasses.field(default_factory=list)  # code blocks' and config files' comments
    links: list[Text] = dataclasses.field(default_factory=list)  # markdown links' targets
    headings: list[str] = dataclasses.field(default_factory=list)


FENCE = re.compile(r"\s*(```|~~~)\s*([\w+-]*)")

SHELL_BLOCKS = ("", "sh", "shell", "bash", "console")

HEADING = re.compile(r"#{1,6}\s+(.+?)\s*#*\s*")

CODE_SPAN = re.compile(r"(`+)(.+?)(?<!`)\1(?!`)", re.DOTALL)

LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^()\s<>]+)>?(?:\s+\"[^\"]*\")?\s*\)")

COMMENT = re.compile(r"(?:^|\s)#")


def _split_comment(line: str) -> tuple[str, str]:
    """A shell line's command and its comment."""
    found = COMMENT.search(line)
    return (line, "") if found is None else (line[: found.start()], line[found.end() :])


def _read_paragraph(page: Page, paragraph: Text) -> None:
    text = paragraph.text
    for link in LINK.finditer(text):
        page.links.append(Text(page.source, paragraph.line_at(link.start(1)), link[1]))
        text = text[: link.start(1)] + " " * len(link[1]) + text[link.end(1) :]  # offsets stay
    for span in CODE_SPAN.finditer(text):
        page.code.append(Text(page.source, paragraph.line_at(span.start()), " ".join(span[2].split())))
    page.plain.append(dataclasses.replace(paragraph, text=text.replace("`", " ")))


@cache
def read_page(source: Path) -> Page:
    """A markdown page: its prose and inline code by paragraph, its code blocks by line, its links."""
    page = Page(source)
    paragraph: list[str] = []
    fence: tuple[str, str] | None = None  # the open code block's fence and info string
    continued: list[str] = []  # a shell line continued with a backslash
    for number, line in enumerate([*source.read_text(encoding="utf-8").splitlines(), ""], 1):
        opened = FENCE.fullmatch(line)
        if fence is not None:
            if opened is not None and opened[1] == fence[0] and not opened[2]:
                fence = None
                continue
            page.plain.append(Text(source, number, line))
            if fence[1] in SHELL_BLOCKS:
                command, comment = _split_comment(line)
                page.comments.append(Text(source, number, comment))
                continued.append(command.removesuffix("\\"))
                if not command.endswith("\\"):
                    page.code.append(Text(source, number + 1 - len(continued), " ".join(continued)))
                    continued = []
            continue
        heading = HEADING.fullmatch(line)
        if opened is None and heading is None and line.strip():
            paragraph.append(line)
            continue
        if paragraph:
            _read_paragraph(page, Text(source, number - len(paragraph), "\n".join(paragraph)))
            paragraph = []
        if opened is not None:
            fence = (opened[1], opened[2].lower())
        elif heading is not None:
            page.headings.append(heading[1])
            _read_paragraph(page, Text(source, number, line))
    return page


@cache
def makefile_rules() -> dict[str, list[str]]:
    """The Makefile's targets (less those a variable names) and their recipes, continued lines joined."""
    rules: dict[str, list[str]] = {}
    recipe: list[str] | None = None
    for line in (REPO_ROOT / "Makefile").read_text(encoding="utf-8").replace("\\\n", " ").splitlines():
        if line.startswith("\t"):
            if recipe is not None:
                recipe.append(line.strip())
            continue
        rule = re.match(r"([^\s:=#$][^:=#]*?)\s*::?(?!=)", line)
        if rule is not None:
            recipe = []
            rules.update((t, recipe) for t in rule[1].split() if not t.startswith(".") and "$" not in t)
        elif line.strip() and not line.startswith("#"):
            recipe = None
    return rules
