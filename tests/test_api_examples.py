"""docs/api.md's examples are what the server answers now (tools/api_examples/ makes them)."""

from __future__ import annotations

from pathlib import Path

from tools.api_examples import page
from tools.api_examples.scenarios import examples

PAGE = """Before.

<!-- api-example: job -->

```json
{"id": "0123456789abcdef", "status": "done", "eta_s": 1.5, "noul": 2.5e-07}
```

<!-- /api-example -->

After.
"""


def test_the_pages_examples_are_what_the_server_answers(tmp_path: Path) -> None:
    made = examples(tmp_path)
    text = page.PAGE.read_text(encoding="utf-8")
    assert set(page.regions(text)) == set(made)
    differ = page.stale(text, made)
    assert not differ, "docs/api.md is stale (make api-examples):\n" + "\n".join(differ)


def test_only_ids_and_numbers_with_a_fraction_are_left_out_of_the_comparison() -> None:
    def made(line: str) -> dict[str, str]:
        return {"job": f"```json\n{line}\n```\n"}

    assert not page.stale(PAGE, made('{"id": "fedcba9876543210", "status": "done", "eta_s": 0.25, "noul": 1e-3}'))
    for changed in (
        '{"id": "fedcba9876543210", "status": "running", "eta_s": 0.25, "noul": 1e-3}',  # a word
        '{"id": "fedcba9876543210", "status": "done", "eta_s": null, "noul": 1e-3}',  # a null for a number
        '{"id": "fedcba9876543210", "status": "done", "eta_s": 0.25, "noul": 1e-3, "x": 1}',  # a field
    ):
        assert page.stale(PAGE, made(changed)), changed
    assert page.with_examples(PAGE, made("{}")).startswith("Before.\n\n<!-- api-example: job -->\n\n```json\n{}")
