"""The installed build on an AVX2-only CPU, emulated: it decodes, or it fails with words.

qemu's user-mode emulator with `-cpu EPYC` runs AVX2, FMA and F16C code and raises SIGILL on
any AVX-512 instruction, as the AVX2-only EPYC in tests/cpuinfo does. So this runs the build
check's child, a real decode through the installed llama.cpp, as that machine would.
"""

from __future__ import annotations

import platform
import shutil
import sys
from pathlib import Path

from app.platform.build_check import read_build_record, run_check
from app.platform.cpu import Cpu, parse_proc_cpuinfo
from tests.support.skip_groups import skip, skip_if

EPYC = Path(__file__).parent / "cpuinfo" / "amd-epyc-avx2-no-avx512.txt"
QEMU = shutil.which("qemu-x86_64")

pytestmark = [
    skip_if(platform.machine() != "x86_64", "emulated-cpu", "emulates an x86-64 CPU on an x86-64 host"),
    skip_if(QEMU is None, "emulated-cpu", "no qemu-x86_64: `apt-get install qemu-user` (make test does, as root)"),
]


def test_the_installed_build_on_an_emulated_avx2_only_epyc() -> None:
    assert QEMU is not None
    model, features = parse_proc_cpuinfo(EPYC.read_text(), "x86_64")
    epyc = Cpu(arch="x86_64", system="Linux", model=model, features=features)
    record = read_build_record()
    assert record is not None, "no llama-build.json: install with make setup"
    recorded = record.get("features")
    assert isinstance(recorded, list)
    built_for = {str(feature) for feature in recorded}
    if not built_for <= epyc.features and "avx512f" not in built_for:
        skip(
            "emulated-cpu-inconclusive",
            f"the build adds only {built_for - epyc.features}, which a tiny f32 decode may never execute",
        )
    problem = run_check(
        child=[QEMU, "-cpu", "EPYC", sys.executable, "-m", "app.platform.build_check", "--child"], cpu=epyc
    )
    if built_for <= epyc.features:  # a build for this EPYC (make test ONEPASS_CPUINFO=...): it must run
        assert problem is None
    else:  # an AVX-512 build (ggml's f32 kernels use it): it must die, and say why and how to rebuild
        assert problem is not None
        assert "SIGILL: illegal instruction" in problem
        assert "missing here: " in problem and "make clean-build && make run" in problem
