"""Unpack newer Vulkan headers for building llama.cpp's Vulkan backend on Debian 12.

Usage: python -m tools.vulkan_headers DEST   (make vulkan-deps runs it)

Debian 12's libvulkan-dev (headers 1.3.239) cannot compile ggml-vulkan.cpp: it uses
VK_EXT_layer_settings, newer than those headers. Debian 13's libvulkan-dev headers compile it
against Debian 12's loader and glslc. This downloads that one package from the Debian 13 suite of
the mirror this machine's apt already uses, with an apt configuration of its own (the system's
sources and package lists are left alone), and unpacks it into DEST without installing it; the
build then gets -DVulkan_INCLUDE_DIR=DEST/usr/include. Standard library only.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

SUITE = "trixie"
PACKAGE = f"libvulkan-dev/{SUITE}"
KEYRING = Path("/usr/share/keyrings/debian-archive-keyring.gpg")
HEADER = Path("usr/include/vulkan/vulkan_core.h")


def debian_mirror() -> str:
    """The URI of the Debian archive this machine's apt sources name (not the security archive)."""
    texts = [p.read_text() for p in Path("/etc/apt/sources.list.d").glob("*.sources")]
    for text in texts:
        for stanza in text.split("\n\n"):
            uris = re.search(r"^URIs:\s*(\S+)", stanza, re.M)
            suites = re.search(r"^Suites:\s*(.+)$", stanza, re.M)
            if uris and suites and "security" not in uris.group(1) and "/debian" in uris.group(1):
                return uris.group(1)
    classic = Path("/etc/apt/sources.list")
    if classic.is_file():
        for line in classic.read_text().splitlines():
            found = re.match(r"deb\s+(?:\[[^\]]*\]\s+)?(\S+/debian)\s", line)
            if found and "security" not in found.group(1):
                return found.group(1)
    raise SystemExit("no Debian archive in /etc/apt/sources.list(.d): cannot fetch the Vulkan headers")


def header_version(include: Path) -> tuple[int, int, int]:
    text = (include / "vulkan" / "vulkan_core.h").read_text(errors="replace")
    complete = re.search(r"VK_HEADER_VERSION_COMPLETE VK_MAKE_API_VERSION\(0, (\d+), (\d+), VK_HEADER_VERSION\)", text)
    patch = re.search(r"#define VK_HEADER_VERSION (\d+)", text)
    if complete is None or patch is None:
        raise SystemExit(f"{include}: no Vulkan header version found")
    return int(complete.group(1)), int(complete.group(2)), int(patch.group(1))


def fetch(dest: Path) -> None:
    if (dest / HEADER).is_file():
        print(f"{dest}: Vulkan headers {'.'.join(map(str, header_version(dest / 'usr/include')))} already unpacked")
        return
    for tool in ("apt-get", "dpkg"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} is missing: the Vulkan headers come from Debian's {PACKAGE}")
    with tempfile.TemporaryDirectory(prefix="onepass-vulkan-") as work:
        root = Path(work)
        (root / "lists" / "partial").mkdir(parents=True)
        (root / "cache" / "archives" / "partial").mkdir(parents=True)
        (root / "parts").mkdir()
        sources = root / "sources.list"
        sources.write_text(f"deb [signed-by={KEYRING}] {debian_mirror()} {SUITE} main\n")
        options = [
            f"-o=Dir::Etc::sourcelist={sources}",
            f"-o=Dir::Etc::sourceparts={root / 'parts'}",
            f"-o=Dir::State::Lists={root / 'lists'}",
            f"-o=Dir::Cache={root / 'cache'}",
            "-o=APT::Get::List-Cleanup=0",
        ]
        subprocess.run(["apt-get", *options, "-qq", "update"], check=True)
        subprocess.run(["apt-get", *options, "-qq", "download", PACKAGE], check=True, cwd=root)
        (deb,) = root.glob("libvulkan-dev_*.deb")
        partial = dest.with_name(dest.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        subprocess.run(["dpkg", "-x", str(deb), str(partial)], check=True)
        if not (partial / HEADER).is_file():
            raise SystemExit(f"{deb.name} holds no {HEADER}")
        shutil.rmtree(dest, ignore_errors=True)
        partial.rename(dest)
    print(f"{dest}: Vulkan headers {'.'.join(map(str, header_version(dest / 'usr/include')))} unpacked")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m tools.vulkan_headers", description=__doc__.splitlines()[0])
    parser.add_argument("dest", type=Path, help="the folder to unpack into (DEST/usr/include)")
    fetch(parser.parse_args().dest)
