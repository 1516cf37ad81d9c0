"""Write a tiny llama-architecture GGUF with random weights: engine tests in milliseconds, and the build check.

The vocabulary is SentencePiece-style ("llama" tokenizer): byte fallback tokens, printable
ASCII, ChatML control tokens, and the answer labels onepass looks for (Yes/No, A-Z,
two-letter labels, digits), each also in its "▁X" (leading space) form.
"""

from __future__ import annotations

import string
from itertools import product
from pathlib import Path

import gguf
import numpy as np
from gguf import quants

CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

N_EMBD, N_LAYER, N_HEAD, N_HEAD_KV, N_FF, N_CTX_TRAIN = 64, 2, 4, 2, 128, 4096


def spm_vocabulary(controls: list[str], pieces: list[str]) -> tuple[list[str], list[int]]:
    """A tiny SentencePiece vocabulary: <unk> <s> </s>, the 256 byte tokens, `controls`, then each
    of `pieces` once, in order. Returns the tokens and their types."""
    tokens = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256)), *controls]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    types += [gguf.TokenType.BYTE] * 256 + [gguf.TokenType.CONTROL] * len(controls)
    seen = set(tokens)
    for piece in pieces:
        if piece not in seen:
            seen.add(piece)
            tokens.append(piece)
            types.append(gguf.TokenType.NORMAL)
    return tokens, [int(t) for t in types]


def vocabulary(extra_words: tuple[str, ...] = ()) -> tuple[list[str], list[int]]:
    letters = string.ascii_uppercase
    pieces = [c for c in string.printable[:95] if c != " "] + ["▁", "\n"]
    pieces += ["Ye", "Yes", "No", "▁Ye", "▁Yes", "▁No", "ye", "yes", "no"]
    pieces += [f"▁{c}" for c in letters + string.digits]
    pieces += ["".join(p) for p in product(letters, repeat=2)]
    pieces += ["▁" + "".join(p) for p in product(letters, repeat=2)]
    pieces += extra_words  # spm_vocabulary keeps each piece's first place
    return spm_vocabulary(["<|im_start|>", "<|im_end|>"], pieces)


def write_tiny_gguf(
    path: Path,
    *,
    seed: int = 0,
    chat_template: str | None = CHATML_TEMPLATE,
    extra_words: tuple[str, ...] = (),
    q4_0: bool = False,
    n_ff: int = N_FF,
    systemone: str | None = None,
    metadata: dict[str, str | float] | None = None,
    architecture: str = "llama",
) -> Path:
    """`architecture`: "llama", or "qwen2vl" (Qwen2-VL's text model: M-RoPE positions, biased q/k/v) to
    pair with a vision projector.
    `q4_0`: the layers' matrices in Q4_0, the type ggml repacks for SIMD (the rest stays F32).
    `n_ff`: the feed-forward width (a larger one makes a file whose last tensors lie far from its header).
    `systemone`: a decision model's template, written as llama.cpp's converters do; `metadata`: more
    keys (strings or float32), such as `llama.decision.type`."""
    rng = np.random.default_rng(seed)
    tokens, types = vocabulary(extra_words)
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_name(f"tiny-{seed}")
    writer.add_block_count(N_LAYER)
    writer.add_context_length(N_CTX_TRAIN)
    writer.add_embedding_length(N_EMBD)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(N_HEAD)
    writer.add_head_count_kv(N_HEAD_KV)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(N_EMBD // N_HEAD)
    if architecture == "qwen2vl":  # rotary pairs per section: time, height, width, unused
        writer.add_array("qwen2vl.rope.dimension_sections", [2, 3, 3, 0])
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_0 if q4_0 else gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([-float(i) for i in range(len(tokens))])  # earlier pieces merge first
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_add_bos_token(True)
    writer.add_add_space_prefix(False)
    templates = [{"name": "default", "template": chat_template}] if chat_template is not None else []
    if systemone is not None:
        templates.append({"name": "systemone", "template": systemone})
    if templates:
        writer.add_chat_template(templates)
    for key, value in (metadata or {}).items():
        if isinstance(value, str):
            writer.add_string(key, value)
        else:
            writer.add_float32(key, value)

    def weight(*shape: int, scale: float = 0.15) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    def layer_weight(name: str, *shape: int) -> None:
        data = weight(*shape)
        if q4_0:
            writer.add_tensor(
                name, quants.quantize(data, gguf.GGMLQuantizationType.Q4_0), raw_dtype=gguf.GGMLQuantizationType.Q4_0
            )
        else:
            writer.add_tensor(name, data)

    n_vocab, head_dim = len(tokens), N_EMBD // N_HEAD
    writer.add_tensor("token_embd.weight", weight(n_vocab, N_EMBD, scale=1.0))
    writer.add_tensor("output_norm.weight", np.ones(N_EMBD, dtype=np.float32))
    writer.add_tensor("output.weight", weight(n_vocab, N_EMBD, scale=0.5))
    for i in range(N_LAYER):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        layer_weight(f"blk.{i}.attn_q.weight", N_EMBD, N_EMBD)
        layer_weight(f"blk.{i}.attn_k.weight", N_HEAD_KV * head_dim, N_EMBD)
        layer_weight(f"blk.{i}.attn_v.weight", N_HEAD_KV * head_dim, N_EMBD)
        layer_weight(f"blk.{i}.attn_output.weight", N_EMBD, N_EMBD)
        if architecture == "qwen2vl":
            for name, width in (("q", N_EMBD), ("k", N_HEAD_KV * head_dim), ("v", N_HEAD_KV * head_dim)):
                writer.add_tensor(f"blk.{i}.attn_{name}.bias", weight(width))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        layer_weight(f"blk.{i}.ffn_gate.weight", n_ff, N_EMBD)
        layer_weight(f"blk.{i}.ffn_up.weight", n_ff, N_EMBD)
        layer_weight(f"blk.{i}.ffn_down.weight", N_EMBD, n_ff)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
