"""The README's picture of the page: headless Chromium against the real default model.

    python -m bench.screenshot [--example ticket] [--out bench/results/playground.png] [-- server flags]

Starts `python -m app` on a free port with the shipped config, asks an example twice (a miss,
then a cache hit), prints what the page showed, and saves the answered page, top to bottom,
1200 pixels wide.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from app.fleet.processes import READY, ServerProcess
from app.paths import REPO_ROOT
from bench.browser import Page, chromium, find_tools

ANSWER_TIMEOUT_S = 600  # a first question on 2 CPU cores also measures its calibration prior


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--example", default="ticket", help="ticket, review or moderation (app/http/static/examples.json)"
    )
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "bench" / "results" / "playground.png")
    parser.add_argument("server_args", nargs="*", help="flags for python -m app, after --")
    args = parser.parse_args()
    tools = find_tools()
    if isinstance(tools, str):
        sys.exit(f"bench.screenshot: {tools}")
    server = ServerProcess(args.server_args)
    try:
        server.wait_for(READY, ANSWER_TIMEOUT_S)
        driver = chromium(tools, width=1200, height=900)
        try:
            page = Page(driver, server.url)
            page.open()
            page.one(f'#examples button[data-example="{args.example}"]').click()
            for _ in range(2):  # a miss, then the same state again: a hit
                page.ask(ANSWER_TIMEOUT_S)
                print(page.one("#request").text, end="\n\n")
            for card in page.all("#answers .answer"):
                print(card.text, end="\n\n")
            print(f"wrote {page.screenshot(args.out)}")
        finally:
            driver.quit()
    finally:
        server.stop()


if __name__ == "__main__":
    main()
