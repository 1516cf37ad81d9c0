"""docs/api.md's examples, made by the real server and compared with the page or written into it.

Compared, it exits 1 and prints the lines that differ where the page is stale; --write writes them into
the page (make api-examples)."""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
from pathlib import Path

from app.paths import REPO_ROOT
from tools.api_examples.page import PAGE, regions, stale, with_examples
from tools.api_examples.scenarios import examples


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tools.api_examples", description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="write the examples into docs/api.md")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    with tempfile.TemporaryDirectory(prefix="apidoc-") as folder:
        made = examples(Path(folder).resolve())
    page = PAGE.read_text(encoding="utf-8")
    if args.write:
        PAGE.write_text(with_examples(page, made), encoding="utf-8")
        print(f"{len(regions(page))} examples written to {PAGE.relative_to(REPO_ROOT)}")
        return
    differ = stale(page, made)
    if differ:
        print("\n".join(differ))
        sys.exit("docs/api.md's examples are not what the server answers now: make api-examples")
    print(f"docs/api.md: its {len(regions(page))} examples are what the server answers")


if __name__ == "__main__":
    main()
