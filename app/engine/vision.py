"""The engine's vision path: a model's projector (mmproj) through libmtmd, llama.cpp's multimodal library.

An image enters a prefix as it enters llama-server's: libmtmd tokenizes a media marker with the
image's bitmap into the projector's own text around the image (Qwen2-VL's <|vision_start|> and
<|vision_end|>, none for LLaVA) and one chunk of image tokens; the encoder turns the chunk into
embeddings, and mtmd_helper_decode_image_chunk decodes those into a context's sequence at the
positions the model wants (an M-RoPE grid that advances max(nx, ny) positions; non-causal attention
where the projector asks for it). The engine decodes the text itself, as for any prefix: text
through llama_decode and images through the helper give the KV bytes of libmtmd's own whole-prompt
helper (measured on the mlp and the M-RoPE projectors).

Only bytes app/wire/images.py has checked come here, and they are decoded by stb_image alone (libmtmd
exports it): libmtmd's own loader hands whatever stb cannot decode to an ffmpeg subprocess.

A model has one projector context, which its pooled contexts share: its encoder writes one output
buffer, so encoding and copying the embeddings out hold a lock, and the decodes run in parallel.
"""

from __future__ import annotations

import contextlib
import ctypes
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from app.engine import bindings
from app.engine.bindings import EngineError, llama

# Where an image goes in the text libmtmd tokenizes: one per process, as llama-server's, so that no
# request's text can name it (the engine never hands user text to libmtmd anyway).
MEDIA_MARKER = f"<__onepass_media_{secrets.token_hex(8)}__>"
KEEP_TOKENIZED = 64  # recent images whose tokens are kept: a repeated image is not decoded again to plan


class ImageUnreadable(ValueError):
    """stb_image could not decode an image that app/wire/images.py took, or the projector cannot take it:
    the request's fault, a 422 of type `kind`."""

    def __init__(self, message: str, kind: str = "image_invalid") -> None:
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True)
class ImageTokens:
    """What one image puts in a prompt: the projector's text tokens before and after it, how many
    cells its embedding fills and how many positions it advances."""

    sha256: str
    before: tuple[int, ...]
    n_tokens: int
    n_pos: int
    after: tuple[int, ...]


class Vision:
    """A model's vision projector, loaded with libmtmd."""

    def __init__(self, model: ctypes.c_void_p, mmproj: Path, *, use_gpu: bool, threads: int, max_batch: int) -> None:
        """`max_batch`: the most tokens a context decodes in one micro-batch (an image decoded
        non-causally must fit in one)."""
        bindings.init()
        from llama_cpp import mtmd_cpp  # libmtmd's bindings: this module's alone

        self._mtmd: Any = mtmd_cpp
        mtmd_cpp.mtmd_helper_log_set(bindings.log_callback(), None)
        self._marker = MEDIA_MARKER.encode()  # referenced while the context lives: it keeps the pointer
        params = mtmd_cpp.mtmd_context_params_default()
        params.use_gpu = use_gpu
        params.n_threads = threads
        params.print_timings = False
        params.media_marker = self._marker
        self.ctx = mtmd_cpp.mtmd_init_from_file(str(mmproj).encode(), model, params)
        if not self.ctx:
            raise EngineError(f"libmtmd could not load the vision projector {mmproj} for this model")
        if not mtmd_cpp.mtmd_support_vision(self.ctx):
            mtmd_cpp.mtmd_free(self.ctx)
            raise EngineError(f"{mmproj} has no vision encoder")
        self.n_embd = llama.llama_model_n_embd_inp(model)  # the width of an image token's embedding
        # how the model places and attends an image's tokens: an M-RoPE grid; both ways among themselves
        self.mrope = bool(mtmd_cpp.mtmd_decode_use_mrope(self.ctx))
        self.non_causal = bool(mtmd_cpp.mtmd_decode_use_non_causal(self.ctx, None))
        self.max_batch = max_batch
        self.encodes = 0  # images encoded so far: a repeated image state found in the cache encodes none
        self.encode_ms = 0.0  # what those encodes took, the encoder alone (bench/image_states.py reads it)
        self._encoder = threading.Lock()
        self._known: OrderedDict[str, ImageTokens] = OrderedDict()
        self._known_lock = threading.Lock()
        self._stb = _stb_image(bindings.shared_library("mtmd"))

    def close(self) -> None:
        if self.ctx:
            self._mtmd.mtmd_free(self.ctx)
            self.ctx = None

    def tokens(self, data: bytes, sha256: str) -> ImageTokens:
        """What the image in `data` (SHA-256 `sha256`) puts in a prompt."""
        with self._known_lock:
            known = self._known.get(sha256)
            if known is not None:
                self._known.move_to_end(sha256)
                return known
        m = self._mtmd
        before: list[int] = []
        after: list[int] = []
        found: tuple[int, int] | None = None
        with self._tokenized(data, sha256) as chunks:
            for i in range(m.mtmd_input_chunks_size(chunks)):
                chunk = m.mtmd_input_chunks_get(chunks, i)
                if m.mtmd_input_chunk_get_type(chunk) == m.MTMD_INPUT_CHUNK_TYPE_TEXT:
                    count = ctypes.c_size_t()
                    text = m.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(count))
                    (after if found else before).extend(text[k] for k in range(count.value))
                else:
                    found = (m.mtmd_input_chunk_get_n_tokens(chunk), m.mtmd_input_chunk_get_n_pos(chunk))
        if found is None:
            raise EngineError(f"libmtmd made no image chunk of the image {sha256}")
        if self.non_causal and found[0] > self.max_batch:  # llama-server caps the projector's tokens so
            raise ImageUnreadable(
                f"the image makes {found[0]} tokens; this model reads an image in one piece of at most "
                f"{self.max_batch}: send a smaller image",
                "image_too_large",
            )
        tokens = ImageTokens(sha256, tuple(before), found[0], found[1], tuple(after))
        with self._known_lock:
            self._known[sha256] = tokens
            while len(self._known) > KEEP_TOKENIZED:
                self._known.popitem(last=False)
        return tokens

    def decode(self, lctx: ctypes.c_void_p, data: bytes, sha256: str, n_past: int) -> tuple[int, int]:
        """Encode the image and decode its embeddings into sequence 0 of `lctx` from position `n_past`:
        (the cells it filled, the position after it)."""
        m = self._mtmd
        with self._tokenized(data, sha256) as chunks:
            chunk = self._image_chunk(chunks)
            n_tokens = m.mtmd_input_chunk_get_n_tokens(chunk)
            if m.mtmd_decode_use_non_causal(self.ctx, chunk) and n_tokens > self.max_batch:
                # the helper turns causal attention off per batch: the image must be one batch
                raise EngineError(f"an image of {n_tokens} tokens exceeds the micro-batch of {self.max_batch}")
            embd = self._encode(chunk, sha256, n_tokens)
            after = llama.llama_pos(0)
            status = m.mtmd_helper_decode_image_chunk(
                self.ctx,
                lctx,
                chunk,
                embd.ctypes.data_as(ctypes.POINTER(ctypes.c_float)),
                n_past,
                0,
                self.max_batch,
                ctypes.byref(after),
                m.mtmd_helper_post_decode_callback(),  # none (a NULL pointer: the binding refuses None)
                None,
            )
            if status != 0:
                raise EngineError(f"decoding the image {sha256} failed with status {status}")
            return n_tokens, after.value

    def embeddings(self, data: bytes, sha256: str, n_past: int) -> tuple[NDArray[np.float32], NDArray[np.int32]]:
        """The image's embeddings, one row per cell, and each cell's four positions from `n_past`
        (what llama-server puts in the batch of a model read whole, beside the text: t, y, x and z
        on an M-RoPE grid, else the cell's own position four times)."""
        m = self._mtmd
        with self._tokenized(data, sha256) as chunks:
            chunk = self._image_chunk(chunks)
            n_tokens = m.mtmd_input_chunk_get_n_tokens(chunk)
            embd = self._encode(chunk, sha256, n_tokens).reshape(n_tokens, self.n_embd)
            positions = np.repeat(np.arange(n_past, n_past + n_tokens, dtype=np.int32)[:, None], 4, axis=1)
            image = m.mtmd_input_chunk_get_tokens_image(chunk)
            if self.mrope and image:
                for i in range(n_tokens):
                    at = m.mtmd_image_tokens_get_decoder_pos(image, n_past, i)
                    positions[i] = (at.t, at.y, at.x, at.z)
            return embd, positions

    def _image_chunk(self, chunks: Any) -> Any:
        m = self._mtmd
        return next(
            chunk
            for chunk in (m.mtmd_input_chunks_get(chunks, i) for i in range(m.mtmd_input_chunks_size(chunks)))
            if m.mtmd_input_chunk_get_type(chunk) == m.MTMD_INPUT_CHUNK_TYPE_IMAGE
        )

    def _encode(self, chunk: Any, sha256: str, n_tokens: int) -> NDArray[np.float32]:
        """The image chunk's embeddings, copied out of the encoder's one buffer under its lock."""
        m = self._mtmd
        with self._encoder:
            began = time.perf_counter()
            status = m.mtmd_encode_chunk(self.ctx, chunk)
            if status != 0:
                raise EngineError(f"libmtmd could not encode the image {sha256} (status {status})")
            self.encodes += 1
            self.encode_ms += 1000 * (time.perf_counter() - began)
            output = m.mtmd_get_output_embd(self.ctx)
            found: NDArray[np.float32] = np.ctypeslib.as_array(output, shape=(n_tokens * self.n_embd,)).copy()
            return found

    @contextlib.contextmanager
    def _tokenized(self, data: bytes, sha256: str) -> Iterator[Any]:
        """libmtmd's chunks of the marker alone with the image (no BOS or EOS: the image sits inside a prompt)."""
        m = self._mtmd
        bitmap = self._bitmap(data, sha256)
        chunks = m.mtmd_input_chunks_init()
        try:
            text = m.mtmd_input_text(self._marker, len(self._marker), False, True)
            bitmaps = (m.mtmd_bitmap_p_ctypes * 1)(bitmap)
            status = m.mtmd_tokenize(self.ctx, chunks, ctypes.byref(text), bitmaps, 1)
            if status != 0:
                raise ImageUnreadable(f"the vision projector could not take the image {sha256} (status {status})")
            yield chunks
        finally:
            m.mtmd_input_chunks_free(chunks)
            m.mtmd_bitmap_free(bitmap)

    def _bitmap(self, data: bytes, sha256: str) -> Any:
        """The image's RGB bitmap, decoded by stb_image (what libmtmd's loader does first), its id the SHA-256."""
        width, height, channels = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
        pixels = self._stb.stbi_load_from_memory(
            data, len(data), ctypes.byref(width), ctypes.byref(height), ctypes.byref(channels), 3
        )
        if not pixels:
            reason = (self._stb.stbi_failure_reason() or b"unknown").decode("utf-8", "replace")
            raise ImageUnreadable(f"the image {sha256} could not be decoded: {reason}")
        try:
            bitmap = self._mtmd.mtmd_bitmap_init(
                width.value, height.value, ctypes.cast(pixels, ctypes.POINTER(ctypes.c_uint8))
            )
        finally:
            self._stb.stbi_image_free(pixels)
        if not bitmap:
            raise EngineError(f"libmtmd could not make a bitmap of {width.value} x {height.value}")
        self._mtmd.mtmd_bitmap_set_id(bitmap, sha256.encode())
        return bitmap


def _stb_image(library: ctypes.CDLL) -> ctypes.CDLL:
    """stb_image's decoder and its error, as libmtmd exports them."""
    for name, restype, argtypes in (
        (
            "stbi_load_from_memory",
            ctypes.c_void_p,
            [ctypes.c_char_p, ctypes.c_int] + [ctypes.POINTER(ctypes.c_int)] * 3 + [ctypes.c_int],
        ),
        ("stbi_image_free", None, [ctypes.c_void_p]),
        ("stbi_failure_reason", ctypes.c_char_p, []),
    ):
        function = getattr(library, name)
        function.restype, function.argtypes = restype, argtypes
    return library
