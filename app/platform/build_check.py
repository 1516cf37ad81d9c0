"""Does the installed llama.cpp run on this CPU? One tiny decode in a subprocess, and words if not.

A llama.cpp built for instructions this CPU lacks dies with SIGILL at its first matrix
product, taking the process with it. So the check runs in a child process: it writes the
tiny test model, prefills a few tokens and decodes one question. A child that dies is
reported with the CPU features the build was made for (recorded by the Makefile next to
the wheel), the ones this machine has, and the command that rebuilds.

A passing check is remembered per installed library and CPU, so a server start pays for it
once: `python -m app.platform.build_check` (make check-build) runs it, and the CLI runs it before serving.
Before it, the installed llama-cpp-python must be onepass's engine (app/engine/bindings.py): a
release from a package index is refused with the command that installs the engine.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import math
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from app.engine.bindings import installed_problem
from app.engine.engine import Engine, SuffixTokens
from app.engine.snapshot import Prefix
from app.paths import REPO_ROOT, cache_home
from app.platform.cpu import Cpu, detect, missing_features
from app.platform.tiny_gguf import write_tiny_gguf

REBUILD = "make clean-build && make run"
CHECK_TIMEOUT_S = 300.0  # a tiny decode takes well under a second; this only bounds a hung child


def build_record_path() -> Path:
    """Where `make setup` copies what the wheel was built for: the virtual environment's root."""
    return Path(sys.prefix) / "llama-build.json"


def read_build_record() -> dict[str, object] | None:
    try:
        record = json.loads(build_record_path().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def library_dir() -> Path | None:
    """llama_cpp's folder of shared libraries, found without importing it (importing may crash)."""
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / "lib"


def library_files() -> list[str]:
    """The installed llama.cpp libraries as name:size:mtime: what a cached result about the build depends on."""
    folder = library_dir()
    if folder is None or not folder.is_dir():
        return []
    files = sorted(p for p in folder.iterdir() if p.is_file())
    return [f"{p.name}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in files]


def _fingerprint(cpu: Cpu) -> str | None:
    libraries = library_files()
    if not libraries:
        return None
    parts = [*libraries, json.dumps(cpu.describe(), sort_keys=True)]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:24]


def _stamp(fingerprint: str) -> Path:
    return cache_home() / "build-ok" / fingerprint


def decode_once() -> None:
    """The child's work: load the tiny model, prefill, decode one question, read its labels."""
    with tempfile.TemporaryDirectory() as folder:
        engine = Engine(write_tiny_gguf(Path(folder) / "check.gguf"), n_ctx=256, threads=1)
        try:
            vocab = engine.vocab
            prefix, _ = engine.prefill(Prefix(tuple(vocab.tokenize("a build check", add_bos=True))))
            yes, no = vocab.tokenize("Yes"), vocab.tokenize("No")
            answered = engine.decode_suffixes(
                prefix, [SuffixTokens(tokens=vocab.tokenize(" Answer:"), labels=[yes[0], no[0]])]
            )
            if any(math.isnan(logit) for logit in answered.readouts[0].label_logits):
                raise SystemExit("llama.cpp decoded NaN logits")  # kernels that run but compute garbage
        finally:
            engine.close()


def explain(returncode: int, output: str, record: dict[str, object] | None, cpu: Cpu) -> str:
    """What a user reads when the child failed: the signal, the build's CPU, this CPU, the fix."""
    if returncode < 0:
        name = signal.Signals(-returncode).name
        what = f"llama.cpp crashed on a one-token decode ({name}{': illegal instruction' if name == 'SIGILL' else ''})"
    else:
        what = f"llama.cpp failed a one-token decode (exit {returncode})"
    host = f"{cpu.arch}: {' '.join(sorted(cpu.features)) or '(no features read)'}"
    lines = [f"onepass: {what}.", f"  this CPU ({cpu.model}) has {host}"]
    if record is None:
        lines.append(
            f"  the build recorded no CPU features ({build_record_path()} is missing: not built by make setup?)"
        )
    else:
        features = record.get("features")
        built = " ".join(str(f) for f in features) if isinstance(features, list) else "?"
        lines.append(f"  the build was made for {record.get('arch')}: {built} (CMAKE_ARGS {record.get('cmake_args')})")
        missing = missing_features(record, cpu)
        lines.append(f"  missing here: {' '.join(missing)}" if missing else "  no recorded feature is missing here")
    tail = output.strip().splitlines()[-5:]
    lines += [f"  | {line}" for line in tail]
    lines.append(f"Rebuild llama-cpp-python for this machine: {REBUILD}")
    return "\n".join(lines)


def run_check(child: list[str] | None = None, cpu: Cpu | None = None) -> str | None:
    """None when onepass's engine is installed and decodes on this CPU, else the explanation. The
    decode's result is cached per library and CPU."""
    problem = installed_problem()  # read from the package's metadata: nothing is loaded for it
    if problem is not None:
        return f"onepass: {problem}"
    cpu = cpu or detect()
    fingerprint = _fingerprint(cpu) if child is None else None
    if fingerprint is not None and _stamp(fingerprint).is_file():
        return None
    command = child or [sys.executable, "-m", "app.platform.build_check", "--child"]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=CHECK_TIMEOUT_S, cwd=REPO_ROOT)
    except subprocess.TimeoutExpired:
        return f"onepass: the llama.cpp build check did not finish in {CHECK_TIMEOUT_S:g} s. {REBUILD} rebuilds it."
    if done.returncode != 0:
        return explain(done.returncode, done.stdout + done.stderr, read_build_record(), cpu)
    if fingerprint is not None:
        _stamp(fingerprint).parent.mkdir(parents=True, exist_ok=True)
        _stamp(fingerprint).touch()
    return None


def main(argv: list[str]) -> int:
    if argv == ["--child"]:
        decode_once()
        return 0
    problem = run_check()
    if problem is not None:
        print(problem, file=sys.stderr)
        return 1
    print("llama.cpp build check: a tiny decode ran on this CPU")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
