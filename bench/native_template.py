"""Whether llama.cpp's own template engine renders a decision model's prompts as onepass does.

    python -m bench.native_template [--model PATH] [--source DIR]

llama.cpp's server renders a decision model's `systemone` template with its own Jinja engine
(common/jinja); onepass renders it with jinja2. Any difference (whitespace, the JSON text of a
value, a filter) would prompt the model otherwise than the server it was published for. This
builds bench/native_render.cpp against the llama.cpp source of the llama-cpp-python release
onepass runs, gives both engines the values onepass passes for every question of tests/eval's
items (each variant), and counts the prompts whose text differs. --source: a llama.cpp source
tree to use instead of the release's (downloaded once from the package index, kept in the cache folder).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import llama_cpp

from app.answering.decision import DecisionPrompter
from app.engine.engine import Engine
from app.paths import REPO_ROOT, cache_home
from app.serving.loading import prompter_for
from app.wire.contract import SystemOneRequest
from bench.eval import load_items
from bench.output import Progress
from tools import engine_source

HARNESS = Path(__file__).resolve().parent / "native_render.cpp"
# What the renderer needs of the source: the template engine, its JSON wrapper and their headers.
SOURCE_PARTS = ("common/", "vendor/nlohmann/", "ggml/include/", "include/")
COMPILED = ["common/jinja/lexer.cpp", "common/jinja/parser.cpp", "common/jinja/runtime.cpp"]
COMPILED += ["common/jinja/value.cpp", "common/jinja/string.cpp", "common/jinja/caps.cpp"]
COMPILED += ["common/json.cpp", "common/unicode.cpp"]


def release_version() -> str:
    return importlib.metadata.version("llama-cpp-python")


def release_source(version: str) -> Path:
    """The llama.cpp tree the installed engine was built from (tools/engine_source.py assembles it into
    the cache folder once: make setup does)."""
    folder = cache_home() / "engine-source" / version
    if not (folder / "ONEPASS-ENGINE").is_file():
        engine_source.assemble(folder)
    return folder / "vendor" / "llama.cpp"


def compiler() -> str | None:
    for name in (os.environ.get("CXX", ""), "c++", "g++", "clang++"):
        if name and shutil.which(name):
            return name
    return None


def build_renderer(source: Path) -> Path:
    """bench/native_render.cpp compiled against `source`, linked to the installed wheel's ggml,
    kept in the cache folder under a name of the harness, the source and the wheel's folder."""
    cxx = compiler()
    if cxx is None:
        raise RuntimeError("no C++ compiler (c++, g++ or clang++; or set CXX)")
    lib = Path(llama_cpp.__file__).resolve().parent / "lib"
    # the binary finds the wheel's ggml by its path: one build per source and installed wheel
    key = hashlib.blake2b(HARNESS.read_bytes() + f"{source.resolve()}\0{lib}".encode(), digest_size=8).hexdigest()
    binary = cache_home() / "native-render" / f"native_render-{key}"
    if binary.is_file():
        return binary
    binary.parent.mkdir(parents=True, exist_ok=True)
    partial = binary.with_name(f"{binary.name}.{os.getpid()}.partial")
    includes = [f"-I{source / part}" for part in ("common", "vendor", "ggml/include", "include")]
    command = [cxx, "-std=c++17", "-O1", *includes, "-o", str(partial), str(HARNESS)]
    command += [str(source / name) for name in COMPILED]
    command += [f"-L{lib}", "-lggml-base", f"-Wl,-rpath,{lib}"]
    subprocess.run(command, check=True, timeout=900)
    partial.replace(binary)
    return binary


def native_render(binary: Path, template: str, inputs: Sequence[dict[str, Any]]) -> list[dict[str, str]]:
    """Each input rendered by llama.cpp's engine: {"text": ...} or {"error": ...}."""
    with tempfile.NamedTemporaryFile("w", suffix=".jinja", encoding="utf-8") as file:
        file.write(template)
        file.flush()
        lines = "".join(json.dumps(values, ensure_ascii=False) + "\n" for values in inputs)
        done = subprocess.run(
            [str(binary), file.name], input=lines, capture_output=True, text=True, check=True, timeout=300
        )
    # "\n" only: a state may hold U+2028 or U+0085, which splitlines() would also split at
    rendered = [json.loads(line) for line in done.stdout.split("\n") if line]
    if len(rendered) != len(inputs):
        raise RuntimeError(f"the renderer answered {len(rendered)} of {len(inputs)} inputs: {done.stderr[-500:]}")
    return rendered


@dataclass(frozen=True)
class Difference:
    where: str  # the request and question
    ours: str
    theirs: str  # llama.cpp's text, or its error


def template_inputs(
    prompter: DecisionPrompter, requests: Iterable[SystemOneRequest]
) -> Iterator[tuple[str, dict[str, Any]]]:
    """(where, values) for every variant of every question, as onepass renders them."""
    for n, request in enumerate(requests):
        for qid, question in request.questions.items():
            for v, shown in enumerate(prompter.variants_shown(question)):
                values = prompter.template_values(question, request.questions, request.state, qid, shown)
                yield f"request {n}, {qid}, variant {v}", values


def compare(
    prompter: DecisionPrompter, binary: Path, requests: Iterable[SystemOneRequest]
) -> tuple[int, list[Difference]]:
    """(how many prompts were rendered, the ones whose text differs between the two engines)."""
    inputs = list(template_inputs(prompter, requests))
    theirs = native_render(binary, prompter.format.template, [values for _, values in inputs])
    differences = []
    for (where, values), native in zip(inputs, theirs, strict=True):
        ours = prompter.render_values(values)
        if native.get("text") != ours:
            differences.append(Difference(where, ours, native.get("text", f"error: {native.get('error')}")))
    return len(inputs), differences


def open_prompter(model: Path) -> tuple[Engine, DecisionPrompter]:
    """The model's decision prompter as the server builds it, over its engine (close the engine when done)."""
    engine = Engine(model, n_ctx=512)
    prompter = prompter_for(engine)
    if not isinstance(prompter, DecisionPrompter):
        engine.close()
        raise ValueError(f"{model} is not a decision model (no <arch>.decision.type)")
    return engine, prompter


def eval_requests() -> list[SystemOneRequest]:
    """Every tests/eval item as a request of its one question, keyed by the item's id."""
    return [
        SystemOneRequest.model_validate(
            {"model": "m", "state": item["state"], "questions": {item["id"]: item["question"]}}
        )
        for item in load_items()
    ]


def main() -> None:
    default = REPO_ROOT / "models" / "qwen2.5-coder-1.5b-instruct-q4_k_m-decision.gguf"
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=default, help="a decision GGUF (default: make model-decision's)")
    parser.add_argument("--source", type=Path, help="a llama.cpp source tree (default: the release's)")
    args = parser.parse_args()
    version = release_version()
    source = args.source or release_source(version)
    progress = Progress(3, "native template check")
    binary = build_renderer(source)
    progress.step("renderer built")
    engine, prompter = open_prompter(args.model)
    progress.step(f"{args.model.name} loaded ({prompter.decision_type})")
    requests = eval_requests()
    try:
        rendered, differences = compare(prompter, binary, requests)
    finally:
        engine.close()
    progress.step(f"{rendered} prompts rendered")
    print(
        f"llama.cpp {'at ' + str(source) if args.source else 'of llama-cpp-python ' + version}: {rendered} prompts "
        f"of {len(requests)} tests/eval items, {len(differences)} rendered differently"
    )
    for difference in differences[:5]:
        print(f"\n{difference.where}\n--- onepass\n{difference.ours!r}\n--- llama.cpp\n{difference.theirs!r}")
    sys.exit(1 if differences else 0)


if __name__ == "__main__":
    main()
