"""bench/twin.py: a shape twin has the model's metadata, tokenizer, tensor shapes and quantization types,
other weights, and loads and decodes in llama.cpp."""

from __future__ import annotations

from pathlib import Path

import gguf

from app.engine.engine import Engine
from app.engine.snapshot import Prefix
from app.platform.tiny_gguf import write_tiny_gguf
from bench.twin import record, write


def test_a_twin_has_the_models_shapes_types_and_tokenizer_and_other_weights(tmp_path: Path) -> None:
    model = write_tiny_gguf(tmp_path / "model.gguf", seed=3, q4_0=True)
    twin = write(record(model), tmp_path / "twin.gguf", seed=1)
    real, copy = gguf.GGUFReader(str(model)), gguf.GGUFReader(str(twin))
    assert [(t.name, list(t.shape), t.tensor_type) for t in real.tensors] == [
        (t.name, list(t.shape), t.tensor_type) for t in copy.tensors
    ]
    shown = {name: f.contents() for name, f in real.fields.items() if not name.startswith("GGUF.")}
    assert shown == {name: f.contents() for name, f in copy.fields.items() if not name.startswith("GGUF.")}
    assert any((a.data != b.data).any() for a, b in zip(real.tensors, copy.tensors, strict=True))
    assert twin.stat().st_size == model.stat().st_size
    engine = Engine(twin, n_ctx=256, threads=1)
    try:
        prefix, _ = engine.prefill(Prefix(tuple(engine.vocab.tokenize("a twin decodes", add_bos=True))))
        assert prefix.n_tokens > 1
    finally:
        engine.close()
