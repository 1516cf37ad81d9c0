"""The llama.cpp engine: model, context pool, prefill, snapshot, restore, batched suffix decode.

The only module that imports llama_cpp. It uses the low-level API: the high-level `Llama`
class saves whole-context state with a large scores array, which is far too slow here.

A request borrows one pooled context, restores its prefix snapshot into sequence 0,
copies sequence 0 to one sequence per question (with a unified KV cache the copies share
the prefix cells), and decodes every question suffix in one `llama_decode`, reading logits
only at each suffix's last token; tokens that several suffixes begin with ("Question: Does
the ...") are decoded once, in all of their sequences. A context is handed back holding only
sequence 0, so a request for the snapshot it holds (or for the base that snapshot grew from)
skips the restore: the cells already hold the snapshot's exact bytes.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import llama_cpp as llama
import numpy as np
from numpy.typing import NDArray

from app.engine.fingerprint import file_digest
from app.engine.layer_tap import LayerTap
from app.engine.snapshot import Snapshot as Snapshot  # the engine takes and gives snapshots: its callers' type too

log = logging.getLogger("onepass.engine")
llama_log = logging.getLogger("onepass.llama")

MAX_SEQUENCES = 256  # llama.cpp's LLAMA_MAX_SEQ; sequence 0 holds the prefix
N_UBATCH = 512


Row = tuple[int, int, tuple[int, ...], bool]  # a batch row: token, position, sequences, wants logits


class EngineError(RuntimeError):
    """llama.cpp refused an operation (load, context, decode)."""


class RestoreError(EngineError):
    """A snapshot could not be restored; the context has been cleaned."""


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
    # The model's output vectors at the job's marks (a decision head's projection), in their order.
    marked: tuple[NDArray[np.float32], ...] = field(default=(), compare=False)


@dataclass(frozen=True)
class Job:
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
class Answered:
    readouts: list[Readout]
    n_decodes: int
    timing: Timing = field(default_factory=Timing)


@dataclass(frozen=True)
class Encoded:
    """A whole prompt's output vectors at the rows asked for, and how long the model took."""

    vectors: list[NDArray[np.float32]]
    decode_ms: float


_GGML_LEVELS = {3: logging.WARNING, 4: logging.ERROR}  # ggml_log_level: 1 debug, 2 info, 5 "cont"


def _route_llama_log(level: int, text: bytes, _user_data: ctypes.c_void_p) -> None:
    # llama.cpp logs a lot at load time: keep it at debug unless it warns or fails.
    message = text.decode("utf-8", "replace").rstrip()
    if message:
        llama_log.log(_GGML_LEVELS.get(level, logging.DEBUG), "%s", message)


_log_callback = llama.llama_log_callback(_route_llama_log)  # referenced for the process lifetime
llama.llama_log_set(_log_callback, ctypes.c_void_p(0))
llama.llama_backend_init()

# What llama.cpp's llama_context_default_params() sets in its trailing fields. Bindings that
# declare the struct otherwise than the library does (a field missing or extra before them) read
# other bytes there: answers would be computed with settings nobody chose, silently.
_DEFAULT_FLAGS = {
    "embeddings": False,
    "offload_kqv": True,
    "no_perf": True,
    "op_offload": True,
    "swa_full": True,
    "kv_unified": False,
}


def check_bindings() -> None:
    """Raise EngineError when llama-cpp-python's llama_context_params is not laid out as its
    libllama fills it in (a wheel built against another llama.cpp than its bindings)."""
    params = llama.llama_context_default_params()
    wrong = {name: getattr(params, name) for name, value in _DEFAULT_FLAGS.items() if getattr(params, name) != value}
    if wrong or params.n_outputs_max_per_seq != 1:
        raise EngineError(
            f"llama-cpp-python {llama.__version__} does not match its llama.cpp library ({Engine.library_dir()}): "
            f"llama_context_default_params() reads {wrong or {'n_outputs_max_per_seq': params.n_outputs_max_per_seq}}; "
            "build the wheel again (make clean-build; make setup)"
        )


@dataclass(frozen=True)
class KvSettings:
    """Every context parameter that shapes a snapshot's bytes: set on each context from here, and
    described in every cache key from here, so the two cannot disagree."""

    n_ctx: int
    n_ubatch: int = N_UBATCH
    # Restore is exact only with the same attention and KV settings as the save. Flash attention
    # makes a prefill in one piece and in two pieces round differently (docs/performance.md); every path
    # here prefills in the same pieces (base, state, suffix), so hit == miss == cache off either way.
    flash_attn: bool = False
    kv_type: str = "f16"
    kv_unified: bool = True  # seq_cp then shares the prefix cells between question sequences
    # A model-level setting, not a context's: repacked weights run other kernels, which round
    # differently, so the K and V values a prefill writes differ with them.
    repack: bool = False

    def apply(self, params: llama.llama_context_params) -> None:
        params.n_ctx = params.n_batch = self.n_ctx
        params.n_ubatch = self.n_ubatch
        params.flash_attn_type = (
            llama.LLAMA_FLASH_ATTN_TYPE_ENABLED if self.flash_attn else llama.LLAMA_FLASH_ATTN_TYPE_DISABLED
        )
        params.type_k = params.type_v = {"f16": llama.GGML_TYPE_F16, "f32": llama.GGML_TYPE_F32}[self.kv_type]
        params.kv_unified = self.kv_unified

    def describe(self) -> str:
        return (
            f"n_ctx={self.n_ctx};kv={self.kv_type}/{self.kv_type};flash_attn={'on' if self.flash_attn else 'off'};"
            f"kv_unified={int(self.kv_unified)};n_ubatch={self.n_ubatch};repack={int(self.repack)}"
        )


class _Context:
    """One llama_context with its reusable batch. Used by one thread at a time.

    A model without memory (an encoder: every token sees every other) gets an `encoder` context:
    embeddings on, no pooling, and a micro-batch as large as the context, since such a model takes
    a whole prompt in one piece (llama.cpp aborts the process on a longer one)."""

    def __init__(
        self, model: ctypes.c_void_p, kv: KvSettings, threads: int, encoder: bool = False, tap: int | None = None
    ) -> None:
        params = llama.llama_context_default_params()
        self.tap = None if tap is None else LayerTap(tap)  # the context's own: one decode at a time
        if self.tap is not None:
            params.cb_eval = self.tap.callback
        kv.apply(params)
        params.n_seq_max = MAX_SEQUENCES
        params.n_threads = params.n_threads_batch = threads
        params.no_perf = True
        if encoder:
            params.n_ubatch = params.n_batch = kv.n_ctx
            params.embeddings = True
            params.pooling_type = llama.LLAMA_POOLING_TYPE_NONE
        n_ctx = kv.n_ctx
        self.ctx = llama.llama_init_from_model(model, params)
        if not self.ctx:
            raise EngineError(f"llama.cpp could not create a context (n_ctx={n_ctx})")
        self.memory = llama.llama_get_memory(self.ctx)  # None for a model without memory
        self.n_ctx = n_ctx
        # Room for every sequence on each token: a token several suffixes share is in all of theirs.
        self.batch = llama.llama_batch_init(n_ctx, 0, MAX_SEQUENCES)
        self.prompt = llama.llama_batch_ext_init(self.ctx) if encoder else None  # a whole prompt, with its marks
        # Snapshots whose exact bytes sequence 0 holds, shortest first (a base, then what was
        # prefilled on it); sequence 0 is the only sequence left between requests.
        self.held: tuple[Snapshot, ...] = ()

    def clear(self) -> None:
        if self.memory:
            llama.llama_memory_clear(self.memory, False)  # cells emptied; stale data stays masked
        self.held = ()

    def position_of(self, snapshot: Snapshot) -> int | None:
        """Where `snapshot` stands in `held` (compared by identity), or None."""
        return next((i for i, held in enumerate(self.held) if held is snapshot), None)

    def close(self) -> None:
        if self.prompt is not None:
            llama.llama_batch_ext_free(self.prompt)
        llama.llama_batch_free(self.batch)
        llama.llama_free(self.ctx)


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
    ) -> None:
        if not model_path.is_file():
            raise EngineError(f"model file not found: {model_path}")
        check_bindings()
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
        self.vocab = llama.llama_model_get_vocab(self.model)
        self.n_vocab = llama.llama_vocab_n_tokens(self.vocab)
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
        self.add_bos = bool(llama.llama_vocab_get_add_bos(self.vocab))
        self.fingerprint = file_digest(model_path)  # every byte: the disk tier trusts snapshots by it
        kv = KvSettings(n_ctx, repack=repack, flash_attn=flash_attn)
        # besides the tokens, what shapes a snapshot's bytes: in every cache key (reading a layer splits
        # the graph's computation there, which a GPU backend may round differently)
        self.kv_settings = kv.describe() + ("" if layer is None else f";probe_layer={layer}")
        # What else shapes them across processes (the disk tier): the kernels built in and where
        # the layers run. The thread count does not (measured: bit-identical KV with 1, 2 and 3).
        self.build = (
            f"llama-cpp-python {llama.__version__}; ggml backends {'+'.join(self.backends())}; "
            f"n_gpu_layers={n_gpu_layers}; {self.system_info()}"
        )
        self.decode_calls = 0  # llama_decode calls made, for tests and stats
        self.decoded_tokens = 0  # batch rows those calls computed
        # A recurrent memory keeps one state per sequence, which a token in several cannot update:
        # there every suffix is decoded whole in its own sequence.
        self.shares_suffix_tokens = not (
            llama.llama_model_is_recurrent(self.model) or llama.llama_model_is_hybrid(self.model)
        )
        self.restores = 0  # snapshots copied into a context (the rest were still held there)
        self._counter_lock = threading.Lock()
        self._kv, self._threads = kv, threads or os.cpu_count() or 1
        # A model without memory (laya, lfm2-d1-omni, clef) reads each prompt whole: nothing to snapshot.
        # llama.cpp says so only through a context: one is made to ask.
        probe = _Context(self.model, kv, self._threads)
        self.memoryless = not probe.memory
        probe.close()
        self._contexts: list[_Context] = []
        self._idle: list[_Context] = []  # least recently used first
        self._idle_changed = threading.Condition()
        self.open_contexts(contexts)
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
        for _ in range(count):
            tap = None if self.memoryless else self.probe_layer
            ctx = _Context(self.model, self._kv, self._threads, encoder=self.memoryless, tap=tap)
            with self._idle_changed:
                self._contexts.append(ctx)
                self._idle.append(ctx)
                self._idle_changed.notify_all()

    @staticmethod
    def backends() -> list[str]:
        """The ggml backends this build ships (cpu, vulkan, cuda, metal, ...), from its libraries' names:
        a build with a device backend may route ops to it even with no layer offloaded."""
        names = {path.name.split(".")[0].removeprefix("libggml-") for path in Engine.library_dir().glob("libggml-*")}
        return sorted(names - {"base"}) or ["unknown"]

    @staticmethod
    def version() -> str:
        """The installed llama-cpp-python's version."""
        return str(llama.__version__)

    @staticmethod
    def library_dir() -> Path:
        """The folder of the installed llama.cpp's shared libraries."""
        return Path(llama.__file__).resolve().parent / "lib"

    @staticmethod
    def gpu_offload_supported() -> bool:
        """Whether this llama.cpp build has a GPU backend (CUDA, Metal, Vulkan, ...)."""
        return bool(llama.llama_supports_gpu_offload())

    @property
    def kv_bytes_per_token(self) -> int:
        """f16 K and V bytes one token occupies across all layers (what a snapshot should cost)."""
        arch = self.metadata("general.architecture") or ""
        n_head = llama.llama_model_n_head(self.model)
        head_k = int(self.metadata(f"{arch}.attention.key_length") or llama.llama_model_n_embd(self.model) // n_head)
        head_v = int(self.metadata(f"{arch}.attention.value_length") or head_k)
        return int(
            llama.llama_model_n_layer(self.model) * llama.llama_model_n_head_kv(self.model) * (head_k + head_v) * 2
        )

    def close(self) -> None:
        """Free the contexts and the model; later calls raise EngineError instead of crashing."""
        with self._idle_changed:
            # Waits for requests in flight to hand their context back.
            self._idle_changed.wait_for(lambda: len(self._idle) == len(self._contexts))
            for ctx in self._contexts:
                ctx.close()
            self._contexts.clear()
            self._idle.clear()
        if self.model:
            llama.llama_model_free(self.model)
            self.model = None

    @staticmethod
    def system_info() -> str:
        """llama.cpp's account of its build: the instruction sets and backends compiled in."""
        return str(llama.llama_print_system_info().decode("utf-8", "replace").strip())

    # Tokenizer

    def tokenize(self, text: str, *, add_bos: bool = False, special: bool = True) -> list[int]:
        data = text.encode("utf-8")
        capacity = len(data) + 8
        tokens = (llama.llama_token * capacity)()
        n = llama.llama_tokenize(self.vocab, data, len(data), tokens, capacity, add_bos, special)
        if n < 0:
            raise EngineError(f"tokenizer needed {-n} slots for {len(data)} bytes")
        return list(tokens[:n])

    def piece(self, token: int) -> str:
        buf = ctypes.create_string_buffer(64)
        n = llama.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, True)
        return buf.raw[: max(n, 0)].decode("utf-8", "replace")

    def metadata(self, key: str) -> str | None:
        buf = ctypes.create_string_buffer(1 << 16)
        n = llama.llama_model_meta_val_str(self.model, key.encode(), buf, len(buf))
        if n < 0:
            return None
        if n >= len(buf):  # long values (chat templates) need a bigger buffer
            buf = ctypes.create_string_buffer(n + 1)
            llama.llama_model_meta_val_str(self.model, key.encode(), buf, len(buf))
        return buf.value.decode("utf-8", "replace")

    def metadata_keys(self) -> list[str]:
        """Every metadata key of the GGUF (decision models keep temperatures under a prefix)."""
        buf = ctypes.create_string_buffer(1024)
        keys = []
        for i in range(llama.llama_model_meta_count(self.model)):
            n = llama.llama_model_meta_key_by_index(self.model, i, buf, len(buf))
            if n >= 0:
                keys.append(buf.value.decode("utf-8", "replace"))
        return keys

    def control_texts(self) -> set[str]:
        """The text of every control token ("<|im_end|>"): what user text must not spell when a
        prompt is tokenized with special tokens parsed."""
        found = set()
        for token in range(self.n_vocab):
            if llama.llama_vocab_is_control(self.vocab, token):
                text = self.piece(token)
                if text:
                    found.add(text)
        return found

    def special_token_text(self, token: int) -> str:
        return self.piece(token) if token >= 0 else ""

    @property
    def bos_token(self) -> int:
        return int(llama.llama_vocab_bos(self.vocab))

    @property
    def eos_token(self) -> int:
        return int(llama.llama_vocab_eos(self.vocab))

    @property
    def mask_token(self) -> int:
        """The vocabulary's mask token (an encoder's), or -1."""
        return int(llama.llama_vocab_mask(self.vocab))

    @property
    def sep_token(self) -> int:
        """The vocabulary's separator token (an encoder's), or -1."""
        return int(llama.llama_vocab_sep(self.vocab))

    # Inference

    def prefill(self, tokens: Sequence[int], base: Snapshot | None = None) -> tuple[Snapshot, Timing]:
        """Snapshot of sequence 0 after `tokens`, starting from `base` when it holds a prefix of them."""
        if base is not None and tuple(tokens[: base.n_tokens]) != base.tokens:
            raise ValueError("base snapshot is not a prefix of the tokens to prefill")
        timing = Timing()
        with self._borrow(base) as ctx:
            start = 0
            if base is not None:
                timing.restore_ms = self._hold(ctx, base)
                start = base.n_tokens
            else:
                ctx.clear()
            began = time.perf_counter()
            self._fill(ctx, [(tok, start + i, (0,), False) for i, tok in enumerate(tokens[start:])])
            state_mean = None
            if len(tokens) > start:
                self._decode(ctx)
                if ctx.tap is not None:
                    state_mean = ctx.tap.rows(len(tokens) - start).mean(axis=0)
                    state_mean.flags.writeable = False
            timing.prefill_ms = _ms_since(began)
            snapshot = Snapshot(self._save(ctx), tuple(tokens), state_mean)
            ctx.held = (*ctx.held, snapshot)
            return snapshot, timing

    def decode_suffixes(self, prefix: Snapshot, jobs: Sequence[Job], *, hidden: bool = False) -> Answered:
        """Restore `prefix`, decode every job after it, read each job's label logits (and with
        `hidden`, its last hidden vector).

        All jobs go into one llama_decode when they fit; otherwise into the fewest decodes
        that respect the sequence limit and the context's free cells.
        """
        readouts: list[Readout] = []
        timing = Timing()
        groups = self.plan_groups(prefix.n_tokens, [len(job.tokens) for job in jobs])
        with self._borrow(prefix) as ctx:
            timing.restore_ms = self._hold(ctx, prefix)
            began = time.perf_counter()
            for group in groups:
                readouts.extend(self._decode_group(ctx, prefix.n_tokens, [jobs[i] for i in group], hidden))
            timing.decode_ms = _ms_since(began)
        return Answered(readouts, len(groups), timing)

    def plan_groups(self, n_prefix: int, suffix_lengths: Sequence[int]) -> list[list[int]]:
        """Question indices per decode: in order, each group as large as the limits allow.

        Suffixes count whole: shared tokens make a group's rows fewer, never more."""
        free_cells = self.n_ctx - n_prefix
        groups: list[list[int]] = []
        used = 0
        for i, length in enumerate(suffix_lengths):
            if length < 1 or length > free_cells:
                raise ValueError(f"suffix {i} has {length} tokens; {free_cells} cells are free after the prefix")
            if not groups or len(groups[-1]) == MAX_SEQUENCES - 1 or used + length > free_cells:
                groups.append([])
                used = 0
            groups[-1].append(i)
            used += length
        return groups

    def _decode_group(self, ctx: _Context, n_prefix: int, jobs: Sequence[Job], hidden: bool) -> list[Readout]:
        for seq in range(1, len(jobs) + 1):
            llama.llama_memory_seq_cp(ctx.memory, 0, seq, -1, -1)  # unified KV: shares the cells, copies nothing
        entries, paths = suffix_rows(jobs, n_prefix, share=self.shares_suffix_tokens)
        vectors = hidden or any(job.marks for job in jobs)
        if vectors:
            # llama.cpp gives output vectors only for a batch whose every row is an output (it would
            # otherwise mark them all itself, and say so in the log on every decode).
            entries = [(token, pos, seqs, True) for token, pos, seqs, _ in entries]
        llama.llama_set_embeddings(ctx.ctx, vectors)
        try:
            self._fill(ctx, entries)
            self._decode(ctx)
            readouts = [self._read(ctx, path, job, hidden) for path, job in zip(paths, jobs, strict=True)]
        finally:
            llama.llama_set_embeddings(ctx.ctx, False)
        for seq in range(1, len(jobs) + 1):
            llama.llama_memory_seq_rm(ctx.memory, seq, -1, -1)
        return readouts

    def _read(self, ctx: _Context, rows: Sequence[int], job: Job, hidden: bool) -> Readout:
        """A job's readout; `rows`: the batch row of each of its tokens."""
        batch_index = rows[-1]
        pointer = llama.llama_get_logits_ith(ctx.ctx, batch_index)
        if not pointer:
            raise EngineError(f"llama.cpp returned no logits for batch position {batch_index}")
        logits = np.ctypeslib.as_array(pointer, shape=(self.n_vocab,))
        top = float(logits.max())
        log_total = top + math.log(float(np.exp(logits - top).sum(dtype=np.float64)))
        label_logits = [float(logits[t]) for t in job.labels]
        mass = math.fsum(math.exp(x - log_total) for x in label_logits)  # fsum: the label order cannot matter
        state = self._vector(ctx, batch_index) if hidden else None
        marked = tuple(self._vector(ctx, rows[mark]) for mark in job.marks)
        return Readout(label_logits, min(1.0, mass), state, marked)

    def _vector(self, ctx: _Context, batch_index: int) -> NDArray[np.float32]:
        """The output vector of a batch row (the hidden vector, or a decision head's projection of it)."""
        found = llama.llama_get_embeddings_ith(ctx.ctx, batch_index)
        if not found:  # a model that pools its output vectors (an embedding model) has none per token
            raise EngineError(f"llama.cpp returned no output vector for batch position {batch_index}")
        vector = np.ctypeslib.as_array(found, shape=(self.n_embd,)).copy()
        vector.flags.writeable = False
        return vector

    def encode(self, tokens: Sequence[int], rows: Sequence[int], order: Sequence[int] = ()) -> Encoded:
        """A whole prompt through a model without memory, and its output vectors at `rows`. `order`:
        each token's decision order, for a joint decision head (clef), which then puts the score
        of option j in row j."""
        if not self.memoryless:
            raise EngineError("encode is for models without memory; decode_suffixes answers the others")
        if not 0 < len(tokens) <= self.n_ctx:
            raise PromptTooLong(len(tokens), self.n_ctx)
        if order and len(order) != len(tokens):
            raise ValueError(f"{len(order)} decision orders for {len(tokens)} tokens")
        with self._borrow(None) as ctx:
            prompt = ctx.prompt
            if prompt is None:
                raise EngineError("this context was not made for whole prompts")
            llama.llama_batch_ext_clear(prompt)
            for i, token in enumerate(tokens):
                if llama.llama_batch_ext_add_token(prompt, 0, token) != i:
                    raise EngineError(f"llama.cpp refused token {token} at {i} of the prompt")
                llama.llama_batch_ext_set_pos(prompt, i, ctypes.byref(llama.llama_pos(i)))
                llama.llama_batch_ext_set_output_embd(prompt, i, True)
                if order and not _set_decision_order(prompt, i, order[i]):
                    raise EngineError(f"llama.cpp refused decision order {order[i]} at {i}")
            began = time.perf_counter()
            status = llama.llama_process(ctx.ctx, llama.LLAMA_PROCESS_TYPE_DECODE, prompt)
            with self._counter_lock:
                self.decode_calls += 1
                self.decoded_tokens += len(tokens)
            if status != 0:
                raise EngineError(f"llama_process failed with status {status}")
            return Encoded([self._vector(ctx, row) for row in rows], _ms_since(began))

    # Context primitives

    @contextlib.contextmanager
    def _borrow(self, wanted: Snapshot | None) -> Iterator[_Context]:
        """An idle context: one that already holds `wanted` if there is one, else the least recently used.

        A context is handed back holding its sequence 0, so the next request for the same
        prefix (or a prefix of it, such as the base) skips the restore. Anything that goes
        wrong on the way clears it.
        """
        with self._idle_changed:
            self._idle_changed.wait_for(lambda: bool(self._idle) or not self._contexts)
            if not self._contexts:
                raise EngineError("the engine is closed")
            holding = [ctx for ctx in self._idle if wanted is not None and ctx.position_of(wanted) is not None]
            ctx = holding[-1] if holding else self._idle[0]
            self._idle.remove(ctx)
        handed_back = False
        try:
            yield ctx
            handed_back = True
        finally:
            if not handed_back:
                ctx.clear()
            with self._idle_changed:
                self._idle.append(ctx)
                self._idle_changed.notify()

    def _hold(self, ctx: _Context, snapshot: Snapshot) -> float:
        """Make sequence 0 hold exactly `snapshot`: cut back to it when the context holds it
        already (the cells keep the very bytes the snapshot has), else clear and restore."""
        began = time.perf_counter()
        position = ctx.position_of(snapshot)
        # A memory that cannot drop a tail of a sequence (recurrent models) answers False: restore.
        if position is not None and llama.llama_memory_seq_rm(ctx.memory, 0, snapshot.n_tokens, -1):
            ctx.held = ctx.held[: position + 1]
            return _ms_since(began)
        ctx.clear()
        blob = snapshot.data
        read = llama.llama_state_seq_set_data(
            ctx.ctx, ctypes.cast(ctypes.c_char_p(blob), ctypes.POINTER(ctypes.c_uint8)), len(blob), 0
        )
        if read != len(blob):  # _borrow clears the context on the way out: never a half-restored sequence
            raise RestoreError(f"llama.cpp restored {read} of {len(blob)} snapshot bytes")
        ctx.held = (snapshot,)
        with self._counter_lock:
            self.restores += 1
        return _ms_since(began)

    def _save(self, ctx: _Context) -> bytes:
        size = llama.llama_state_seq_get_size(ctx.ctx, 0)
        buf = (ctypes.c_uint8 * size)()
        written = llama.llama_state_seq_get_data(ctx.ctx, buf, size, 0)
        if written != size:
            raise EngineError(f"llama.cpp saved {written} of {size} state bytes")
        return ctypes.string_at(buf, size)

    def _fill(self, ctx: _Context, entries: Sequence[Row]) -> None:
        """Load (token, position, sequences, wants_logits) rows into the context's batch."""
        if len(entries) > ctx.n_ctx:
            raise ValueError(f"{len(entries)} tokens exceed the batch of {ctx.n_ctx}")
        batch = ctx.batch
        for i, (token, pos, seqs, wants_logits) in enumerate(entries):
            batch.token[i] = token
            batch.pos[i] = pos
            batch.n_seq_id[i] = len(seqs)
            for k, seq in enumerate(seqs):
                batch.seq_id[i][k] = seq
            batch.logits[i] = wants_logits
        batch.n_tokens = len(entries)

    def _decode(self, ctx: _Context) -> None:
        if ctx.tap is not None:
            ctx.tap.clear()
        status = llama.llama_decode(ctx.ctx, ctx.batch)
        with self._counter_lock:
            self.decode_calls += 1
            self.decoded_tokens += ctx.batch.n_tokens
        if status != 0:  # _borrow clears the context on the way out
            raise EngineError(f"llama_decode failed with status {status}")


# The one call a joint decision head (clef) needs beyond llama.h: declared in llama.cpp's staging
# C++ header (src/llama-ext.h), so exported under its C++ name; a build without it cannot serve clef.
DECISION_ORDER_SYMBOLS = (
    "llama_batch_ext_set_decision_order",
    "_Z34llama_batch_ext_set_decision_orderP15llama_batch_exti20llama_decision_order",
)


@functools.cache
def decision_order_setter() -> Callable[[ctypes.c_void_p, int, int], bool] | None:
    """llama_batch_ext_set_decision_order, bound by its exported name; None when this build has none."""
    for path in sorted(Engine.library_dir().glob("*llama.*")):
        if path.suffix not in (".so", ".dylib", ".dll"):
            continue
        library = ctypes.CDLL(str(path))  # the loaded library again: the same handle
        for name in DECISION_ORDER_SYMBOLS:
            function = getattr(library, name, None)
            if function is not None:
                function.argtypes = [ctypes.c_void_p, ctypes.c_int32, ctypes.c_int]
                function.restype = ctypes.c_bool
                return function  # type: ignore[no-any-return]
    return None


def _set_decision_order(batch: ctypes.c_void_p, index: int, order: int) -> bool:
    setter = decision_order_setter()
    if setter is None:
        raise EngineError(f"this llama.cpp build ({Engine.library_dir()}) has no {DECISION_ORDER_SYMBOLS[0]}")
    return bool(setter(batch, index, order))


def suffix_rows(jobs: Sequence[Job], n_prefix: int, *, share: bool = True) -> tuple[list[Row], list[list[int]]]:
    """The batch rows that decode `jobs` after an `n_prefix`-token prefix, job i in sequence i + 1,
    and the row of each of each job's tokens.

    With `share`, the suffixes form a tree: a token that several suffixes reach through the same
    tokens is one row, in all of their sequences (llama.cpp masks a row by its first sequence,
    whose earlier tokens are exactly the shared ones). Rows go depth first, so each sequence's
    positions rise and its set of sequences only narrows, as llama.cpp requires.
    """
    # Node 0 is the prefix; each node has its token, the sequences through it and its children.
    tokens: list[int] = [-1]
    sequences: list[list[int]] = [[]]
    children: list[dict[tuple[int, int], int]] = [{}]  # by (token, 0), or (token, job) when not sharing
    paths: list[list[int]] = []  # each job's nodes, one per token
    for seq, job in enumerate(jobs, start=1):
        node = 0
        paths.append([])
        for token in job.tokens:
            key = (token, 0 if share else seq)
            if key not in children[node]:
                children[node][key] = len(tokens)
                tokens.append(token)
                sequences.append([])
                children.append({})
            node = children[node][key]
            sequences[node].append(seq)
            paths[-1].append(node)
    outputs = {path[-1] for path in paths}
    rows: list[Row] = []
    row_of: dict[int, int] = {}
    stack = [(child, 0) for child in reversed(children[0].values())]
    while stack:
        node, depth = stack.pop()
        row_of[node] = len(rows)
        rows.append((tokens[node], n_prefix + depth, tuple(sequences[node]), node in outputs))
        stack.extend((child, depth + 1) for child in reversed(children[node].values()))
    return rows, [[row_of[node] for node in path] for path in paths]


def _ms_since(began: float) -> float:
    return (time.perf_counter() - began) * 1000
