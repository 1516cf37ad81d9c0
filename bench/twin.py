"""A shape twin of a GGUF: the same architecture, metadata, tokenizer, tensor shapes and quantization
types, with random weights, written in seconds where the real file cannot go (a lent GPU machine has
no network and the default model is 1.1 GB).

    python -m bench.twin record models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf   # -> models/<name>.twin.json.gz
    python -m bench.twin write models/<name>.twin.json.gz models/twin.gguf      # on the other machine
    python -m bench.twin compare REAL.gguf TWIN.gguf                             # prefill and decode speed, both

The twin's answers mean nothing; its speed is the real model's (compare measures it), because a
quantized matrix product costs the same whatever the numbers in it. Scale fields are written as
small finite numbers, so no NaN or denormal slows a kernel down.
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import time
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from app.engine.engine import Engine, SuffixTokens
from app.engine.snapshot import Prefix

# Byte offsets of each block's float16 scales, by quantization type (ggml-common.h's block layouts).
SCALE_OFFSETS = {"Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,), "Q8_0": (0,), "Q4_0": (0,), "Q5_0": (0,)}
# The byte ranges of each k-quant block's sub-block scales, set to 1: random ones (up to 63, or 127 for
# Q6_K) make weights a hundred times a trained model's, whose activations then outgrow float16, which a
# GPU's kernels use on the way (NaN logits on CUDA).
SUB_SCALES = {"Q4_K": (4, 16), "Q5_K": (4, 16), "Q6_K": (192, 208)}
# Where the int8 values of a block whose values are its weights (Q8_0) begin: kept to a few units, for the
# same reason.
INT8_VALUES_FROM = {"Q8_0": 2}


def record(model: Path) -> dict[str, Any]:
    reader = gguf.GGUFReader(str(model))
    fields = []
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        value = field.contents()
        kind = field.types[0]
        sub = field.types[1] if kind == gguf.GGUFValueType.ARRAY else None
        fields.append({"name": name, "type": int(kind), "sub": None if sub is None else int(sub), "value": value})
    tensors = [{"name": t.name, "shape": [int(n) for n in t.shape], "type": t.tensor_type.name} for t in reader.tensors]
    arch = reader.fields["general.architecture"].contents()
    return {"source": model.name, "architecture": arch, "fields": fields, "tensors": tensors}


def write(spec: dict[str, Any], out: Path, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(out), spec["architecture"])
    for field in spec["fields"]:
        kind = gguf.GGUFValueType(field["type"])
        sub = None if field["sub"] is None else gguf.GGUFValueType(field["sub"])
        writer.add_key_value(field["name"], field["value"], kind, sub_type=sub)
    for tensor in spec["tensors"]:
        qtype = gguf.GGMLQuantizationType[tensor["type"]]
        ne0, rows = tensor["shape"][0], int(np.prod(tensor["shape"][1:], dtype=np.int64))
        if qtype == gguf.GGMLQuantizationType.F32:
            norm = rows == 1 and not tensor["name"].endswith(".bias")  # a norm's weights: ones; a bias: small
            data = np.ones((rows, ne0), np.float32) if norm else rng.normal(0, 0.02, (rows, ne0)).astype(np.float32)
            writer.add_tensor(tensor["name"], data.reshape(tensor["shape"][::-1]))
            continue
        block, size = gguf.GGML_QUANT_SIZES[qtype]
        blocks = rng.integers(0, 256, (rows, ne0 // block, size), dtype=np.uint8)
        if tensor["type"] in SUB_SCALES:
            start, end = SUB_SCALES[tensor["type"]]
            blocks[:, :, start:end] = 1
        if tensor["type"] in INT8_VALUES_FROM:
            start = INT8_VALUES_FROM[tensor["type"]]
            blocks[:, :, start:] = rng.integers(-8, 9, (rows, ne0 // block, size - start), dtype=np.int8).view(np.uint8)
        for offset in SCALE_OFFSETS.get(tensor["type"], ()):
            scales = rng.uniform(1e-4, 2e-3, (rows, ne0 // block)).astype(np.float16)
            blocks[:, :, offset : offset + 2] = scales.view(np.uint8).reshape(rows, ne0 // block, 2)
        writer.add_tensor(tensor["name"], blocks.reshape(rows, -1), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def speed(model: Path, tokens: int, rounds: int) -> dict[str, float]:
    """Best-of-`rounds` milliseconds: a prefill of `tokens` tokens, and one batched decode of 5 suffixes."""
    engine = Engine(model, n_ctx=2048, threads=0)
    try:
        ids = [engine.vocab.tokenize("x")[0]] * tokens  # the same ids in both files: the vocabularies are the same
        labels = [engine.vocab.tokenize(word)[0] for word in ("Yes", "No")]
        suffixes = [SuffixTokens(tuple(ids[: 20 + i]), labels) for i in range(5)]
        prefill, decode = [], []
        for _ in range(rounds):
            began = time.perf_counter()
            prefix, _ = engine.prefill(Prefix(tuple(ids)))
            prefill.append((time.perf_counter() - began) * 1000)
            decode.append(engine.decode_suffixes(prefix, suffixes).timing.decode_ms)
        return {"prefill_ms": min(prefill), "decode_ms": min(decode), "prefill_median": statistics.median(prefill)}
    finally:
        engine.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    recorded = sub.add_parser("record", help="write the twin's spec (metadata, tokenizer, shapes, types) from a GGUF")
    recorded.add_argument("model", type=Path)
    recorded.add_argument("--out", type=Path)
    written = sub.add_parser("write", help="write the twin GGUF from a spec")
    written.add_argument("spec", type=Path)
    written.add_argument("out", type=Path)
    compared = sub.add_parser("compare", help="prefill and decode speed of a model and its twin on this machine")
    compared.add_argument("real", type=Path)
    compared.add_argument("twin", type=Path)
    compared.add_argument("--tokens", type=int, default=256)
    compared.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if args.command == "record":
        out = args.out or args.model.with_suffix(".twin.json.gz")
        out.write_bytes(gzip.compress(json.dumps(record(args.model)).encode()))
        print(f"wrote {out}")
    elif args.command == "write":
        began = time.perf_counter()
        write(json.loads(gzip.decompress(args.spec.read_bytes())), args.out)
        print(f"wrote {args.out} in {time.perf_counter() - began:.1f} s (random weights: its answers mean nothing)")
    else:
        found = {}
        for name, path in (("real", args.real), ("twin", args.twin), ("real again", args.real)):
            found[name] = speed(path, args.tokens, args.rounds)
            print(f"{name:>10}: prefill {found[name]['prefill_ms']:.0f} ms, decode {found[name]['decode_ms']:.0f} ms")
        for key in ("prefill_ms", "decode_ms"):
            real = min(found["real"][key], found["real again"][key])
            print(f"twin / real {key.removesuffix('_ms')}: {found['twin'][key] / real:.3f}")
        print(json.dumps(found))


if __name__ == "__main__":
    main()
