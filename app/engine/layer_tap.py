"""One layer's output vectors over a decode's rows, read through llama.cpp's eval callback.

llama.cpp hands out only the last layer's vectors (llama_get_embeddings_ith). A context made with an
eval callback (`cb_eval`) is asked, for every tensor of its graph, whether the callback wants it,
and called back with each wanted tensor once computed. The graph names each layer's output
"l_out-<layer>", counting from 0. The tensor is read with ggml's own accessors (its name, size and a
backend copy), so neither ggml's struct layout nor the device it lives on matters."""

from __future__ import annotations

import ctypes

import numpy as np
from numpy.typing import NDArray

from app.engine.bindings import llama, shared_library


def _ggml() -> ctypes.CDLL:
    ggml = shared_library("ggml-base")
    for name, restype, argtypes in (
        ("ggml_get_name", ctypes.c_char_p, [ctypes.c_void_p]),
        ("ggml_nbytes", ctypes.c_size_t, [ctypes.c_void_p]),
        ("ggml_nrows", ctypes.c_int64, [ctypes.c_void_p]),
        ("ggml_is_contiguous", ctypes.c_bool, [ctypes.c_void_p]),
        ("ggml_backend_tensor_get", None, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t]),
    ):
        function = getattr(ggml, name)
        function.restype, function.argtypes = restype, argtypes
    return ggml


class LayerTap:
    """The output of layer `layer` over the rows of the last decode of the context it is set on that
    had `reading` on (set `callback` as that context's cb_eval; one tap per context)."""

    def __init__(self, layer: int) -> None:
        self.layer = layer
        self._name = f"l_out-{layer}".encode()
        self._ggml = _ggml()
        self._parts: list[NDArray[np.float32]] = []
        self._unreadable = False
        # Off, no tensor is wanted and ggml computes the graph in one piece, as with no callback: only
        # a state's prefill needs the layer (its mean), so suffix decodes skip the copies and the split.
        self.reading = False
        self.callback = llama.ggml_backend_sched_eval_callback(self._called)  # C keeps only a pointer

    def _called(self, tensor: ctypes.c_void_p, ask: bool, _user_data: ctypes.c_void_p) -> bool:
        if not self.reading or self._ggml.ggml_get_name(tensor) != self._name:
            return not ask  # asked: not wanted; called with data we did not ask for: go on
        if ask:
            return True
        rows, size = self._ggml.ggml_nrows(tensor), self._ggml.ggml_nbytes(tensor)
        if not self._ggml.ggml_is_contiguous(tensor) or size % (4 * rows):
            self._unreadable = True  # rows() says so: returning False would only skip the rest of the graph
            return True
        found = np.empty((rows, size // (4 * rows)), dtype=np.float32)
        self._ggml.ggml_backend_tensor_get(tensor, found.ctypes.data, 0, size)
        self._parts.append(found)  # one part per micro-batch, in the batch's order
        return True

    def clear(self) -> None:
        self._parts, self._unreadable = [], False

    def rows(self, n_rows: int) -> NDArray[np.float32]:
        """The layer's output for each of the `n_rows` rows decoded since `clear`, in batch order."""
        if self._unreadable:
            raise ValueError(f"layer {self.layer}'s output is not contiguous float32 rows")
        found = np.concatenate(self._parts) if self._parts else np.empty((0, 0), dtype=np.float32)
        if found.shape[0] != n_rows:
            raise ValueError(f"layer {self.layer}: {found.shape[0]} rows read for a decode of {n_rows}")
        return found
