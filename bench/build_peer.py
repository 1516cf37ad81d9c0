"""make peer: build llama.cpp's `llama-server` from the source inside the llama-cpp-python release
onepass uses, with the same CMake flags as its wheel, so the bench compares designs, not builds.

python -m bench.build_peer --version 0.3.36 --cmake-args "..." --out DIR   (DIR/llama-server)
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

# A server build with nothing fetched from the network: no web UI assets, no HTTPS.
SERVER_ARGS = [
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_BUILD_TOOLS=ON",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_OPENSSL=OFF",
]


def build(version: str, cmake_args: str, out: Path, jobs: int) -> Path:
    binary = out / "llama-server"
    with tempfile.TemporaryDirectory(prefix="onepass-peer-") as tmp:
        work = Path(tmp)
        pip = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:", "-d", str(work)]
        subprocess.run([*pip, f"llama-cpp-python=={version}"], check=True)
        (sdist,) = work.glob("llama_cpp_python-*.tar.gz")
        with tarfile.open(sdist) as archive:
            archive.extractall(work, filter="data")
        source = next(work.glob("llama_cpp_python-*/vendor/llama.cpp"))
        build_dir = work / "build"
        subprocess.run(
            ["cmake", "-S", str(source), "-B", str(build_dir), *SERVER_ARGS, *shlex.split(cmake_args)], check=True
        )
        subprocess.run(["cmake", "--build", str(build_dir), "--target", "llama-server", "-j", str(jobs)], check=True)
        out.mkdir(parents=True, exist_ok=True)
        partial = out / "llama-server.partial"
        partial.write_bytes((build_dir / "bin" / "llama-server").read_bytes())
        partial.chmod(0o755)
        partial.replace(binary)  # whole or absent: make rebuilds after an interrupted build
    return binary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--version", required=True)
    parser.add_argument("--cmake-args", required=True, help="onepass's wheel flags (the Makefile's BUILD_ARGS)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    print(build(args.version, args.cmake_args, args.out, args.jobs))


if __name__ == "__main__":
    main()
