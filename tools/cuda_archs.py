"""The CUDA architectures of this machine's NVIDIA GPUs, for `make setup GPU=cuda`: each distinct compute
capability nvidia-smi reports (9.0 -> 90), joined by ";" as CMAKE_CUDA_ARCHITECTURES takes them.

Prints nothing where nvidia-smi is missing, fails, hangs or reports no GPU (the Makefile then builds for
its default architectures), and says why on stderr. Standard library only: the Makefile runs it with any
Python 3.11, before the venv exists.
"""

from __future__ import annotations

import re
import subprocess
import sys

QUERY = ["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"]
TIMEOUT_S = 30.0  # a driver that hangs must not hang the build's make


def archs_of(output: str) -> list[str]:
    """Each distinct compute capability in nvidia-smi's output as an architecture number, lowest first."""
    found = {int(major) * 10 + int(minor) for major, minor in re.findall(r"^\s*(\d+)\.(\d)\s*$", output, re.M)}
    return [str(arch) for arch in sorted(found)]


def detect() -> tuple[list[str], str]:
    """This machine's architectures, and why there are none where there are none."""
    try:
        done = subprocess.run(QUERY, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    except FileNotFoundError:
        return [], "nvidia-smi is not installed"
    except subprocess.TimeoutExpired:
        return [], f"nvidia-smi did not answer within {TIMEOUT_S:g} s"
    if done.returncode != 0:
        return [], f"nvidia-smi failed: {(done.stderr or done.stdout).strip()[:200]}"
    archs = archs_of(done.stdout)
    return archs, "" if archs else f"nvidia-smi reported no compute capability: {done.stdout.strip()[:200]!r}"


def main() -> None:
    archs, why = detect()
    if not archs:
        print(f"tools/cuda_archs.py: {why}", file=sys.stderr)
    print(";".join(archs))


if __name__ == "__main__":
    main()
