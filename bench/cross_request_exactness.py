"""Whether a request's label logits stay bit-identical when its question suffixes share one `llama_decode`
with other requests' suffixes (issue 59's exactness measurement), and what that sharing is worth.

Today a request is decoded alone: its snapshot restored into sequence 0 of a pooled context, copied to
sequences 1..N, its N suffixes in one decode (app/engine/engine.py `Engine.decode_suffixes`). A scheduler
that batches across requests would restore each request's snapshot into a sequence of its own
(`llama_state_seq_set_data` into that sequence, as llama-server's prompt cache does), copy it to further
sequences, and put every request's suffix rows in one batch. Here both are run on the same snapshots, with
the real default model and onepass's own prompts, for 2, 4 and 8 requests side by side (states of different
lengths, 1 and 5 questions), with the requests restored (where their cells lie) and batched (where their
rows lie) in different orders; flash attention on and off, repacked weights on and off, a unified KV cache
(today's) and split streams (each sequence its own). Each batched readout is compared with the same
request decoded alone with the same settings, and with today's path (unified cache, alone). Where every
placement of k requests is bit-identical, one combined decode of the k requests (restores included) is
timed against k separate ones.

python -m bench.cross_request_exactness [--model PATH] [--quick] [--runs N] [--threads N]
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import json
import os
import random
import statistics
import struct
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from app.answering.prompting import OwnPrompter
from app.answering.service import distinct_suffixes
from app.engine.bindings import EngineError, llama
from app.engine.engine import Engine, SuffixTokens
from app.engine.kv_settings import KvSettings
from app.engine.snapshot import Prefix, Snapshot
from app.engine.suffix_tree import MAX_SEQUENCES, Row, suffix_rows
from app.serving.known_models import default_model_path
from app.serving.loading import prompter_for
from app.wire.contract import SystemOneRequest
from bench.client import sized_text
from bench.output import RESULTS, Progress, git_sha, machine, table, write_atomically
from bench.workloads import QUESTIONS, SENTENCES

# Eight requests, each a state of its own length and 1 or 5 questions; k requests side by side are the first k.
FULL_STATES = [100, 1500, 260, 720, 150, 1040, 420, 560]
QUICK_STATES = [30, 200, 50, 120, 40, 90, 60, 150]
QUESTIONS_EACH = [1, 5, 1, 1, 5, 1, 1, 1]
# Where each request's cells lie (the order their snapshots are restored in) and where its rows lie in
# the batch: in the order given, reversed, or shuffled by a fixed seed. Eight requests get every kind.
Placements = dict[int, list[tuple[str, str]]]  # per number of requests side by side: (restored, batched)
PLACEMENTS: Placements = {
    2: [("in order", "in order"), ("reversed", "reversed")],
    4: [("in order", "in order"), ("reversed", "in order")],
    8: [("in order", "in order"), ("in order", "reversed"), ("shuffled", "shuffled")],
}
# --quick: one placement each, every one moving some request's cells and rows from where they lie alone
QUICK_PLACEMENTS: Placements = {
    2: [("reversed", "reversed")],
    4: [("reversed", "in order")],
    8: [("shuffled", "shuffled")],
}


STATE_HEADER = 8  # llama.cpp's sequence state begins with its magic number and the sequence id


@dataclass(frozen=True)
class Request:
    """One request's prefix snapshot and its question suffixes, as the server would decode them."""

    name: str
    snapshot: Snapshot
    suffixes: list[SuffixTokens]


@dataclass(frozen=True)
class Placed:
    """A request in a multi-sequence context: its prefix's sequence and one sequence per suffix."""

    request: Request
    prefix_seq: int
    question_seqs: list[int]


Readouts = list[list[float]]  # per suffix, its label logits


class SeqContext:
    """One llama.cpp context whose sequences hold several requests' prefixes and question suffixes.

    app/engine/context.py `Context` has the same parts for one request (sequence 0 and its copies); a
    scheduler that batches across requests needs this one there, with `n_seq_max` chosen per context (split
    streams size each sequence's room by it)."""

    def __init__(self, engine: Engine, kv: KvSettings, n_seq_max: int, threads: int, n_rows: int) -> None:
        params = llama.llama_context_default_params()
        kv.apply(params)
        params.n_batch = max(n_rows, kv.n_ubatch)
        params.n_seq_max = n_seq_max
        params.n_threads = params.n_threads_batch = threads
        params.no_perf = True
        self.ctx = llama.llama_init_from_model(engine.model, params)
        if not self.ctx:
            raise EngineError(f"llama.cpp could not create a context ({kv.describe()}, n_seq_max={n_seq_max})")
        self.memory = llama.llama_get_memory(self.ctx)
        self.n_vocab = engine.vocab.n_vocab
        self.batch = llama.llama_batch_init(params.n_batch, 0, n_seq_max)
        self.n_batch = params.n_batch
        self.n_stream = 1 if kv.kv_unified else n_seq_max
        self.pad: Snapshot | None = None  # a snapshot of filler tokens whose cells pad an aligned layout

    def clear(self) -> None:
        llama.llama_memory_clear(self.memory, False)

    def restore(self, snapshot: Snapshot, seq: int) -> None:
        blob = in_streams(snapshot.data, self.n_stream)
        read = llama.llama_state_seq_set_data(
            self.ctx, ctypes.cast(ctypes.c_char_p(blob), ctypes.POINTER(ctypes.c_uint8)), len(blob), seq
        )
        if read != len(blob):
            raise EngineError(f"llama.cpp restored {read} of {len(blob)} snapshot bytes into sequence {seq}")

    def pad_cells(self, n_cells: int, seq: int) -> None:
        """Fill the next `n_cells` cells with a pad sequence: the pad snapshot restored, its tail removed
        (llama.cpp's next restore then starts at the first cell freed)."""
        if n_cells:
            if self.pad is None or self.pad.n_tokens < n_cells:
                raise ValueError(f"no pad snapshot of {n_cells} cells")
            self.restore(self.pad, seq)
            llama.llama_memory_seq_rm(self.memory, seq, n_cells, -1)

    def place(self, placed: Placed) -> None:
        """Restore the request's prefix into its sequence and copy it to each question's sequence."""
        self.restore(placed.request.snapshot, placed.prefix_seq)
        for seq in placed.question_seqs:
            llama.llama_memory_seq_cp(self.memory, placed.prefix_seq, seq, -1, -1)

    def decode(self, rows: Sequence[Row]) -> None:
        if len(rows) > self.n_batch:
            raise ValueError(f"{len(rows)} rows exceed the batch of {self.n_batch}")
        batch = self.batch
        for i, (token, pos, seqs, wants_logits) in enumerate(rows):
            batch.token[i] = token
            batch.pos[i] = pos
            batch.n_seq_id[i] = len(seqs)
            for k, seq in enumerate(seqs):
                batch.seq_id[i][k] = seq
            batch.logits[i] = wants_logits
        batch.n_tokens = len(rows)
        status = llama.llama_decode(self.ctx, batch)
        if status != 0:
            raise EngineError(f"llama_decode failed with status {status}")

    def label_logits(self, row: int, labels: Sequence[int]) -> list[float]:
        pointer = llama.llama_get_logits_ith(self.ctx, row)
        if not pointer:
            raise EngineError(f"llama.cpp returned no logits for batch row {row}")
        logits = np.ctypeslib.as_array(pointer, shape=(self.n_vocab,))
        return [float(logits[t]) for t in labels]

    def close(self) -> None:
        llama.llama_batch_free(self.batch)
        llama.llama_free(self.ctx)


def in_streams(blob: bytes, n_stream: int) -> bytes:
    """A sequence's state saved from a one-stream cache as a cache of `n_stream` streams would have saved it.

    llama.cpp writes a sequence's state as a magic number and the sequence id, the stream count, then per
    stream its cell count and cells; it restores the one stream that has cells into the target sequence's
    stream, and refuses a state of another stream count. The cells' bytes are the same: only the count
    and the empty streams' zero cell counts change."""
    (saved,) = struct.unpack_from("<I", blob, STATE_HEADER)
    if saved != 1:
        raise ValueError(f"a state of {saved} streams; this rewrites states of one")
    if n_stream == 1:
        return blob
    return blob[:STATE_HEADER] + struct.pack("<I", n_stream) + blob[STATE_HEADER + 4 :] + bytes(4 * (n_stream - 1))


def request_rows(placed: Placed, share: bool) -> tuple[list[Row], list[int]]:
    """The request's suffix rows in its own sequences, and the row (within them) each suffix is read at."""
    suffixes = placed.request.suffixes
    rows, paths = suffix_rows([s.tokens for s in suffixes], placed.request.snapshot.next_pos, share=share)
    seq_of = dict(enumerate(placed.question_seqs, start=1))
    return [(token, pos, tuple(seq_of[s] for s in seqs), out) for token, pos, seqs, out in rows], [
        path[-1] for path in paths
    ]


@dataclass(frozen=True)
class Layout:
    """How requests lie in a context: a unified cache or split streams; whether suffixes share their
    leading tokens' rows; `align`: 0 leaves the cells where llama.cpp puts them, else every prefix and every
    request's first suffix row starts at a cell that is a multiple of it (pad cells and pad rows fill up)."""

    unified: bool
    share: bool
    align: int = 0

    def describe(self) -> str:
        if not self.unified:
            return "split"
        return f"unified, aligned to {self.align}" if self.align else "unified"


LAYOUTS = 3  # per flash attention and repacked weights setting: unified, unified aligned, split
PAD_TOKEN = 0  # any token: pad rows and pad cells are in sequences of their own, which nothing reads
PAD_SEQ = 128  # pad cells' sequences from here on (past every request's), pad rows' in the last one
PAD_ROWS_SEQ = MAX_SEQUENCES - 1


def decode_side_by_side(
    ctx: SeqContext, restored: Sequence[Placed], batched: Sequence[Placed], layout: Layout
) -> list[Readouts]:
    """Clear, restore the requests in the order `restored`, decode every suffix of them in one llama_decode
    with rows in the order `batched`; each request's readouts, in the order `batched`.

    Aligned: after each prefix, pad cells up to the next multiple of `align` (a pad snapshot restored into
    a sequence of its own and cut to length), and after each request's rows, pad rows in a sequence of
    their own up to the next multiple. llama.cpp fills a cleared cache from its first cell on, so each
    request's prefix and suffix rows then start on such a multiple wherever it stands."""
    ctx.clear()
    for i, placed in enumerate(restored):
        ctx.place(placed)
        if layout.align:
            ctx.pad_cells(-placed.request.snapshot.n_tokens % layout.align, PAD_SEQ + i)
    rows: list[Row] = []
    reads: list[list[int]] = []
    pad_pos = 0
    for placed in batched:
        own, read_at = request_rows(placed, layout.share)
        reads.append([len(rows) + r for r in read_at])
        rows.extend(own)
        if layout.align:
            n_pad = -len(own) % layout.align
            rows.extend((PAD_TOKEN, pad_pos + i, (PAD_ROWS_SEQ,), False) for i in range(n_pad))
            pad_pos += n_pad
    ctx.decode(rows)
    return [
        [ctx.label_logits(row, s.labels) for row, s in zip(at, placed.request.suffixes, strict=True)]
        for at, placed in zip(reads, batched, strict=True)
    ]


def assign(requests: Sequence[Request], unified: bool) -> list[Placed]:
    """Sequence ids for requests in the order given. Unified: today's layout per request (prefix, then its
    questions). Split streams: llama.cpp splits such a batch by sequence and takes consecutive ids only
    into one micro-batch, so the questions come first, in the batch's order, and the prefixes after."""
    placed = []
    if unified:
        seq = 0
        for request in requests:
            n = len(request.suffixes)
            placed.append(Placed(request, seq, list(range(seq + 1, seq + 1 + n))))
            seq += n + 1
        return placed
    n_questions = sum(len(r.suffixes) for r in requests)
    seq = 0
    for i, request in enumerate(requests):
        n = len(request.suffixes)
        placed.append(Placed(request, n_questions + i, list(range(seq, seq + n))))
        seq += n
    return placed


def ordered(items: Sequence[Request], how: str, seed: int) -> list[Request]:
    if how == "reversed":
        return list(reversed(items))
    if how == "shuffled":
        shuffled = list(items)
        random.Random(seed).shuffle(shuffled)
        return shuffled
    return list(items)


def compare(alone: Readouts, batched: Readouts) -> dict[str, Any]:
    """Label logits and label probabilities (softmax over the labels) of one request, two ways."""
    logit_diff, prob_diff, differ, values = 0.0, 0.0, 0, 0
    for a, b in zip(alone, batched, strict=True):
        xa, xb = np.array(a, dtype=np.float64), np.array(b, dtype=np.float64)
        pa, pb = np.exp(xa - xa.max()), np.exp(xb - xb.max())
        pa, pb = pa / pa.sum(), pb / pb.sum()
        logit_diff = max(logit_diff, float(np.abs(xa - xb).max()))
        prob_diff = max(prob_diff, float(np.abs(pa - pb).max()))
        differ += int(np.count_nonzero(np.array(a, dtype=np.float32) != np.array(b, dtype=np.float32)))
        values += len(a)
    return {"logit_diff": logit_diff, "prob_diff": prob_diff, "differ": differ, "values": values}


def merge(found: Sequence[dict[str, Any]]) -> dict[str, Any]:
    return {
        "identical": all(f["differ"] == 0 for f in found),
        "logit_diff": max(f["logit_diff"] for f in found),
        "prob_diff": max(f["prob_diff"] for f in found),
        "differ": sum(f["differ"] for f in found),
        "values": sum(f["values"] for f in found),
    }


def make_requests(engine: Engine, states: Sequence[int], progress: Progress) -> list[Request]:
    """The requests' prefixes prefilled as the server would (onepass's own prompt), their questions rendered."""
    prompter = prompter_for(engine)
    assert isinstance(prompter, OwnPrompter)  # the default model: onepass's own prompt
    requests = []
    for i, (n_tokens, n_questions) in enumerate(zip(states, QUESTIONS_EACH, strict=False)):
        state = sized_text(engine, SENTENCES, n_tokens, f"r{i}", start=i)
        asked = [QUESTIONS[(i + j) % len(QUESTIONS)] for j in range(n_questions)]
        body = SystemOneRequest.model_validate(
            {"model": "m", "state": state, "questions": {f"q{j}": q for j, q in enumerate(asked)}}
        )
        suffixes = distinct_suffixes(prompter.question(q) for q in body.questions.values())
        snapshot, _ = engine.prefill(Prefix((*prompter.head_tokens, *prompter.state_tokens(state))))
        requests.append(Request(f"r{i}: {snapshot.n_tokens} tokens, {n_questions} q", snapshot, suffixes))
        progress.step(f"prefilled {snapshot.n_tokens} tokens")
    return requests


def kv_context(engine: Engine, kv: KvSettings, requests: Sequence[Request], threads: int, align: int) -> SeqContext:
    """A context with room for every request side by side: unified, today's n_seq_max and the cells of all
    (and their pads); split, one stream per sequence, each with room for the longest prefix and its suffix."""
    n_rows = sum(sum(len(s.tokens) for s in r.suffixes) + align for r in requests)
    if kv.kv_unified:
        cells = sum(r.snapshot.n_tokens + align for r in requests) + n_rows
        return SeqContext(engine, _with(kv, n_ctx=_round_up(cells)), MAX_SEQUENCES, threads, n_rows)
    n_seq = sum(len(r.suffixes) + 1 for r in requests)
    room = _round_up(max(r.snapshot.n_tokens + max(len(s.tokens) for s in r.suffixes) for r in requests))
    return SeqContext(engine, _with(kv, n_ctx=room * n_seq), n_seq, threads, n_rows)


def align_for(flash_attn: bool) -> int:
    """The cell multiple each request starts on in an aligned layout. ggml's CPU kernels sum a dot product
    over the cells in SIMD lanes by the cell's index (eight floats with AVX2, sixteen with AVX-512, groups of
    32 in its own f16 dot product); flash attention's tiled kernel takes the cells in tiles of 64."""
    return 64 if flash_attn else 32


def _with(kv: KvSettings, n_ctx: int) -> KvSettings:
    return KvSettings(n_ctx, kv.n_ubatch, kv.flash_attn, kv.kv_type, kv.kv_unified, kv.repack)


def _round_up(cells: int, step: int = 256) -> int:
    return -(-cells // step) * step


def alone(ctx: SeqContext, request: Request, layout: Layout) -> Readouts:
    placed = assign([request], layout.unified)
    return decode_side_by_side(ctx, placed, placed, layout)[0]


def measure_settings(
    engine: Engine,
    requests: list[Request],
    kv: KvSettings,
    layout: Layout,
    pad: Snapshot,
    threads: int,
    runs: int,
    progress: Progress,
    today: dict[str, Readouts],
    placements: Placements,
) -> dict[str, Any]:
    """Every placement of k requests side by side against each decoded alone, with these settings."""
    ctx = kv_context(engine, kv, requests, threads, layout.align)
    ctx.pad = pad
    try:
        reference = {r.name: alone(ctx, r, layout) for r in requests}
        progress.step("alone")
        cases: list[dict[str, Any]] = []
        for k in sorted(placements):
            chosen = requests[:k]
            for case, (restore_how, batch_how) in enumerate(placements[k]):
                restored_order = ordered(chosen, restore_how, seed=k * 10 + case)
                batch_order = ordered(chosen, batch_how, seed=k * 10 + case + 1)
                seqs = {p.request.name: p for p in assign(batch_order, layout.unified)}
                readouts = decode_side_by_side(
                    ctx, [seqs[r.name] for r in restored_order], [seqs[r.name] for r in batch_order], layout
                )
                got = dict(zip([r.name for r in batch_order], readouts, strict=True))
                n_rows = [len(request_rows(seqs[r.name], layout.share)[0]) for r in chosen]
                cases.append(
                    {
                        "requests": k,
                        "restored": restore_how,
                        "batched": batch_how,
                        "rows": sum(_round_up(n, layout.align) if layout.align else n for n in n_rows),
                        "vs_alone": merge([compare(reference[name], got[name]) for name in got]),
                        "vs_today": merge([compare(today[name], got[name]) for name in got]),
                    }
                )
                progress.step(f"{layout.describe()}: {k} side by side")
        timings = []
        for k in sorted(placements):
            if all(c["vs_alone"]["identical"] for c in cases if c["requests"] == k):
                timings.append(time_side_by_side(ctx, requests[:k], layout, runs))
            progress.step(f"{layout.describe()}: timed {k}")
        return {
            "settings": kv.describe(),
            "flash_attn": kv.flash_attn,
            "repack": kv.repack,
            "kv_unified": layout.unified,
            "layout": layout.describe(),
            "align": layout.align,
            "shared_suffix_tokens": layout.share,
            "alone_vs_today": merge([compare(today[r.name], reference[r.name]) for r in requests]),
            "cases": cases,
            "timings": timings,
        }
    finally:
        ctx.close()


def time_side_by_side(ctx: SeqContext, requests: Sequence[Request], layout: Layout, runs: int) -> dict[str, Any]:
    """One combined decode of the requests' suffixes against one decode each, restores included, interleaved."""
    placed = assign(requests, layout.unified)
    together: list[float] = []
    apart: list[float] = []
    for _ in range(runs):
        began = time.perf_counter()
        decode_side_by_side(ctx, placed, placed, layout)
        together.append((time.perf_counter() - began) * 1000)
        began = time.perf_counter()
        for request in requests:
            alone(ctx, request, layout)
        apart.append((time.perf_counter() - began) * 1000)
    ms_together, ms_apart = statistics.median(together), statistics.median(apart)
    return {
        "requests": len(requests),
        "suffixes": sum(len(r.suffixes) for r in requests),
        "ms_together": round(ms_together, 1),
        "ms_apart": round(ms_apart, 1),
        "speedup": round(ms_apart / ms_together, 2),
        "samples_together": [round(x, 1) for x in together],
        "samples_apart": [round(x, 1) for x in apart],
    }


def run(
    model: Path,
    states: Sequence[int],
    threads: int,
    runs: int,
    placements: Placements,
    done: Callable[[list[dict[str, Any]]], None],
    flash_attn_settings: Sequence[bool] = (False, True),
    repack_settings: Sequence[bool] = (False, True),
    align: int | None = None,
) -> None:
    """Every setting, flash attention off first; `done` is given the results so far after each one."""
    cases = sum(len(p) for p in placements.values())
    n_settings = LAYOUTS * len(flash_attn_settings) * len(repack_settings)
    steps = len(states) * len(flash_attn_settings) + n_settings * (1 + cases + len(placements))
    progress = Progress(steps, "cross-request exactness")
    results: list[dict[str, Any]] = []
    for flash_attn in flash_attn_settings:
        # Flash attention shapes the KV bytes (and how V is laid out): its snapshots are its own. Repacked
        # weights decode the snapshots plain weights prefilled: what is compared is the decode, alone and
        # side by side, and both read the same bytes.
        requests: list[Request] = []
        for repack in repack_settings:
            n_ctx = _round_up(max(states) + 512)
            engine = Engine(model, n_ctx=n_ctx, threads=threads, repack=repack, flash_attn=flash_attn)
            try:
                if not requests:
                    requests = make_requests(engine, states, progress)
                    pad, _ = engine.prefill(Prefix((PAD_TOKEN,) * ((align or align_for(flash_attn)) - 1)))
                # today's path itself, for the harness: SeqContext alone on a unified cache must read the same
                today = {
                    r.name: [o.label_logits for o in engine.decode_suffixes(r.snapshot, r.suffixes).readouts]
                    for r in requests
                }
                share = engine.shares_suffix_tokens
                # llama.cpp splits a batch over split streams by sequence, which it cannot do for a row in
                # several sequences: there every suffix is decoded whole (as onepass does for recurrent models).
                layouts = [
                    Layout(True, share),
                    Layout(True, share, align or align_for(flash_attn)),
                    Layout(False, False),
                ]
                for layout in layouts:
                    kv = KvSettings(engine.n_ctx, flash_attn=flash_attn, kv_unified=layout.unified, repack=repack)
                    results.append(
                        measure_settings(engine, requests, kv, layout, pad, threads, runs, progress, today, placements)
                    )
                    done(results)
            finally:
                engine.close()


def cpu_name() -> str:
    found = subprocess.run(["grep", "-m1", "model name", "/proc/cpuinfo"], capture_output=True, text=True).stdout
    return found.split(":", 1)[-1].strip() or "unknown"


def on_off(value: bool) -> str:
    return "on" if value else "off"


def markdown(report: dict[str, Any]) -> str:
    lines = [
        f"# Requests decoded side by side in one llama_decode: {report['model']} ({report['date']}, {report['git']})",
        "",
        f"CPU: {report['cpu']} ({report['machine']}), {report['threads']} threads, load average at the start "
        f"{report['load_average']}. Settings measured: {report['settings_measured']} of "
        f"{report['settings_total']}. States of "
        f"{', '.join(map(str, report['states']))} tokens (onepass's own prompt adds its head), with "
        f"{', '.join(map(str, QUESTIONS_EACH))} questions; k side by side are the "
        "first k. Each request's label logits batched beside the others are compared with the same request "
        "decoded alone with the same settings (and with today's path: unified cache, alone). `differ`: label "
        "logits not bit-identical, of all compared. Probabilities: softmax over a question's labels. `unified, "
        "aligned to N`: each prefix and each request's first suffix row start on a multiple of N cells (pad "
        "cells and pad rows in sequences of their own), alone and side by side alike; `rows` counts the pad "
        "rows. Split: every suffix decoded whole (llama.cpp splits such a batch by sequence).",
        "",
        "## Exactness",
        "",
    ]
    rows = []
    for r in report["results"]:
        for c in r["cases"]:
            v, t = c["vs_alone"], c["vs_today"]
            rows.append(
                [
                    on_off(r["flash_attn"]),
                    on_off(r["repack"]),
                    r["layout"],
                    c["requests"],
                    c["rows"],
                    c["restored"],
                    c["batched"],
                    "yes" if v["identical"] else "**no**",
                    f"{v['logit_diff']:.3g}",
                    f"{v['prob_diff']:.3g}",
                    f"{v['differ']}/{v['values']}",
                    "yes" if t["identical"] else "no",
                    f"{t['prob_diff']:.3g}",
                ]
            )
    lines += table(
        [
            "flash attn",
            "repack",
            "KV",
            "requests",
            "rows",
            "restored",
            "batched",
            "bit-identical",
            "max logit diff",
            "max prob diff",
            "differ",
            "= today's",
            "prob diff vs today's",
        ],
        rows,
    )
    lines += ["", "## Decoded alone: these settings against today's path (unified cache)", ""]
    lines += table(
        ["flash attn", "repack", "KV", "suffix tokens shared", "bit-identical", "max logit diff", "max prob diff"],
        [
            [
                on_off(r["flash_attn"]),
                on_off(r["repack"]),
                r["layout"],
                "yes" if r["shared_suffix_tokens"] else "no",
                "yes" if r["alone_vs_today"]["identical"] else "no",
                f"{r['alone_vs_today']['logit_diff']:.3g}",
                f"{r['alone_vs_today']['prob_diff']:.3g}",
            ]
            for r in report["results"]
        ],
    )
    timed = [(r, t) for r in report["results"] for t in r["timings"]]
    lines += ["", f"## One decode of k requests against k decodes (restores included, median of {report['runs']})", ""]
    if timed:
        lines += table(
            ["flash attn", "repack", "KV", "requests", "questions", "together ms", "apart ms", "speed-up"],
            [
                [
                    on_off(r["flash_attn"]),
                    on_off(r["repack"]),
                    r["layout"],
                    t["requests"],
                    t["suffixes"],
                    f"{t['ms_together']:,.0f}",
                    f"{t['ms_apart']:,.0f}",
                    f"{t['speedup']:.2f}x",
                ]
                for r, t in timed
            ],
        )
    else:
        lines.append("None: no setting kept every placement bit-identical.")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=default_model_path())
    parser.add_argument("--quick", action="store_true", help="states of 100 to 600 tokens, one timing run")
    parser.add_argument("--states", help="the eight states' lengths in tokens, comma-separated (overrides --quick's)")
    parser.add_argument("--runs", type=int, help="timing repeats (default 3, --quick 1)")
    parser.add_argument("--flash-attn", nargs="+", choices=["off", "on"], default=["off", "on"])
    parser.add_argument("--repack", nargs="+", choices=["off", "on"], default=["off", "on"])
    parser.add_argument(
        "--align", type=int, help="the aligned layout's cell multiple (default 32, 64 with flash attention)"
    )
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    states = [int(n) for n in args.states.split(",")] if args.states else QUICK_STATES if args.quick else FULL_STATES
    runs = args.runs or (1 if args.quick else 3)
    load = os.getloadavg()
    report: dict[str, Any] = {
        "model": args.model.name,
        "date": datetime.date.today().isoformat(),
        "git": git_sha(),
        "cpu": cpu_name(),
        "machine": machine(),
        "threads": args.threads,
        "load_average": " ".join(f"{x:.1f}" for x in load),
        "quick": args.quick,
        "states": states,
        "questions_each": QUESTIONS_EACH,
        "runs": runs,
        "settings_measured": 0,
        "settings_total": LAYOUTS * len(args.flash_attn) * len(args.repack),
        "align": args.align or "32, 64 with flash attention",
        "results": [],
    }
    subset = "".join(
        [
            "" if len(args.flash_attn) == 2 else f"-fa-{args.flash_attn[0]}",
            "" if len(args.repack) == 2 else f"-repack-{args.repack[0]}",
            f"-align{args.align}" if args.align else "",
            "-quick" if args.quick else "",
        ]
    )
    stem = f"{report['date']}-{report['git']}-cross-request-exactness{subset}"

    def write(results: list[dict[str, Any]]) -> None:
        """The report so far: a run stopped part way still leaves what it measured."""
        report["results"], report["settings_measured"] = results, len(results)
        write_atomically(args.out / f"{stem}.json", json.dumps(report, indent=2) + "\n")
        write_atomically(args.out / f"{stem}.md", markdown(report))

    run(
        args.model,
        states,
        args.threads,
        runs,
        QUICK_PLACEMENTS if args.quick else PLACEMENTS,
        write,
        [value == "on" for value in args.flash_attn],
        [value == "on" for value in args.repack],
        args.align,
    )
    print(markdown(report))


if __name__ == "__main__":
    main()
