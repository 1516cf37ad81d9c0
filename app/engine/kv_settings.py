"""The settings of a context that shape a snapshot's bytes (`KvSettings`), the micro-batch size a
prefill's pieces follow, and the short piece a prefill owes after it let a request go first."""

from __future__ import annotations

from dataclasses import dataclass

from app.engine.bindings import llama

N_UBATCH = 512
# A prefill that let a request go first decodes this many tokens before another request can take the
# context from it (app/engine/prefill.py), so that it ends however many come: short, for the request
# that comes meanwhile waits for it. Cut anywhere at or above it, a prefill's pieces give the cells the
# same bytes as llama.cpp's own micro-batches (measured on the default model, repacked weights on and
# off, flash attention on and off: docs/notes/2026-12-06-hits-during-prefill.md); below it ggml's CPU
# flash attention takes another kernel, which rounds otherwise.
HANDOVER_PIECE = 64


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
