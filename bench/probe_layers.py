"""Which hidden vectors a probe fit should read: the last layer's, a middle layer's, or the state's mean.

The probe (app/calibration/candidates.py) reads the last layer's hidden vector at a question's
decision row. Fitted in question-first with short readouts, it trails state-first's fitted accuracy
(docs/notes/2026-12-02-pipeline-readouts.md). This asks whether other vectors close the gap: a middle
layer's output at the same row, and the mean over the state's rows of a layer's output (in
question-first the state is read with the questions before it). llama.cpp hands out only the last
layer's vectors, so the run reads the others through its eval callback (`cb_eval`), which calls back
with each named tensor of the graph ("l_out-13": layer 13's output) as it is computed.

For each workload of bench/pipelines.py and each layout (state-first as served, question-first
with the named readouts of bench.readout_variants) it answers N examples of seed 0 and M of seed 1
once, keeping every vector, then fits each question on the first with `onepass calibrate`'s code
(`fit_question` in app/calibrate/runner.py) once per feature set, and scores the fits' answers on the second.
An experiment: the engine is patched for the run, and nothing here is served.

python -m bench.probe_layers [--workloads support,logs] [--layers 13,19,25] [--train N] [--test M]
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import dataclasses
import json
import statistics
from collections.abc import Iterator, Sequence
from datetime import date
from pathlib import Path
from typing import Any

import llama_cpp
import llama_cpp.llama_cpp as llama
import numpy as np
from llama_cpp._ctypes_extensions import load_shared_library
from numpy.typing import NDArray

from app.calibrate.runner import Parsed, fit_question, parse_examples
from app.calibration import Calibration, Evidence, question_key
from app.config import DEFAULT_MODEL_PATH, load_settings
from app.engine.llama import Answered, Engine, Job, Readout, Snapshot, Timing
from app.serving.loading import load_spec
from app.serving.specs import ModelSpec
from bench.output import RESULTS, Progress, git_sha, machine, table, write_atomically
from bench.pipelines import WORKLOADS
from bench.readout_variants import readouts

Vector = NDArray[np.float32]
Answers = list[dict[str, Evidence]]


class LayerTap:
    """The outputs of some layers over one decode's rows, read through llama.cpp's eval callback.

    The tensors are read with ggml's own accessors (name, size, a backend copy), so neither ggml's
    struct layout nor where the tensor lives matters."""

    def __init__(self, layers: Sequence[int]) -> None:
        ggml = load_shared_library("ggml-base", Path(llama.__file__).parent / "lib")
        ggml.ggml_get_name.restype = ctypes.c_char_p
        ggml.ggml_get_name.argtypes = [ctypes.c_void_p]
        ggml.ggml_nbytes.restype = ctypes.c_size_t
        ggml.ggml_nbytes.argtypes = [ctypes.c_void_p]
        ggml.ggml_nrows.restype = ctypes.c_int64
        ggml.ggml_nrows.argtypes = [ctypes.c_void_p]
        ggml.ggml_is_contiguous.restype = ctypes.c_bool
        ggml.ggml_is_contiguous.argtypes = [ctypes.c_void_p]
        ggml.ggml_backend_tensor_get.restype = None
        ggml.ggml_backend_tensor_get.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t]
        self._ggml = ggml
        self.wanted = {f"l_out-{layer}".encode(): layer for layer in layers}
        self.parts: dict[int, list[Vector]] = {}
        self.callback = llama.ggml_backend_sched_eval_callback(self._called)  # kept: C holds a pointer to it

    def _called(self, tensor: ctypes.c_void_p, ask: bool, _user_data: ctypes.c_void_p) -> bool:
        layer = self.wanted.get(self._ggml.ggml_get_name(tensor))
        if ask or layer is None:
            return layer is not None  # asked: whether to call back with this tensor's data
        rows, size = self._ggml.ggml_nrows(tensor), self._ggml.ggml_nbytes(tensor)
        if not self._ggml.ggml_is_contiguous(tensor) or size % (4 * rows):
            raise RuntimeError(f"layer {layer}'s output is not contiguous float32 rows")
        found = np.empty((rows, size // (4 * rows)), dtype=np.float32)
        self._ggml.ggml_backend_tensor_get(tensor, found.ctypes.data, 0, size)
        self.parts.setdefault(layer, []).append(found)  # one part per micro-batch, in the batch's order
        return True  # False would stop the computation

    def take(self, n_rows: int) -> dict[int, NDArray[np.float32]]:
        """Each layer's rows of the decode that just ran (and forget them)."""
        found = {layer: np.concatenate(parts) for layer, parts in self.parts.items()}
        self.parts = {}
        for layer, rows in found.items():
            if rows.shape[0] != n_rows:
                raise RuntimeError(f"layer {layer}: {rows.shape[0]} rows read for a decode of {n_rows}")
        return found


@contextlib.contextmanager
def tapped(layers: Sequence[int]) -> Iterator[None]:
    """While the block runs, every engine made in it hands the probe, as a readout's hidden vector,
    the blocks [last layer at the decision row, each of `layers` at that row, each of `layers`
    averaged over the rows the state's prefill decoded], in that order."""
    tap = LayerTap(layers)
    shipped = (
        llama_cpp.llama_context_default_params,
        Engine._decode,
        Engine.prefill,
        Engine.decode_suffixes,
        Engine._read,
    )
    last: dict[int, NDArray[np.float32]] = {}
    pooled: dict[tuple[int, ...], list[Vector]] = {}  # by the prefilled snapshot's tokens
    current: list[Vector] = []

    def default_params() -> llama.llama_context_params:
        params: llama.llama_context_params = shipped[0]()
        params.cb_eval = tap.callback
        return params

    def decode(self: Engine, ctx: Any) -> None:
        shipped[1](self, ctx)
        last.clear()
        last.update(tap.take(ctx.batch.n_tokens))

    def prefill(self: Engine, tokens: Sequence[int], base: Snapshot | None = None) -> tuple[Snapshot, Timing]:
        last.clear()
        snapshot, timing = shipped[2](self, tokens, base)
        if last:  # nothing decoded: the state was prefilled before, its mean kept then
            pooled[snapshot.tokens] = [last[layer].mean(axis=0) for layer in layers]
        return snapshot, timing

    def decode_suffixes(self: Engine, prefix: Snapshot, jobs: Sequence[Job], *, hidden: bool = False) -> Answered:
        current[:] = pooled[prefix.tokens] if hidden else []
        return shipped[3](self, prefix, jobs, hidden=hidden)

    def read(self: Engine, ctx: Any, rows: Sequence[int], job: Job, hidden: bool) -> Readout:
        found = shipped[4](self, ctx, rows, job, hidden)
        if found.hidden is None:
            return found
        blocks = [found.hidden, *(last[layer][rows[-1]] for layer in layers), *current]
        return dataclasses.replace(found, hidden=np.concatenate(blocks).astype(np.float32))

    llama_cpp.llama_context_default_params = default_params
    Engine._decode, Engine.prefill = decode, prefill  # type: ignore[method-assign]
    Engine.decode_suffixes, Engine._read = decode_suffixes, read  # type: ignore[method-assign]
    try:
        yield
    finally:
        llama_cpp.llama_context_default_params = shipped[0]
        Engine._decode, Engine.prefill = shipped[1], shipped[2]  # type: ignore[method-assign]
        Engine.decode_suffixes, Engine._read = shipped[3], shipped[4]  # type: ignore[method-assign]


def feature_sets(layers: Sequence[int]) -> dict[str, list[int]]:
    """Named feature sets, as indices of tapped()'s blocks."""
    found = {"last layer (as served)": [0]}
    found |= {f"layer {layer}": [1 + i] for i, layer in enumerate(layers)}
    found |= {f"state mean, layer {layer}": [1 + len(layers) + i] for i, layer in enumerate(layers)}
    found |= {f"last layer + state mean, layer {layer}": [0, 1 + len(layers) + i] for i, layer in enumerate(layers)}
    return found


def answer(
    model: Path, layout: str, layers: Sequence[int], sets: Sequence[list[Parsed]]
) -> tuple[list[Answers], Calibration]:
    """Every example's evidence with tapped()'s blocks, per set of examples."""
    flags = ["--model", str(model), "--layout", layout, "--n-ctx", "8192", "--session-cache-disk-bytes", "0"]
    variant = "named" if layout == "question-first" else "state-first"
    with readouts(variant), tapped(layers):
        service = load_spec(ModelSpec.from_settings(load_settings(flags, {})))
        try:
            progress = Progress(sum(len(s) for s in sets), f"answering ({layout})")
            found = []
            for examples in sets:
                answers = []
                for example in examples:
                    answers.append(service.evidence(example.request, hidden=True))
                    progress.step()
                found.append(answers)
            return found, service.calibration
        finally:
            service.close()


def narrowed(answers: Answers, blocks: Sequence[int], width: int) -> Answers:
    """The evidence with only `blocks` of each hidden vector."""

    def keep(vector: Vector | None) -> Vector | None:
        return None if vector is None else np.concatenate([vector[b * width : (b + 1) * width] for b in blocks])

    return [{qid: dataclasses.replace(e, hidden=keep(e.hidden)) for qid, e in found.items()} for found in answers]


def held_out_accuracy(
    train: list[Parsed], fitted_on: Answers, test: list[Parsed], tested: Answers, calibration: Calibration
) -> dict[str, float]:
    """Each question fitted as `onepass calibrate` fits it, and its fit's accuracy on the test set
    (contextual calibration where no fit is adopted)."""
    accuracy = {}
    for qid, question in train[0].request.questions.items():
        members = [(i, qid) for i in range(len(train))]
        _, record = fit_question(train, fitted_on, calibration, False, question_key(question), members)
        right = []
        for example, found in zip(test, tested, strict=True):
            e = found[qid]
            if record is not None:
                probabilities = record.fit.apply(e.labels, e.raw, e.prior, e.hidden)
            else:
                probabilities = list(np.log(np.maximum(e.raw, 1e-300)) - np.log(np.maximum(e.prior, 1e-300)))
            right.append(float(int(np.argmax(probabilities)) == example.answers[qid]))
        accuracy[qid] = round(statistics.fmean(right), 4)
    return accuracy


def measure(model: Path, workload: str, layers: Sequence[int], train: int, test: int) -> list[dict[str, Any]]:
    pipeline = next(w for w in WORKLOADS if w.name == workload)
    sets = [parse_examples(pipeline.examples(train, seed=0)), parse_examples(pipeline.examples(test, seed=1))]
    rows = []
    for layout in ("state-first", "question-first"):
        (fitted_on, tested), calibration = answer(model, layout, layers, sets)
        first = next(e.hidden for e in fitted_on[0].values() if e.hidden is not None)
        width = first.shape[0] // (1 + 2 * len(layers))
        for name, blocks in feature_sets(layers).items():
            accuracy = held_out_accuracy(
                sets[0], narrowed(fitted_on, blocks, width), sets[1], narrowed(tested, blocks, width), calibration
            )
            mean = round(statistics.fmean(accuracy.values()), 4)
            rows.append({"workload": workload, "layout": layout, "probe reads": name, **accuracy, "mean": mean})
            print(json.dumps(rows[-1]), flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL_PATH)
    parser.add_argument("--workloads", default="support", help=f"of {', '.join(w.name for w in WORKLOADS)}")
    parser.add_argument("--layers", default="13,19,25", help="0 is the first layer")
    parser.add_argument("--train", type=int, default=100)
    parser.add_argument("--test", type=int, default=100)
    args = parser.parse_args()
    layers = [int(layer) for layer in args.layers.split(",")]
    rows = [
        row
        for workload in args.workloads.split(",")
        for row in measure(args.model, workload, layers, args.train, args.test)
    ]
    lines = [
        f"Probe inputs, fitted on {args.train} examples of seed 0 and held out on {args.test} of seed 1 per workload; "
        f"commit {git_sha()}, {machine()}:",
        "",
    ]
    for workload in dict.fromkeys(r["workload"] for r in rows):
        mine = [r for r in rows if r["workload"] == workload]
        questions = [k for k in mine[0] if k not in ("workload", "layout", "probe reads", "mean")]
        by_set: dict[str, dict[str, dict[str, Any]]] = {}
        for r in mine:
            by_set.setdefault(r["probe reads"], {})[r["layout"]] = r
        headers = ["probe reads", *(f"state-first {q}" for q in questions), "state-first mean"]
        headers += [*(f"question-first {q}" for q in questions), "question-first mean", "gap"]
        body = []
        for name, found in by_set.items():
            sf, qf = found["state-first"], found["question-first"]
            gap = round(sf["mean"] - qf["mean"], 4)
            body.append([name, *(sf[q] for q in questions), sf["mean"], *(qf[q] for q in questions), qf["mean"], gap])
        lines += [f"{workload}:", "", *table(headers, body), ""]
    print("\n".join(lines))
    stem = RESULTS / f"{date.today().isoformat()}-{git_sha()}-probe-layers"
    write_atomically(
        stem.with_suffix(".json"), json.dumps({"rows": rows, "args": vars(args) | {"model": str(args.model)}}, indent=1)
    )
    write_atomically(stem.with_suffix(".md"), "\n".join(lines))


if __name__ == "__main__":
    main()
