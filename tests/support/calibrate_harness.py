"""`onepass calibrate` run as a user runs it, with faults a test can aim (tests/test_calibrate_runs.py):

    python -m tests.support.calibrate_harness [--block-after K] [--fail-key KEY] -- EXAMPLES [calibrate flags]

--block-after K: after K examples are answered, print BLOCKED and wait (for stdin, that is until
killed) before answering the next one, so that a test kills the process at a known point.
--fail-key KEY: fitting the question whose content key is KEY raises.
At the end it prints `answered N` on stderr: how many examples the model answered in this run.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any
from unittest import mock

from app.answering.service import ModelService
from app.calibration import Calibration, Evidence
from app.fitting.cli import main as calibrate
from app.wire.contract import SystemOneRequest


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--block-after", type=int)
    parser.add_argument("--fail-key")
    ours, rest = parser.parse_known_args()
    argv = rest[1:] if rest[:1] == ["--"] else rest
    answered = 0
    evidence, choose = ModelService.evidence, Calibration.choose

    def counted(self: ModelService, request: SystemOneRequest, *, hidden: bool = False) -> dict[str, Evidence]:
        nonlocal answered
        if ours.block_after is not None and answered == ours.block_after:
            print("BLOCKED", flush=True)
            sys.stdin.read()
        answered += 1
        return evidence(self, request, hidden=hidden)

    def failing(self: Calibration, examples: Any, unlabelled: Any, key: str, ordered: bool, drawn: Any = None) -> Any:
        if key == ours.fail_key:
            raise RuntimeError("a fault injected into this question's fit")
        return choose(self, examples, unlabelled, key, ordered, drawn)

    with (
        mock.patch.object(ModelService, "evidence", counted),
        mock.patch.object(Calibration, "choose", failing if ours.fail_key else choose),
    ):
        try:
            calibrate(argv)
        finally:
            print(f"answered {answered}", file=sys.stderr)


if __name__ == "__main__":
    main()
