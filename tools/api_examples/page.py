"""docs/api.md's example regions: each between `<!-- api-example: NAME -->` and `<!-- /api-example -->`,
which of them differ from the examples made now, and the page with the new ones written in."""

from __future__ import annotations

import difflib
import re

from app.paths import REPO_ROOT
from tools.api_examples.render import normalised

PAGE = REPO_ROOT / "docs" / "api.md"
REGION = re.compile(r"(<!-- api-example: ([\w-]+) -->\n)(.*?)(<!-- /api-example -->)", re.DOTALL)


def regions(page: str) -> dict[str, str]:
    return {found[2]: found[3] for found in REGION.finditer(page)}


def with_examples(page: str, made: dict[str, str]) -> str:
    """The page with each region's text replaced by the example made for it."""
    missing = set(regions(page)) - set(made)
    assert not missing, f"no example is made for {sorted(missing)}"
    return REGION.sub(lambda found: found[1] + "\n" + made[found[2]] + "\n" + found[4], page)


def stale(page: str, made: dict[str, str]) -> list[str]:
    """The lines that differ, normalised, between the page and the page with the examples made now."""
    fresh = with_examples(page, made)
    return list(
        difflib.unified_diff(
            normalised(page).splitlines(), normalised(fresh).splitlines(), "docs/api.md", "made now", lineterm="", n=1
        )
    )
