"""The host CPU: its instruction-set features, the llama.cpp build flags they call for, the wheel key.

Standard library only: the Makefile runs `python3 -m app.platform.cpu ...` before anything is installed.

    python3 -m app.platform.cpu cmake-args         # the CPU flags for this machine's llama.cpp build
    python3 -m app.platform.cpu key VERSION ARGS   # the wheel cache key: llama-cpp-python version, flags, CPU
    python3 -m app.platform.cpu describe [VERSION ARGS [GPU]]
                                         # JSON: arch, model, features (+ the build's; the wheel keeps it)

On x86-64 the build names every instruction set explicitly, ON or OFF, from what the CPU
reports, instead of `-march=native`: ggml turns AVX, AVX2, FMA, F16C and BMI2 on by default
when native is off, so an option left unnamed could still emit an instruction the CPU lacks.
On arm64 ggml's own native detection (`-mcpu=native` plus feature probes) is safe and used.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

# ggml's x86 options and the /proc/cpuinfo flags each one needs (all of them).
X86_OPTIONS: dict[str, tuple[str, ...]] = {
    "GGML_SSE42": ("sse4_2",),
    "GGML_AVX": ("avx",),
    "GGML_AVX2": ("avx2",),
    "GGML_FMA": ("fma",),
    "GGML_F16C": ("f16c",),
    "GGML_BMI2": ("bmi2",),
    "GGML_AVX_VNNI": ("avx_vnni",),
    # ggml's AVX512 option compiles with -mavx512f -mavx512cd -mavx512vl -mavx512dq -mavx512bw
    "GGML_AVX512": ("avx512f", "avx512cd", "avx512vl", "avx512dq", "avx512bw"),
    "GGML_AVX512_VBMI": ("avx512vbmi",),
    "GGML_AVX512_VNNI": ("avx512_vnni",),
    "GGML_AVX512_BF16": ("avx512_bf16",),
}
# Always off, whatever the CPU has: on Xeons with AMX every forward pass through ggml's AMX
# kernels segfaults in ggml_backend_amx_mul_mat (seen with llama-cpp-python 0.3.36; docs/troubleshooting.md).
X86_ALWAYS_OFF = ("GGML_AMX_TILE", "GGML_AMX_INT8", "GGML_AMX_BF16")
AMX_FLAGS = ("amx_tile", "amx_int8", "amx_bf16")

X86_FEATURES = frozenset(flag for flags in X86_OPTIONS.values() for flag in flags) | frozenset(AMX_FLAGS)
# arm64 features that change which kernels ggml compiles (NEON dot product, int8 matmul, SVE, SME...).
ARM_FEATURES = frozenset({"asimd", "asimdhp", "asimddp", "i8mm", "bf16", "sve", "sve2", "sme", "fphp"})

# macOS names (sysctl machdep.cpu.* on Intel, hw.optional.arm.FEAT_* on Apple silicon) -> Linux names.
MACOS_X86_NAMES = {
    "SSE4.2": "sse4_2",
    "AVX1.0": "avx",
    "AVX2": "avx2",
    "FMA": "fma",
    "F16C": "f16c",
    "BMI2": "bmi2",
    "AVX512F": "avx512f",
    "AVX512CD": "avx512cd",
    "AVX512VL": "avx512vl",
    "AVX512DQ": "avx512dq",
    "AVX512BW": "avx512bw",
    "AVX512VBMI": "avx512vbmi",
    "AVX512VNNI": "avx512_vnni",
    "AVX512BF16": "avx512_bf16",
}
MACOS_ARM_NAMES = {
    "hw.optional.neon": "asimd",
    "hw.optional.arm.FEAT_FP16": "asimdhp",
    "hw.optional.arm.FEAT_DotProd": "asimddp",
    "hw.optional.arm.FEAT_I8MM": "i8mm",
    "hw.optional.arm.FEAT_BF16": "bf16",
    "hw.optional.arm.FEAT_SME": "sme",
}


@dataclass(frozen=True)
class Cpu:
    arch: str  # "x86_64" or "arm64"
    system: str  # platform.system(): "Linux", "Darwin"
    model: str
    features: frozenset[str]  # only the features that change what llama.cpp compiles

    def describe(self) -> dict[str, object]:
        return {"arch": self.arch, "system": self.system, "model": self.model, "features": sorted(self.features)}


def normalise_arch(machine: str) -> str:
    machine = machine.lower()
    if machine in ("amd64", "x86_64", "x64"):
        return "x86_64"
    if machine in ("arm64", "aarch64", "armv8", "armv8l"):
        return "arm64"
    return machine


def parse_proc_cpuinfo(text: str, arch: str) -> tuple[str, frozenset[str]]:
    """The first processor's model and features, from Linux's /proc/cpuinfo."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if fields:
                break  # the first processor is enough: all cores of a machine share one ISA
            continue
        key, _, value = line.partition(":")
        fields.setdefault(key.strip().lower(), value.strip())
    words = set((fields.get("flags") or fields.get("features") or "").split())
    known = X86_FEATURES if arch == "x86_64" else ARM_FEATURES
    model = fields.get("model name") or _arm_model(fields)
    return model, frozenset(words & known)


def _arm_model(fields: dict[str, str]) -> str:
    parts = [f"{key} {fields[key]}" for key in ("cpu implementer", "cpu part") if key in fields]
    return ", ".join(parts) or "unknown"


def parse_sysctl(text: str, arch: str) -> tuple[str, frozenset[str]]:
    """The model and features from macOS's `sysctl -a` style lines ("name: value")."""
    values = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            values[key.strip()] = value.strip()
    model = values.get("machdep.cpu.brand_string", "unknown")
    if arch == "x86_64":
        words = (values.get("machdep.cpu.features", "") + " " + values.get("machdep.cpu.leaf7_features", "")).split()
        return model, frozenset(MACOS_X86_NAMES[word] for word in words if word in MACOS_X86_NAMES)
    return model, frozenset(name for key, name in MACOS_ARM_NAMES.items() if values.get(key) == "1")


def cmake_args(cpu: Cpu) -> list[str]:
    """The CPU flags for llama.cpp's CMake build on this CPU (a user's CMAKE_ARGS go after, and win)."""
    if cpu.arch != "x86_64":
        return ["-DGGML_NATIVE=ON"]  # ggml probes the arm64 (and other) features itself
    args = ["-DGGML_NATIVE=OFF"]
    for option, needs in X86_OPTIONS.items():
        args.append(f"-D{option}={'ON' if set(needs) <= cpu.features else 'OFF'}")
    args += [f"-D{option}=OFF" for option in X86_ALWAYS_OFF]
    return args


def wheel_key(version: str, args: str, cpu: Cpu) -> str:
    """Names the wheel folder: a wheel is reused only for the same version, flags and CPU features."""
    text = "|".join([version, " ".join(args.split()), cpu.arch, cpu.system, ",".join(sorted(cpu.features))])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def missing_features(built_for: dict[str, object], host: Cpu) -> list[str]:
    """Features a build recorded (see describe) that this CPU lacks; a different architecture lacks all."""
    recorded = built_for.get("features", [])
    features = [str(name) for name in recorded] if isinstance(recorded, list) else []
    if built_for.get("arch") != host.arch:
        return [f"arch {built_for.get('arch')}", *features]
    return sorted(set(features) - host.features)


def detect() -> Cpu:
    """This machine's CPU; ONEPASS_CPUINFO=FILE reads a recorded /proc/cpuinfo instead (a build for an older CPU)."""
    system, arch = platform.system(), normalise_arch(platform.machine())
    model, features = "unknown", frozenset[str]()
    recorded = os.environ.get("ONEPASS_CPUINFO")
    if recorded:
        model, features = parse_proc_cpuinfo(Path(recorded).read_text(errors="replace"), arch)
    elif system == "Linux" and Path("/proc/cpuinfo").is_file():
        model, features = parse_proc_cpuinfo(Path("/proc/cpuinfo").read_text(errors="replace"), arch)
    elif system == "Darwin":
        names = ["machdep.cpu.brand_string", "machdep.cpu.features", "machdep.cpu.leaf7_features"]
        names += list(MACOS_ARM_NAMES)
        # sysctl prints "name: value" per name and skips names this Mac does not have
        out = subprocess.run(["sysctl", *names], capture_output=True, text=True, check=False).stdout
        model, features = parse_sysctl(out, arch)
    return Cpu(arch=arch, system=system, model=re.sub(r"\s+", " ", model), features=features)


def thread_counts(sysfs: Path = Path("/sys/devices/system/cpu")) -> tuple[int, int]:
    """(distinct cores, all CPUs) this process may run on.

    Hyperthreads share their core's SIMD units, and Apple's efficiency cores lag behind the
    performance cores at every step a decode synchronises on: llama.cpp's own default is one
    thread per physical (performance) core. On macOS "cores" are the performance cores."""
    if platform.system() == "Darwin":
        # sysctl prints the names a Mac has: Apple silicon all three, an Intel Mac the last two
        names = ["hw.perflevel0.physicalcpu", "hw.physicalcpu", "hw.logicalcpu"]
        out = subprocess.run(["sysctl", "-n", *names], capture_output=True, text=True, check=False).stdout.split()
        numbers = [int(n) for n in out if n.isdigit()]
        logical = numbers[-1] if numbers else os.cpu_count() or 1
        return (numbers[0] if len(numbers) >= 2 else logical), logical
    allowed = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if not allowed:
        return (os.cpu_count() or 1,) * 2
    cores = set()
    for cpu in allowed:
        try:  # the CPUs sharing this one's core: itself and its hyperthread siblings
            cores.add((sysfs / f"cpu{cpu}" / "topology" / "thread_siblings_list").read_text().strip())
        except OSError:
            cores.add(str(cpu))
    return len(cores), len(allowed)


def main(argv: list[str]) -> int:
    cpu = detect()
    if argv[:1] == ["cmake-args"]:
        print(" ".join(cmake_args(cpu)))
    elif argv[:1] == ["key"] and len(argv) == 3:
        print(wheel_key(argv[1], argv[2], cpu))
    elif argv[:1] == ["describe"] and len(argv) in (1, 3, 4):
        built = {"llama_cpp_python": argv[1], "cmake_args": argv[2]} if len(argv) >= 3 else {}
        if len(argv) == 4:
            built["gpu"] = argv[3]
        print(json.dumps(cpu.describe() | built))
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
