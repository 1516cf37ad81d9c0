"""The llama.cpp engine: a model loaded, prefill to a snapshot, batched suffix decode, whole prompts.

It uses llama.cpp's low-level API (app/engine/bindings.py): the high-level `Llama` class saves
whole-context state with a large scores array, which is far too slow here. Beside it: the model's
vocabulary (vocab.py), its pool of contexts (pool.py, context.py), a prefix's prefill in pieces (prefill.py) and the
suffix tree (suffix_tree.py).

A request borrows one pooled context, restores its prefix snapshot into sequence 0, copies
sequence 0 to one sequence per question (with a unified KV cache the copies share the prefix
cells), and decodes every question suffix in one `llama_decode`, reading logits only at each
suffix's last token; tokens that several suffixes begin with are decoded once, in all of their
sequences. A model without memory reads each prompt whole instead (`encode`).

A model loaded with a vision projector (vision.py) takes images in a prefix: an image fills cells
marked IMAGE_CELL, which its span in the snapshot describes; a prefill decodes the text between the
images itself and each image through the projector, so that a prefix with images is snapshotted,
kept and restored like any other. Positions follow the snapshot's next_pos, not its cell count: an
M-RoPE image advances fewer positions than it fills cells.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
from numpy.typing import NDArray

from app.engine import bindings, whole_prompt
from app.engine.bindings import EngineError, llama
from app.engine.caller import Lane, current
from app.engine.context import Context, Memory, probe_memory
from app.engine.fingerprint import model_digest
from app.engine.kv_settings import KvSettings
from app.engine.pool import ContextPool
from app.engine.prefill import Partial, Prefill
from app.engine.shared_decode import SharedDecodes, SharedJob
from app.engine.snapshot import Prefix, Snapshot, spans_fit
from app.engine.suffix_tree import plan_groups, suffix_rows
from app.engine.vision import Vision
from app.engine.vocab import Vocabulary

log = logging.getLogger("onepass.engine")


class PromptTooLong(ValueError):
    """A prompt longer than a model without memory takes in one piece (llama.cpp would abort)."""

    def __init__(self, n_tokens: int, limit: int) -> None:
        super().__init__(f"the prompt has {n_tokens} tokens; this model reads at most {limit} in one piece")
        self.n_tokens, self.limit = n_tokens, limit


@dataclass(frozen=True)
class Readout:
    """What one question's decision position says about its labels."""

    label_logits: list[float]
    label_mass: float  # probability the full next-token distribution puts on the labels
    # The model's last hidden vector there (what its output layer reads), when the decode asked for it.
    hidden: NDArray[np.float32] | None = field(default=None, compare=False)
    # The model's output vectors at the suffix's marks (a decision head's projection), in their order.
    marked: tuple[NDArray[np.float32], ...] = field(default=(), compare=False)


@dataclass(frozen=True)
class SuffixTokens:
    """Tokens to decode after the prefix, the label tokens to read after the last one, and `marks`:
    positions in `tokens` whose output vectors to read (a decision head reads several places)."""

    tokens: Sequence[int]
    labels: Sequence[int]
    marks: Sequence[int] = ()


@dataclass
class Timing:
    restore_ms: float = 0.0
    prefill_ms: float = 0.0
    decode_ms: float = 0.0


@dataclass
class SuffixReadouts:
    """One readout per suffix decoded after a prefix, in their order, and what the decode took."""

    readouts: list[Readout]
    n_decodes: int
    timing: Timing = field(default_factory=Timing)
    beside: int = 0  # other requests whose questions were decoded in the same llama_decode


@dataclass(frozen=True)
class PromptVectors:
    """A whole prompt's output vectors at the rows asked for, and how long the model took."""

    vectors: list[NDArray[np.float32]]
    decode_ms: float


class Engine:
    def __init__(
        self,
        model_path: Path,
        *,
        n_ctx: int,
        n_gpu_layers: int = 0,
        threads: int = 0,
        contexts: int = 1,
        repack: bool = False,
        flash_attn: bool = False,
        probe_layer: int | Literal["middle"] | None = None,
        mmproj: Path | None = None,
        batch_requests: bool = False,
        answer_during_prefill: bool = False,
    ) -> None:
        """`mmproj`: a vision projector GGUF for the model; with it the model takes images.
        `batch_requests`: decode the questions of requests that wait at once in one llama_decode
        (shared_decode.py). `answer_during_prefill`: one more context, where a request is answered with
        some of the threads while a prefill goes on with the rest (pool.py)."""
        if not model_path.is_file():
            raise EngineError(f"model file not found: {model_path}")
        bindings.init()
        bindings.check_bindings()
        started = time.perf_counter()
        params = llama.llama_model_default_params()
        params.n_gpu_layers = n_gpu_layers
        # ggml's repacked CPU weights (interleaved for SIMD) are faster on some CPUs and slower on
        # others (docs/performance.md): app/platform/tuning.py measures which, per CPU and build.
        params.use_extra_bufts = repack
        self.model = llama.llama_model_load_from_file(str(model_path).encode(), params)
        if not self.model:
            raise EngineError(f"llama.cpp could not load {model_path} (not a GGUF it supports?)")
        self.path = model_path
        self.vocab = Vocabulary(self.model)
        self.n_embd = llama.llama_model_n_embd_out(self.model)  # the width of a hidden vector it outputs
        self.n_ctx = n_ctx
        self.n_layer = llama.llama_model_n_layer(self.model)
        # The layer whose output, averaged over a prefill's rows, becomes the snapshot's state_mean. Not
        # the last: llama.cpp computes the last layer for output rows only. The middle one read best in
        # docs/calibration.md's measurements.
        layer = (self.n_layer - 1) // 2 if probe_layer == "middle" else probe_layer
        if layer is not None and not 0 <= layer < self.n_layer - 1:
            raise EngineError(
                f"probe layer {probe_layer}: this model's layers are 0 to {self.n_layer - 1}, the last excluded"
            )
        self.probe_layer = layer
        # every byte, the projector's too: the disk tier trusts snapshots by it
        self.fingerprint = model_digest(model_path, mmproj)
        kv = KvSettings(n_ctx, repack=repack, flash_attn=flash_attn)
        self.n_ubatch = kv.n_ubatch
        # besides the tokens, what shapes a snapshot's bytes: in every cache key (reading a layer splits
        # the graph's computation there, which a GPU backend may round differently)
        self.kv_settings = kv.describe() + ("" if layer is None else f";probe_layer={layer}")
        # What else shapes them across processes (the disk tier): the kernels built in and where
        # the layers run. The thread count does not (measured: bit-identical KV with 1, 2 and 3).
        self.build = (
            f"llama-cpp-python {bindings.version()}; ggml backends {'+'.join(bindings.shipped_backends())}; "
            f"n_gpu_layers={n_gpu_layers}; {bindings.system_info()}"
        )
        # A recurrent memory keeps one state per sequence, which a token in several cannot update:
        # there every suffix is decoded whole in its own sequence.
        self.shares_suffix_tokens = not (
            llama.llama_model_is_recurrent(self.model) or llama.llama_model_is_hybrid(self.model)
        )
        threads = threads or os.cpu_count() or 1
        self.vision: Vision | None = None
        if mmproj is not None:
            self.vision = Vision(self.model, mmproj, use_gpu=n_gpu_layers != 0, threads=threads, max_batch=kv.n_ubatch)
        # A model without memory (laya, lfm2-d1-omni, clef) reads each prompt whole: nothing to snapshot.
        self.memory = probe_memory(self.model, kv, threads)
        self.memoryless = self.memory is Memory.NONE
        # A prefill's piece is given up mid-way for a request only where that leaves the cells as they were:
        # a memory that drops a tail, on the CPU (ggml's CPU backend alone asks whether to give up). Elsewhere
        # a request waits for the piece under way, and the pieces stay llama.cpp's own micro-batches.
        offloaded = n_gpu_layers != 0 and bindings.gpu_offload_supported()
        can_give_up = self.memory is Memory.DROPS_TAIL and not offloaded
        tap = None if self.memoryless else layer

        def make_context(threads: int) -> Context:
            return Context(self.model, kv, threads, encoder=self.memoryless, tap=tap, can_give_up=can_give_up)

        self._pool = ContextPool(
            make_context, threads, can_give_up=can_give_up, side=not self.memoryless, max_rows=kv.n_ubatch
        )
        self.open_contexts(contexts)
        self.side_context = answer_during_prefill and self._pool.open_side()  # none for a model without memory
        # Only where every request keeps its own rows: a recurrent memory and a model without
        # memory decode each request as they always do.
        shares = batch_requests and self.shares_suffix_tokens and not self.memoryless
        self._shared = SharedDecodes(self._pool) if shares else None
        if self.vision is not None:
            log.info(
                "vision projector %s: images on %s positions, %s attention among an image's tokens",
                mmproj,
                "M-RoPE grid" if self.vision.mrope else "consecutive",
                "non-causal" if self.vision.non_causal else "causal",
            )
        log.info(
            "loaded %s in %.2fs (%d contexts of %d tokens; repacked weights %s, flash attention %s)",
            model_path.name,
            time.perf_counter() - started,
            contexts,
            n_ctx,
            "on" if repack else "off",
            "on" if flash_attn else "off",
        )

    def open_contexts(self, count: int) -> None:
        """Add `count` contexts to the pool (the constructor opens its `contexts`; make check-gpu opens them
        as a step of its own)."""
        self._pool.open(count)

    @property
    def kv_bytes_per_token(self) -> int:
        """f16 K and V bytes one token occupies across all layers (what a snapshot should cost)."""
        arch = self.vocab.metadata("general.architecture") or ""
        n_head = llama.llama_model_n_head(self.model)
        head_k = int(
            self.vocab.metadata(f"{arch}.attention.key_length") or llama.llama_model_n_embd(self.model) // n_head
        )
        head_v = int(self.vocab.metadata(f"{arch}.attention.value_length") or head_k)
        return int(
            llama.llama_model_n_layer(self.model) * llama.llama_model_n_head_kv(self.model) * (head_k + head_v) * 2
        )

    def shared_decodes(self) -> tuple[int, int]:
        """With batch_requests: the question decodes led so far, and the requests answered in them."""
        return (self._shared.decodes, self._shared.requests) if self._shared is not None else (0, 0)

    def busy_seconds(self) -> dict[Lane, float]:
        """The seconds its contexts have been lent so far, per lane of work."""
        return self._pool.busy_seconds()

    def waits(self) -> dict[Lane, tuple[int, float]]:
        """Per lane of work: the steps waiting for a context now, and the seconds steps have waited so far."""
        return self._pool.waits()

    def decoded(self) -> tuple[int, int]:
        """The llama_decodes of text rows run so far, and their rows."""
        return self._pool.decoded()

    def close(self) -> None:
        """Free the contexts and the model; later calls raise EngineError instead of crashing."""
        self._pool.close()  # waits for requests in flight to hand their context back
        if self.vision is not None:
            self.vision.close()
        if self.model:
            llama.llama_model_free(self.model)
            self.model = None

    def prefill(
        self, prefix: Prefix, base: Snapshot | None = None, *, resume: Partial | None = None
    ) -> tuple[Snapshot, Timing]:
        """Snapshot of sequence 0 after `prefix` (its tokens, the images among their cells and each
        image's file), starting from `base` when it holds a prefix of them.
        In pieces, its context handed to a waiting request between two, and Stopped between two (with
        what it had done) once nobody waits for it; `resume`: such a stopped prefill's work, to go on
        from where it is one of these tokens from this base (prefill.py)."""
        tokens, spans = prefix.tokens, prefix.spans
        if not spans_fit(tokens, spans):
            raise ValueError("the image spans do not lie over the image cells of the tokens")
        if base is not None and not base.holds(Prefix(tokens[: base.n_tokens], spans[: len(base.spans)])):
            raise ValueError("base snapshot is not a prefix of the tokens to prefill")
        prefilled = Prefill(self._pool, self.vision, self.n_ubatch, prefix)
        snapshot = prefilled.run(base, resume)
        return snapshot, Timing(prefill_ms=prefilled.prefill_ms, restore_ms=prefilled.restore_ms)

    def decode_suffixes(
        self, prefix: Snapshot, suffixes: Sequence[SuffixTokens], *, hidden: bool = False, beside_others: bool = False
    ) -> SuffixReadouts:
        """Restore `prefix`, decode every suffix after it, read each suffix's label logits (and with
        `hidden`, its last hidden vector).

        All suffixes go into one llama_decode when they fit; otherwise into the fewest decodes
        that respect the sequence limit and the context's free cells. With `beside_others` (a request's
        answer, not a measurement that is kept, such as a prior or a fit's evidence) and the setting
        batch_requests, that decode may hold other waiting requests' suffixes too (shared_decode.py).
        """
        groups = plan_groups(self.n_ctx - prefix.n_tokens, [len(suffix.tokens) for suffix in suffixes])
        plain = not hidden and len(groups) == 1 and not any(suffix.marks for suffix in suffixes)
        if self._shared is None or not beside_others or not plain:
            with self._pool.borrow(prefix) as ctx:
                return self._decode_alone(ctx, prefix, suffixes, groups, hidden)
        rows, paths = suffix_rows([suffix.tokens for suffix in suffixes], prefix.next_pos, share=True)
        caller = current()
        job = self._shared.decode(
            SharedJob(
                prefix,
                rows,
                paths,
                caller.lane,
                caller.stop,
                read=lambda ctx, at: SuffixReadouts(
                    [self._read(ctx, path, suffix, False) for path, suffix in zip(at, suffixes, strict=True)], 1
                ),
                alone=lambda ctx: self._decode_alone(ctx, prefix, suffixes, groups, False),
            )
        )
        found = job.result
        assert found is not None  # decoded: else decode raised
        if job.beside:
            found.timing, found.beside = Timing(restore_ms=job.restore_ms, decode_ms=job.decode_ms), job.beside
        return found

    def _decode_alone(
        self,
        ctx: Context,
        prefix: Snapshot,
        suffixes: Sequence[SuffixTokens],
        groups: list[list[int]],
        hidden: bool,
    ) -> SuffixReadouts:
        """The suffixes after `prefix` held in sequence 0 of `ctx`, in the decodes `groups` plans."""
        readouts: list[Readout] = []
        timing = Timing()
        began = time.perf_counter()
        ctx.hold(prefix)
        timing.restore_ms = _ms_since(began)
        began = time.perf_counter()
        for group in groups:
            current().check("a decode of questions")
            readouts.extend(self._decode_group(ctx, prefix.next_pos, [suffixes[i] for i in group], hidden))
        timing.decode_ms = _ms_since(began)
        return SuffixReadouts(readouts, len(groups), timing)

    def _decode_group(
        self, ctx: Context, next_pos: int, suffixes: Sequence[SuffixTokens], hidden: bool
    ) -> list[Readout]:
        """Decode `suffixes` from the prefix's next position, each in a sequence of its own."""
        for seq in range(1, len(suffixes) + 1):
            llama.llama_memory_seq_cp(ctx.memory, 0, seq, -1, -1)  # unified KV: shares the cells, copies nothing
        entries, paths = suffix_rows([suffix.tokens for suffix in suffixes], next_pos, share=self.shares_suffix_tokens)
        vectors = hidden or any(suffix.marks for suffix in suffixes)
        if vectors:
            # llama.cpp gives output vectors only for a batch whose every row is an output (it would
            # otherwise mark them all itself, and say so in the log on every decode).
            entries = [(token, pos, seqs, True) for token, pos, seqs, _ in entries]
        llama.llama_set_embeddings(ctx.ctx, vectors)
        try:
            ctx.fill(entries)
            ctx.decode()
            readouts = [self._read(ctx, path, suffix, hidden) for path, suffix in zip(paths, suffixes, strict=True)]
        finally:
            llama.llama_set_embeddings(ctx.ctx, False)
        for seq in range(1, len(suffixes) + 1):
            llama.llama_memory_seq_rm(ctx.memory, seq, -1, -1)
        return readouts

    def _read(self, ctx: Context, rows: Sequence[int], suffix: SuffixTokens, hidden: bool) -> Readout:
        """A suffix's readout; `rows`: the batch row of each of its tokens."""
        batch_index = rows[-1]
        pointer = llama.llama_get_logits_ith(ctx.ctx, batch_index)
        if not pointer:
            raise EngineError(f"llama.cpp returned no logits for batch position {batch_index}")
        logits = np.ctypeslib.as_array(pointer, shape=(self.vocab.n_vocab,))
        top = float(logits.max())
        log_total = top + math.log(float(np.exp(logits - top).sum(dtype=np.float64)))
        label_logits = [float(logits[t]) for t in suffix.labels]
        mass = math.fsum(math.exp(x - log_total) for x in label_logits)  # fsum: the label order cannot matter
        state = self._vector(ctx, batch_index) if hidden else None
        marked = tuple(self._vector(ctx, rows[mark]) for mark in suffix.marks)
        return Readout(label_logits, min(1.0, mass), state, marked)

    def _vector(self, ctx: Context, batch_index: int) -> NDArray[np.float32]:
        """The output vector of a batch row (the hidden vector, or a decision head's projection of it)."""
        found = llama.llama_get_embeddings_ith(ctx.ctx, batch_index)
        if not found:  # a model that pools its output vectors (an embedding model) has none per token
            raise EngineError(f"llama.cpp returned no output vector for batch position {batch_index}")
        vector = np.ctypeslib.as_array(found, shape=(self.n_embd,)).copy()
        vector.flags.writeable = False
        return vector

    def encode(self, whole: Prefix, rows: Sequence[int], order: Sequence[int] = ()) -> PromptVectors:
        """A whole prompt through a model without memory, and its output vectors at `rows`. `whole`: its
        cells, images and files, as a prefix's (nothing follows it); the images' embeddings go in the
        same batch as the text (app/engine/whole_prompt.py). `order`: each token's decision order, for
        a joint decision head (clef), which then puts the score of option j in row j."""
        tokens, spans = whole.tokens, whole.spans
        if not self.memoryless:
            raise EngineError("encode is for models without memory; decode_suffixes answers the others")
        if not 0 < len(tokens) <= self.n_ctx:
            raise PromptTooLong(len(tokens), self.n_ctx)
        if order and len(order) != len(tokens):
            raise ValueError(f"{len(order)} decision orders for {len(tokens)} tokens")
        if not spans_fit(tokens, spans):
            raise ValueError("the image spans do not lie over the image cells of the tokens")
        with self._pool.borrow(None) as ctx:
            prompt = ctx.prompt
            if prompt is None:
                raise EngineError("this context was not made for whole prompts")
            whole_prompt.fill(prompt, whole, order, self.vision)
            began = time.perf_counter()
            status = llama.llama_process(ctx.ctx, llama.LLAMA_PROCESS_TYPE_DECODE, prompt)
            if status != 0:
                raise EngineError(f"llama_process failed with status {status}")
            return PromptVectors([self._vector(ctx, row) for row in rows], _ms_since(began))


def _ms_since(began: float) -> float:
    return (time.perf_counter() - began) * 1000
