"""The source of onepass's engine: llama-cpp-python's bindings on the llama.cpp that serves
/v1/systemone (the tree inside xllamacpp's sdist), as one folder pip builds a wheel from. The peer
llama-server (make peer, make native-server) is built from the same llama.cpp folder, so the bench
and the native comparison meet onepass on equal builds. Standard library only.

    python -m tools.engine_source --out DIR    # DIR: the patched llama-cpp-python source tree

What changes against llama-cpp-python's own release (docs/decision-models.md):
- vendor/llama.cpp is xllamacpp's thirdparty/llama.cpp;
- llama_context_params gains `moe_cache_size` (a size_t after type_v), as that llama.h declares it:
  without it ctypes would read every later field 8 bytes off (app/engine/bindings.py checks the layout);
- the version gets a local part naming the llama.cpp (VERSION), so the wheel cache, the build record
  and the disk tier's key all change with it, and the engine refuses any other build (no package
  index takes a local version: what pip resolves there never has it).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path

from app.engine.bindings import ENGINE_VERSION
from tools.build_peer import download_sdist

BINDINGS = "llama-cpp-python==0.3.36"
LLAMA_CPP = "xllamacpp==2026.10.11549"  # its thirdparty/llama.cpp is ggml-org/llama.cpp b11549
VERSION = ENGINE_VERSION  # "0.3.36+llama.b11549": the bindings' version, a local part naming the llama.cpp

# (file, text that must occur exactly once, what it becomes)
PATCHES = (
    ("llama_cpp/__init__.py", '__version__ = "0.3.36"', f'__version__ = "{VERSION}"'),
    (
        "llama_cpp/llama_cpp.py",
        '        ("type_v", ctypes.c_int),\n',
        '        ("type_v", ctypes.c_int),\n        ("moe_cache_size", ctypes.c_size_t),\n',
    ),
    ("llama_cpp/llama_cpp.py", "        type_v: int\n", "        type_v: int\n        moe_cache_size: int\n"),
)


def patch(tree: Path) -> None:
    for name, old, new in PATCHES:
        path = tree / name
        text = path.read_text(encoding="utf-8")
        if text.count(old) != 1:
            raise SystemExit(f"tools/engine_source.py: {name} does not hold {old.strip()!r} exactly once")
        path.write_text(text.replace(old, new), encoding="utf-8")


def unpack(requirement: str, work: Path) -> Path:
    """The sdist's top folder, unpacked under `work`."""
    sdist = download_sdist(requirement, work)
    with tarfile.open(sdist) as archive:
        archive.extractall(work / requirement, filter="data")
    (top,) = (work / requirement).iterdir()
    return top


def assemble(out: Path) -> None:
    """Write the patched tree to `out`, whole or not at all."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="onepass-engine-", dir=out.parent) as tmp:
        work = Path(tmp)
        bindings = unpack(BINDINGS, work)
        llama_cpp = unpack(LLAMA_CPP, work) / "thirdparty" / "llama.cpp"
        if not (llama_cpp / "tools" / "server" / "server-decision.cpp").is_file():
            raise SystemExit(f"tools/engine_source.py: {LLAMA_CPP} holds no llama.cpp with /v1/systemone")
        shutil.rmtree(bindings / "vendor" / "llama.cpp")
        shutil.move(str(llama_cpp), bindings / "vendor" / "llama.cpp")
        patch(bindings)
        (bindings / "ONEPASS-ENGINE").write_text(f"{BINDINGS} on the llama.cpp of {LLAMA_CPP}: {VERSION}\n")
        shutil.rmtree(out, ignore_errors=True)
        bindings.rename(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, help="the folder to write the source tree to")
    parser.add_argument("--print-version", action="store_true", help="print the engine's version and exit")
    args = parser.parse_args()
    if args.print_version:
        print(VERSION)
        return
    if args.out is None:
        parser.error("--out is required")
    print(f"assembling {VERSION}: {BINDINGS} on the llama.cpp of {LLAMA_CPP} (downloads, once)", file=sys.stderr)
    assemble(args.out)


if __name__ == "__main__":
    main()
