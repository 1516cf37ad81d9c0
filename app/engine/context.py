"""One llama.cpp context as the engine uses it: sequence 0 holding a snapshot's exact bytes, a snapshot
restored into a sequence or saved from sequence 0, a batch of rows filled and decoded, a decode that
another thread may have given up (llama.cpp's abort callback) where the memory can drop what it had
begun, and its thread count. The engine's own: nothing outside app/engine/ takes more than its errors
(tests/test_layering.py holds it so); the pool (pool.py) lends them.
"""

from __future__ import annotations

import ctypes
import enum
import functools
import logging
import sys
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from app.engine.bindings import EngineError, llama, llama_log
from app.engine.kv_settings import KvSettings
from app.engine.layer_tap import LayerTap
from app.engine.snapshot import Snapshot
from app.engine.suffix_tree import MAX_SEQUENCES, Row

DECODE_GIVEN_UP = 2  # what llama_decode returns when its abort callback gave it up


# What llama.cpp asks whether to give up a decode under way: strlen over a context's two bytes [flag,
# NUL], 1 once the flag is raised, else 0. ggml's CPU backend asks after every node of the graph; a
# Python callback would take the GIL each time and wait behind any thread holding it, where a C
# function reads a byte. strlen is that function in every C library, with no compiler needed.
@functools.cache
def _give_up_when_flagged() -> Any:
    """The abort callback, made once llama.cpp is loaded (its type comes from the bindings)."""
    c_library = ctypes.cdll.msvcrt if sys.platform == "win32" else ctypes.CDLL(None)
    address = ctypes.cast(c_library.strlen, ctypes.c_void_p).value
    assert address is not None  # a function the C library exports
    return llama.ggml_abort_callback(address)


class _GivingUp(threading.local):
    """The context whose interruptible decode this thread runs, if any."""

    ctx: Context | None = None


_giving_up = _GivingUp()


def _not_given_up_on_purpose(record: logging.LogRecord) -> bool:
    """llama.cpp logs a given-up decode as a failed one (errors, a warning): one `interrupt`ed asked for
    it, and is no error. Its log lines come on the decoding thread, within the call."""
    ctx = _giving_up.ctx
    return ctx is None or ctx._give_up[0] != b"\1"


llama_log.addFilter(_not_given_up_on_purpose)


class RestoreError(EngineError):
    """A snapshot could not be restored; the context has been cleaned."""


class Memory(enum.Enum):
    """What a model's memory of what it read allows, as a probe context finds (`probe_memory`)."""

    NONE = "none"  # no memory: each prompt is read whole (laya, lfm2-d1-omni, clef)
    # A KV cache: the cells after a position can be dropped, so a decode given up mid-way leaves the
    # sequence as it was (llama.cpp drops the given-up micro-batch's cells).
    DROPS_TAIL = "drops a tail"
    # A recurrent state beside or instead of the KV cache (Mamba, RWKV, LFM2's short convolutions,
    # qwen35's linear attention), or a compressed one: written in place as the graph runs, it cannot
    # go back, and llama.cpp's removal of a given-up micro-batch fails (and is not checked).
    FORWARD_ONLY = "forward only"


class Context:
    """One llama_context with its reusable batch. Used by one thread at a time.

    A model without memory (an encoder: every token sees every other) gets an `encoder` context:
    embeddings on, no pooling, and a micro-batch as large as the context, since such a model takes
    a whole prompt in one piece (llama.cpp aborts the process on a longer one)."""

    def __init__(
        self,
        model: ctypes.c_void_p,
        kv: KvSettings,
        threads: int,
        encoder: bool = False,
        tap: int | None = None,
        *,
        can_give_up: bool = False,
    ) -> None:
        """`can_give_up`: a decode under way may be given up (`decode_unless_wanted`, `interrupt`): only
        where the memory drops a tail, and where the graph runs on the CPU (only its backend asks)."""
        params = llama.llama_context_default_params()
        self.tap = None if tap is None else LayerTap(tap)  # the context's own: one decode at a time
        if self.tap is not None:
            params.cb_eval = self.tap.callback
        kv.apply(params)
        # Raised by `interrupt` while an interruptible decode runs: llama.cpp then gives the decode up.
        self._give_up = ctypes.create_string_buffer(2)
        self.can_give_up = can_give_up
        self._interruptible = False
        self._give_up_lock = threading.Lock()  # `interrupt` comes from other threads
        params.abort_callback = _give_up_when_flagged()
        params.abort_callback_data = ctypes.cast(self._give_up, ctypes.c_void_p)
        params.n_seq_max = MAX_SEQUENCES
        params.n_threads = params.n_threads_batch = threads
        self.threads = threads
        self._decoding_threads = 0  # the threads of the interruptible decode under way (0: none)
        self.decodes = self.decoded_rows = 0  # llama_decodes of the batch run to their end, and their rows
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
        # prefilled on it); sequence 0 is the only sequence left between requests. Weak: a context
        # must not keep alive a snapshot the RAM tier has evicted (its bytes would then be counted
        # nowhere), and a request can only ask for a snapshot it holds itself.
        self.held: tuple[weakref.ref[Snapshot], ...] = ()

    def set_threads(self, threads: int) -> None:
        """Decode with `threads` threads from the next decode on (it does not change what a decode computes)."""
        if threads != self.threads:
            llama.llama_set_n_threads(self.ctx, threads, threads)
            self.threads = threads

    def clear(self) -> None:
        if self.memory:
            llama.llama_memory_clear(self.memory, False)  # cells emptied; stale data stays masked
        self.held = ()

    def position_of(self, snapshot: Snapshot) -> int | None:
        """Where `snapshot` stands in `held` (compared by identity), or None."""
        return next((i for i, held in enumerate(self.held) if held() is snapshot), None)

    def holding(self, snapshot: Snapshot) -> None:
        """Sequence 0 now also holds `snapshot` (saved from it after what it held before)."""
        self.held = (*self.held, weakref.ref(snapshot))

    def hold(self, snapshot: Snapshot) -> None:
        """Make sequence 0 hold exactly `snapshot`: cut back to it when the context holds it
        already (the cells keep the very bytes the snapshot has), else clear and restore."""
        position = self.position_of(snapshot)
        # A memory that cannot drop a tail of a sequence (recurrent models) answers False: restore.
        # seq_rm takes positions: an M-RoPE image fills more cells than it advances positions
        if position is not None and llama.llama_memory_seq_rm(self.memory, 0, snapshot.next_pos, -1):
            self.held = self.held[: position + 1]
            return
        self.clear()
        self.restore(snapshot, 0)
        self.held = (weakref.ref(snapshot),)

    def restore(self, snapshot: Snapshot, seq: int) -> None:
        """Restore `snapshot` into sequence `seq`, in the free cells after those in use."""
        blob = snapshot.data
        read = llama.llama_state_seq_set_data(
            self.ctx, ctypes.cast(ctypes.c_char_p(blob), ctypes.POINTER(ctypes.c_uint8)), len(blob), seq
        )
        if read != len(blob):  # borrow clears the context on the way out: never a half-restored sequence
            raise RestoreError(f"llama.cpp restored {read} of {len(blob)} snapshot bytes")

    def save(self) -> bytes:
        """Sequence 0's state (llama_state_seq_get_data): a snapshot's bytes."""
        size = llama.llama_state_seq_get_size(self.ctx, 0)
        buf = (ctypes.c_uint8 * size)()
        written = llama.llama_state_seq_get_data(self.ctx, buf, size, 0)
        if written != size:
            raise EngineError(f"llama.cpp saved {written} of {size} state bytes")
        return ctypes.string_at(buf, size)

    def fill(self, entries: Sequence[Row]) -> None:
        """Load (token, position, sequences, wants_logits) rows into the context's batch."""
        if len(entries) > self.n_ctx:
            raise ValueError(f"{len(entries)} tokens exceed the batch of {self.n_ctx}")
        batch = self.batch
        for i, (token, pos, seqs, wants_logits) in enumerate(entries):
            batch.token[i] = token
            batch.pos[i] = pos
            batch.n_seq_id[i] = len(seqs)
            for k, seq in enumerate(seqs):
                batch.seq_id[i][k] = seq
            batch.logits[i] = wants_logits
        batch.n_tokens = len(entries)

    def read_rows(self, read_layer: bool) -> None:
        """Start the tap, if any, anew: with `read_layer` it reads its layer's rows of the decodes from
        here on (a prefill's text and images alike: an image's decodes go through this context too)."""
        if self.tap is not None:
            self.tap.clear()
            self.tap.reading = read_layer

    def decode(self, *, read_layer: bool = False, more_rows: bool = False) -> None:
        """Decode the batch `fill` loaded; with `read_layer` the tap, if any, reads its layer's rows
        (`more_rows`: after those read since `read_rows`)."""
        if not more_rows:
            self.read_rows(read_layer)
        status = llama.llama_decode(self.ctx, self.batch)
        if status != 0:  # borrow clears the context on the way out
            raise EngineError(f"llama_decode failed with status {status}")
        self._count_decode()

    def _count_decode(self) -> None:
        self.decodes += 1
        self.decoded_rows += self.batch.n_tokens

    def decode_unless_wanted(self, wanted: Callable[[], bool]) -> bool:
        """Decode the batch `fill` loaded, one micro-batch at most, unless the context is `wanted()` before
        it starts or, where it `can_give_up`, `interrupt`ed while it runs: then False, and the cells are
        those before the call (llama.cpp removes a given-up micro-batch's cells). Where it cannot give up,
        a decode that has started ends. The tap, if reading, goes on reading (a given-up decode may have
        added rows to it)."""
        if not self.can_give_up:
            if wanted():
                return False
            self.decode(more_rows=True)
            return True
        before = self.last_position()
        with self._give_up_lock:
            self._give_up[0] = b"\0"
            self._interruptible = True
            self._decoding_threads = self.threads
        try:
            if wanted():  # after arming: a waiter that came meanwhile either is seen here or interrupts
                return False
            _giving_up.ctx = self
            status = llama.llama_decode(self.ctx, self.batch)
        finally:
            _giving_up.ctx = None
            with self._give_up_lock:
                self._interruptible = False
                self._decoding_threads = 0
                self._give_up[0] = b"\0"
        if status == DECODE_GIVEN_UP:
            if self.last_position() != before:  # borrow clears the context on the way out
                raise EngineError("llama.cpp kept cells of a given-up decode: this memory cannot drop a tail")
            return False
        if status != 0:  # borrow clears the context on the way out
            raise EngineError(f"llama_decode failed with status {status}")
        self._count_decode()
        return True

    def last_position(self) -> int:
        """The last position sequence 0 holds (-1: none)."""
        return int(llama.llama_memory_seq_pos_max(self.memory, 0)) if self.memory else -1

    def interrupt(self, above: int = 0) -> bool:
        """Give up the decode under way if it is an interruptible one (`decode_unless_wanted`) with more
        than `above` threads: someone waits for this context, or for some of the cores it uses; whether
        this call gave it up (not another before it). From any thread."""
        with self._give_up_lock:
            if self._interruptible and self._decoding_threads > above and self._give_up[0] != b"\1":
                self._give_up[0] = b"\1"
                return True
            return False

    def close(self) -> None:
        if self.prompt is not None:
            llama.llama_batch_ext_free(self.prompt)
        llama.llama_batch_free(self.batch)
        llama.llama_free(self.ctx)


def probe_memory(model: ctypes.c_void_p, kv: KvSettings, threads: int) -> Memory:
    """What the model's memory allows. llama.cpp says whether there is one only through a context, and
    whether it drops a tail only by trying: a probe context decodes two tokens and drops the second."""
    probe = Context(model, kv, threads)
    try:
        if not probe.memory:
            return Memory.NONE
        probe.fill([(0, 0, (0,), False), (0, 1, (0,), True)])
        probe.decode()
        return Memory.DROPS_TAIL if llama.llama_memory_seq_rm(probe.memory, 0, 1, -1) else Memory.FORWARD_ONLY
    finally:
        probe.close()
