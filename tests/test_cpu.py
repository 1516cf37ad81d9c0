"""The build's CPU detection over recorded CPUs: flags from the machine, AMX off, a key per CPU."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from app.paths import REPO_ROOT
from app.platform.build_check import explain, run_check
from app.platform.cpu import (
    Cpu,
    cmake_args,
    missing_features,
    normalise_arch,
    parse_proc_cpuinfo,
    parse_sysctl,
    thread_counts,
    wheel_key,
)
from tests.support.skip_groups import skip_if

RECORDED = Path(__file__).parent / "cpuinfo"


def linux(name: str, arch: str) -> Cpu:
    model, features = parse_proc_cpuinfo((RECORDED / name).read_text(), arch)
    return Cpu(arch=arch, system="Linux", model=model, features=features)


def macos(name: str, arch: str) -> Cpu:
    model, features = parse_sysctl((RECORDED / name).read_text(), arch)
    return Cpu(arch=arch, system="Darwin", model=model, features=features)


def enabled(args: list[str]) -> set[str]:
    return {a[2:].removesuffix("=ON") for a in args if a.endswith("=ON")}


X86_EXPLICIT = {
    "GGML_SSE42", "GGML_AVX", "GGML_AVX2", "GGML_FMA", "GGML_F16C", "GGML_BMI2", "GGML_AVX_VNNI",
    "GGML_AVX512", "GGML_AVX512_VBMI", "GGML_AVX512_VNNI", "GGML_AVX512_BF16",
    "GGML_AMX_TILE", "GGML_AMX_INT8", "GGML_AMX_BF16",
}  # fmt: skip


def test_an_avx2_only_epyc_gets_no_avx512_and_every_option_named() -> None:
    cpu = linux("amd-epyc-avx2-no-avx512.txt", "x86_64")
    args = cmake_args(cpu)
    assert cpu.model == "AMD EPYC"
    assert enabled(args) == {"GGML_SSE42", "GGML_AVX", "GGML_AVX2", "GGML_FMA", "GGML_F16C", "GGML_BMI2"}
    # ggml turns AVX..BMI2 on by default once native is off: every option must be spelled out
    assert {a[2:].split("=")[0] for a in args} == X86_EXPLICIT | {"GGML_NATIVE"}
    assert "-DGGML_NATIVE=OFF" in args


def test_a_sapphire_rapids_xeon_gets_avx512_but_never_amx() -> None:
    cpu = linux("xeon-sapphire-rapids-amx.txt", "x86_64")
    assert {"amx_tile", "amx_int8", "amx_bf16"} <= cpu.features  # the CPU has AMX ...
    args = cmake_args(cpu)
    assert {"-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF"} <= set(args)  # ... the build not
    assert {"GGML_AVX512", "GGML_AVX512_VBMI", "GGML_AVX512_VNNI", "GGML_AVX512_BF16", "GGML_AVX_VNNI"} <= enabled(args)


def test_zen4_gets_avx512_without_the_vex_vnni_it_lacks() -> None:
    args = cmake_args(linux("amd-zen4-avx512.txt", "x86_64"))
    assert {"GGML_AVX512", "GGML_AVX512_VNNI", "GGML_AVX512_BF16", "GGML_AVX512_VBMI"} <= enabled(args)
    assert "-DGGML_AVX_VNNI=OFF" in args


def test_this_machine_record_gets_the_flags_the_project_was_measured_with() -> None:
    args = cmake_args(linux("xeon-avx512-no-amx.txt", "x86_64"))
    assert enabled(args) == X86_EXPLICIT - {"GGML_AMX_TILE", "GGML_AMX_INT8", "GGML_AMX_BF16"}


def test_avx512_needs_all_five_subsets_ggml_compiles_for() -> None:
    # a Xeon Phi has avx512f and avx512cd but not vl/bw/dq: ggml's -mavx512vl code would crash there
    phi = Cpu("x86_64", "Linux", "Xeon Phi", frozenset({"sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512cd"}))
    assert "-DGGML_AVX512=OFF" in cmake_args(phi)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("arm64-graviton3.txt", {"asimd", "asimdhp", "asimddp", "i8mm", "bf16", "sve", "fphp"}),
        ("arm64-raspberry-pi5.txt", {"asimd", "asimdhp", "asimddp", "fphp"}),
    ],
)
def test_arm64_linux_uses_ggml_native_detection_and_keys_on_its_features(name: str, expected: set[str]) -> None:
    cpu = linux(name, "arm64")
    assert cpu.features == expected
    assert cpu.model.startswith("cpu implementer 0x41, cpu part")
    assert cmake_args(cpu) == ["-DGGML_NATIVE=ON"]


def test_macos_apple_silicon_and_intel_read_from_sysctl() -> None:
    m2 = macos("macos-apple-m2.sysctl.txt", "arm64")
    assert m2.model == "Apple M2"
    assert m2.features == {"asimd", "asimdhp", "asimddp", "i8mm", "bf16"}  # SME is 0 on an M2
    assert cmake_args(m2) == ["-DGGML_NATIVE=ON"]
    intel = macos("macos-intel-i9.sysctl.txt", "x86_64")
    assert intel.features == {"sse4_2", "avx", "avx2", "fma", "f16c", "bmi2"}
    assert "-DGGML_AVX512=OFF" in cmake_args(intel) and "-DGGML_AVX2=ON" in cmake_args(intel)


def test_the_wheel_key_differs_by_cpu_even_for_the_same_flags() -> None:
    epyc, xeon = linux("amd-epyc-avx2-no-avx512.txt", "x86_64"), linux("xeon-avx512-no-amx.txt", "x86_64")
    user_args = "-DGGML_CUDA=on"  # the same typed flags on both machines ...
    assert wheel_key("0.3.36", user_args, epyc) != wheel_key("0.3.36", user_args, xeon)  # ... two wheels
    assert wheel_key("0.3.36", user_args, epyc) == wheel_key("0.3.36", "  -DGGML_CUDA=on ", epyc)
    assert wheel_key("0.3.36", user_args, epyc) != wheel_key("0.3.37", user_args, epyc)
    pi, graviton = linux("arm64-raspberry-pi5.txt", "arm64"), linux("arm64-graviton3.txt", "arm64")
    assert wheel_key("0.3.36", "-DGGML_NATIVE=ON", pi) != wheel_key("0.3.36", "-DGGML_NATIVE=ON", graviton)


def test_missing_features_name_what_an_avx512_build_needs_on_an_avx2_cpu() -> None:
    xeon, epyc = linux("xeon-avx512-no-amx.txt", "x86_64"), linux("amd-epyc-avx2-no-avx512.txt", "x86_64")
    missing = missing_features(xeon.describe(), epyc)
    assert {"avx512f", "avx512bw", "avx512_vnni", "avx_vnni"} <= set(missing)
    assert missing_features(epyc.describe(), xeon) == []
    assert missing_features(xeon.describe(), linux("arm64-graviton3.txt", "arm64"))[0] == "arch x86_64"


def test_the_makefile_helper_prints_flags_for_a_recorded_cpu() -> None:
    env = {"ONEPASS_CPUINFO": str(RECORDED / "amd-epyc-avx2-no-avx512.txt"), "PATH": "/usr/bin:/bin"}
    out = subprocess.run(
        [sys.executable, "-m", "app.platform.cpu", "cmake-args"], capture_output=True, text=True, env=env, check=True
    ).stdout
    if normalise_arch(platform.machine()) == "x86_64":
        assert "-DGGML_AVX512=OFF" in out and "-DGGML_AVX2=ON" in out
    else:  # the recorded flags are x86's; an arm64 host still builds natively for itself
        assert out.strip() == "-DGGML_NATIVE=ON"


def test_a_build_that_dies_is_explained_with_features_and_the_rebuild_command() -> None:
    xeon, epyc = linux("xeon-avx512-no-amx.txt", "x86_64"), linux("amd-epyc-avx2-no-avx512.txt", "x86_64")
    # a real child process that dies of SIGILL, as an AVX-512 build does on this EPYC
    dies = [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGILL)"]
    message = run_check(child=dies, cpu=epyc)
    assert message is not None and "SIGILL: illegal instruction" in message
    assert "make clean-build && make run" in message
    record = xeon.describe() | {"cmake_args": "-DGGML_AVX512=ON"}
    explained = explain(-4, "", record, epyc)
    assert "missing here: avx512_bf16 avx512_vnni avx512bw" in explained
    assert "this CPU (AMD EPYC) has x86_64: avx avx2 bmi2 f16c fma sse4_2" in explained


def test_the_installed_build_decodes_on_this_cpu() -> None:
    assert run_check(child=[sys.executable, "-m", "app.platform.build_check", "--child"]) is None


def test_doctor_reports_the_cpu_the_build_its_check_and_the_models() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "tools.doctor", "--venv", sys.prefix],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    sections = [line for line in out.splitlines() if line and not line.startswith(" ")]
    assert sections == [
        "system:",
        "cpu:",
        "llama.cpp:",
        "build check:",
        "wheel:",
        "models:",
        "speed settings chosen (threads, repacked weights, flash attention):",
    ]
    # llama_print_system_info of the installed build: every backend's features, a GPU's before the CPU's
    assert "system info: " in out and "CPU :" in out
    assert "GPU offload supported:" in out
    assert "a tiny decode ran on this CPU" in out
    assert "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf:" in out
    if (REPO_ROOT / "models" / "qwen2.5-coder-1.5b-instruct-q4_k_m-decision.gguf").is_file():  # make test makes it
        assert "q4_k_m-decision.gguf: made from the default model (make model-decision)" in out
    tuned = out.split("speed settings chosen (threads, repacked weights, flash attention):\n", 1)[1]
    # "repack on (...)", "... off (...)" or "... not measured yet" (threads first where cores and CPUs
    # differ): read, never measured here
    assert "repack " in tuned or "threads (" in tuned


@skip_if(platform.system() != "Linux", "linux", "reads Linux's CPU topology files")
def test_hyperthreads_count_once_per_core(tmp_path: Path) -> None:
    cpus = sorted(os.sched_getaffinity(0))

    def topology(siblings: dict[int, str]) -> Path:
        root = tmp_path / str(len(list(tmp_path.iterdir())))
        for cpu, text in siblings.items():
            (root / f"cpu{cpu}" / "topology").mkdir(parents=True)
            (root / f"cpu{cpu}" / "topology" / "thread_siblings_list").write_text(text + "\n")
        return root

    alone = topology({cpu: str(cpu) for cpu in cpus})
    assert thread_counts(alone) == (len(cpus), len(cpus))
    paired = topology({cpu: f"{cpu - cpu % 2}-{cpu - cpu % 2 + 1}" for cpu in cpus})  # two per core
    assert thread_counts(paired) == (len({cpu // 2 for cpu in cpus}), len(cpus))
    assert thread_counts(tmp_path / "missing") == (len(cpus), len(cpus))  # no topology: a core per CPU
