"""A loaded model's vocabulary and the metadata its prompts are built from: what the prompters need
(app/answering/prompter.py's `Tokenizer`), without the engine's contexts."""

from __future__ import annotations

import ctypes

from app.engine.bindings import EngineError, llama

# llama.cpp's vocabulary types whose tokenizers cover every byte of a text (SPM, BPE, RWKV, PLaMo-2).
_EVERY_BYTE_TOKENIZED = frozenset({1, 2, 5, 6})
_UNKNOWN_CHARACTER_BYTES = 4  # the longest UTF-8 character


class Vocabulary:
    """Tokens and texts of the model `model` (a llama_model pointer the engine owns and frees)."""

    def __init__(self, model: ctypes.c_void_p) -> None:
        self._model = model
        self._vocab = llama.llama_model_get_vocab(model)
        self.n_vocab = llama.llama_vocab_n_tokens(self._vocab)
        self.add_bos = bool(llama.llama_vocab_get_add_bos(self._vocab))  # whether a prompt begins with BOS
        self.add_eos = bool(llama.llama_vocab_get_add_eos(self._vocab))  # whether a prompt ends with EOS

    def tokenize(self, text: str, *, add_bos: bool = False, special: bool = True) -> list[int]:
        data = text.encode("utf-8")
        capacity = len(data) + 8
        tokens = (llama.llama_token * capacity)()
        n = llama.llama_tokenize(self._vocab, data, len(data), tokens, capacity, add_bos, special)
        if n < 0:
            raise EngineError(f"tokenizer needed {-n} slots for {len(data)} bytes")
        return list(tokens[:n])

    def longest_token_bytes(self) -> int | None:
        """The most bytes of text one token stands for: a text of more bytes than a context's tokens times
        this cannot fit in it. None for WordPiece and Unigram vocabularies, whose tokenizers normalise text
        first (whitespace, accents and control characters may vanish), so that no such bound holds."""
        if llama.llama_vocab_type(self._vocab) not in _EVERY_BYTE_TOKENIZED:
            return None
        buf = ctypes.create_string_buffer(_UNKNOWN_CHARACTER_BYTES)
        to_piece = llama.llama_token_to_piece  # looked up once: this asks every token
        # a piece longer than the buffer is answered with its length, negated
        longest = max(abs(to_piece(self._vocab, token, buf, len(buf), 0, True)) for token in range(self.n_vocab))
        # an unknown-character token stands for one character, of up to that many bytes
        return max(int(longest), _UNKNOWN_CHARACTER_BYTES)

    def piece(self, token: int) -> str:
        buf = ctypes.create_string_buffer(64)
        n = llama.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, True)
        return buf.raw[: max(n, 0)].decode("utf-8", "replace")

    def metadata(self, key: str) -> str | None:
        buf = ctypes.create_string_buffer(1 << 16)
        n = llama.llama_model_meta_val_str(self._model, key.encode(), buf, len(buf))
        if n < 0:
            return None
        if n >= len(buf):  # long values (chat templates) need a bigger buffer
            buf = ctypes.create_string_buffer(n + 1)
            llama.llama_model_meta_val_str(self._model, key.encode(), buf, len(buf))
        return buf.value.decode("utf-8", "replace")

    def metadata_keys(self) -> list[str]:
        """Every metadata key of the GGUF (decision models keep temperatures under a prefix)."""
        buf = ctypes.create_string_buffer(1024)
        keys = []
        for i in range(llama.llama_model_meta_count(self._model)):
            n = llama.llama_model_meta_key_by_index(self._model, i, buf, len(buf))
            if n >= 0:
                keys.append(buf.value.decode("utf-8", "replace"))
        return keys

    def control_texts(self) -> set[str]:
        """The text of every control token ("<|im_end|>"): what user text must not spell when a
        prompt is tokenized with special tokens parsed."""
        is_control = llama.llama_vocab_is_control  # looked up once: this asks every token
        found = set()
        for token in range(self.n_vocab):
            if is_control(self._vocab, token):
                text = self.piece(token)
                if text:
                    found.add(text)
        return found

    def special_token_text(self, token: int) -> str:
        return self.piece(token) if token >= 0 else ""

    @property
    def bos_token(self) -> int:
        return int(llama.llama_vocab_bos(self._vocab))

    @property
    def eos_token(self) -> int:
        return int(llama.llama_vocab_eos(self._vocab))

    @property
    def mask_token(self) -> int:
        """The vocabulary's mask token (an encoder's), or -1."""
        return int(llama.llama_vocab_mask(self._vocab))

    @property
    def sep_token(self) -> int:
        """The vocabulary's separator token (an encoder's), or -1."""
        return int(llama.llama_vocab_sep(self._vocab))
