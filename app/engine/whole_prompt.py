"""A whole prompt in llama.cpp's extended batch, for a model without memory (Engine.encode): each
text token at its position, with its decision order where a joint head reads one (clef), and each
image's embeddings in the same batch beside the text, as llama-server's mixed batch puts them
(its server-context.cpp: add_prompt_mixed): one row per cell, at the positions
mtmd_helper_decode_image_chunk would give them, with no decision order."""

from __future__ import annotations

import ctypes
from collections.abc import Sequence

from app.engine import bindings
from app.engine.bindings import EngineError, llama
from app.engine.snapshot import Prefix
from app.engine.vision import Vision


def fill(prompt: ctypes.c_void_p, whole: Prefix, order: Sequence[int], vision: Vision | None) -> None:
    """Put the cells of `whole` (an image's as its span describes them, from its file) in `prompt`, every
    row an output."""
    tokens, spans, images = whole.tokens, whole.spans, whole.images
    llama.llama_batch_ext_clear(prompt)
    starts = {span.offset: span for span in spans}
    position = cell = 0
    while cell < len(tokens):
        span = starts.get(cell)
        if span is None:
            _add(llama.llama_batch_ext_add_token(prompt, 0, tokens[cell]), prompt, cell, [position])
            if order and not bindings.set_decision_order(prompt, cell, order[cell]):
                raise EngineError(f"llama.cpp refused decision order {order[cell]} at {cell}")
            position, cell = position + 1, cell + 1
            continue
        if vision is None:
            raise EngineError("this model has no vision projector: it takes no images")
        if span.sha256 not in images:
            raise ValueError(f"no file given for the image {span.sha256}")
        embd, positions = vision.embeddings(images[span.sha256], span.sha256, position)
        if len(embd) != span.n_tokens:
            raise EngineError(f"the image {span.sha256} made {len(embd)} cells, not its span's {span.n_tokens}")
        for row in range(span.n_tokens):
            data = embd[row].ctypes.data_as(ctypes.POINTER(ctypes.c_float))
            added = llama.llama_batch_ext_add_embd(prompt, 0, llama.llama_embd(data, 1, embd.shape[1]))
            _add(added, prompt, cell + row, [int(p) for p in positions[row]])
        position, cell = position + span.n_pos, cell + span.n_tokens


def _add(index: int, prompt: ctypes.c_void_p, cell: int, positions: list[int]) -> None:
    """A row just added at `index` (it must be `cell`): its positions set, its output asked for."""
    if index != cell:
        raise EngineError(f"llama.cpp refused the prompt's row {cell} (status {index})")
    llama.llama_batch_ext_set_pos(prompt, cell, (llama.llama_pos * len(positions))(*positions))
    llama.llama_batch_ext_set_output_embd(prompt, cell, True)
