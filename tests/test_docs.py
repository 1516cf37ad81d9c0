"""The pages hold together: the README stays a page a user reads to the end, every link between
the pages leads somewhere, and the configuration reference is the settings as declared."""

from __future__ import annotations

import re

from app.paths import REPO_ROOT
from app.serving import settings_reference

PAGES = [REPO_ROOT / "README.md", REPO_ROOT / "CHANGELOG.md", *sorted((REPO_ROOT / "docs").rglob("*.md"))]
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def test_the_readme_is_one_page() -> None:
    assert len((REPO_ROOT / "README.md").read_text().splitlines()) <= 160


def test_every_relative_link_leads_to_a_file() -> None:
    for page in PAGES:
        for target in LINK.findall(page.read_text()):
            if "://" in target:
                continue
            assert (page.parent / target).exists(), f"{page.relative_to(REPO_ROOT)} links to a missing {target}"


def test_the_configuration_reference_is_the_settings_as_declared() -> None:
    page = settings_reference.PAGE.read_text()
    assert settings_reference.rendered(page) == page, (
        "docs/configuration.md is stale: python -m app.serving.settings_reference"
    )
    for option in ("n_ctx", "session_cache_disk_bytes", "calibration_dir", "layout"):
        assert f"| `{option}` |" in page


def test_no_page_or_module_cites_a_file_that_is_not_there() -> None:
    cited = re.compile(r"\b([A-Z][A-Z_]+\.md)\b")
    for path in [REPO_ROOT / "pyproject.toml", *sorted((REPO_ROOT / "app").rglob("*.py"))]:
        for name in cited.findall(path.read_text()):
            assert (REPO_ROOT / name).exists(), f"{path.relative_to(REPO_ROOT)} cites {name}"
