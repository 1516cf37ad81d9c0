"""Tiny random-weight vision projectors (mmproj GGUFs) that this build's libmtmd loads beside the tiny
text models of app/platform/tiny_gguf.py: "mlp" (LLaVA-1.5: a ViT whose patches become one image
token each), "qwen2vl_merger" (Qwen2-VL: 2x2 patches merged into a token, positioned on an M-RoPE
grid, paired with the qwen2vl text model) and "gemma3" (Gemma 3: 4x4 patches pooled into a token,
whose image tokens attend to each other both ways: libmtmd decodes them non-causally). Each has the
metadata and tensors libmtmd's loader requires (clip.cpp, in the mtmd tool of the engine's llama.cpp);
their outputs mean nothing.

Shapes are ggml's {ne0, ne1}, which numpy writes as (ne1, ne0).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import gguf
import numpy as np

from app.platform.tiny_gguf import N_EMBD as TEXT_EMBD

Projector = Literal["mlp", "qwen2vl_merger", "gemma3"]
# Embedding width, heads, feed-forward width (other than the width: the loader tells up from down by
# their shapes), blocks, the mlp's hidden width.
E, NH, FF, BLOCKS, HIDDEN = 32, 2, 48, 2, 40
# Image side and patch side the projector is trained at: the mlp makes (32 / 8)^2 = 16 tokens of any
# image; qwen2vl_merger keeps an image's aspect, one token per 2x2 patches of 4 pixels; gemma3 makes
# (32 / 4 / 4)^2 = 4.
SIZES: dict[Projector, tuple[int, int]] = {"mlp": (32, 8), "qwen2vl_merger": (64, 4), "gemma3": (32, 4)}


def write_tiny_mmproj(
    path: Path, projector: Projector = "mlp", *, seed: int = 0, width: int = TEXT_EMBD, image_size: int = 0
) -> Path:
    """A `projector` mmproj whose output width is `width` (a text model's embedding width; the tiny text
    models' by default). `image_size`: the side it is trained at, if not SIZES' (the mlp makes
    (image_size / 8)^2 tokens of any image)."""
    rng = np.random.default_rng(seed)
    image_size, patch = image_size or SIZES[projector][0], SIZES[projector][1]
    writer = gguf.GGUFWriter(str(path), "clip")
    writer.add_bool("clip.has_vision_encoder", True)
    writer.add_string("clip.projector_type", projector)
    for key, value in {
        "embedding_length": E,
        "attention.head_count": NH,
        "feed_forward_length": FF,
        "block_count": BLOCKS,
        "projection_dim": width,
        "image_size": image_size,
        "patch_size": patch,
    }.items():
        writer.add_uint32(f"clip.vision.{key}", value)
    writer.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-6)
    writer.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
    writer.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])
    writer.add_bool("clip.use_gelu", True)

    def tensor(name: str, *ggml_shape: int, fill: float | None = None) -> None:
        shape = tuple(reversed(ggml_shape))
        data = np.full(shape, fill) if fill is not None else rng.standard_normal(shape) * 0.1
        writer.add_tensor(name, data.astype(np.float32))

    def norm(name: str) -> None:
        tensor(f"{name}.weight", E, fill=1.0)
        tensor(f"{name}.bias", E, fill=0.0)

    tensor("v.patch_embd.weight", patch, patch, 3, E)
    if projector == "qwen2vl_merger":  # a 3D convolution over two frames: two kernels, no bias
        tensor("v.patch_embd.weight.1", patch, patch, 3, E)
    else:
        tensor("v.position_embd.weight", E, (image_size // patch) ** 2)
    if projector == "mlp":
        norm("v.pre_ln")
    if projector == "gemma3":
        tensor("v.patch_embd.bias", E)
    for i in range(BLOCKS):
        for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
            tensor(f"v.blk.{i}.{name}.weight", E, E)
            tensor(f"v.blk.{i}.{name}.bias", E)
        norm(f"v.blk.{i}.ln1")
        norm(f"v.blk.{i}.ln2")
        tensor(f"v.blk.{i}.ffn_up.weight", E, FF)
        tensor(f"v.blk.{i}.ffn_up.bias", FF)
        tensor(f"v.blk.{i}.ffn_down.weight", FF, E)
        tensor(f"v.blk.{i}.ffn_down.bias", E)
    if projector != "mlp":
        norm("v.post_ln")
    if projector == "gemma3":  # pooled patches, normed, projected to the text model's width
        tensor("mm.soft_emb_norm.weight", E, fill=1.0)
        tensor("mm.input_projection.weight", width, E)
    else:  # the projection to the text model: mm.0, an activation, mm.2 (its width is the output's)
        hidden = HIDDEN if projector == "mlp" else 4 * E
        tensor("mm.0.weight", E if projector == "mlp" else 4 * E, hidden)
        tensor("mm.0.bias", hidden)
        tensor("mm.2.weight", hidden, width)
        tensor("mm.2.bias", width)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
