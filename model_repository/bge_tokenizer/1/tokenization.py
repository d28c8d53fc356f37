"""Tensor logic of `bge_tokenizer`, free of Triton so it can be unit-tested."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from tokenizers import Encoding, Tokenizer

PAD_TOKENS = ("[PAD]", "<pad>")


class InvalidTextError(ValueError):
    """A text the model cannot embed; the message names its index in the request."""


@dataclass(frozen=True)
class TokenBatch:
    """One request's texts as padded token arrays ([texts, longest] int64) plus per-text counts."""

    input_ids: np.ndarray
    attention_mask: np.ndarray
    token_count: np.ndarray  # [texts, 1] int32: tokens the model sees, special tokens included
    truncated: np.ndarray  # [texts, 1] bool: the text was cut at the maximum length


def decode_texts(raw: np.ndarray) -> list[str]:
    """Triton's TYPE_STRING tensor ([texts, 1] of bytes) -> str, refusing what cannot be embedded."""
    texts = []
    for index, value in enumerate(raw.reshape(-1)):
        try:
            text = value.decode("utf-8") if isinstance(value, bytes) else str(value)
        except UnicodeDecodeError as exc:
            raise InvalidTextError(f"text {index} is not valid UTF-8 (byte {exc.start})") from None
        if not text.strip():
            raise InvalidTextError(f"text {index} is empty or only whitespace")
        texts.append(text)
    return texts


class TextTokenizer:
    """The checkpoint's fast tokenizer, truncating at `max_length` tokens."""

    def __init__(self, tokenizer_file: str, max_length: int) -> None:
        self._tokenizer = Tokenizer.from_file(tokenizer_file)
        self._tokenizer.no_padding()
        self._tokenizer.enable_truncation(max_length)
        ids = (self._tokenizer.token_to_id(token) for token in PAD_TOKENS)
        self.pad_id = next((i for i in ids if i is not None), 0)

    def encode(self, texts: list[str]) -> list[Encoding]:
        """Tokenise every text in one call (in parallel unless TOKENIZERS_PARALLELISM says otherwise)."""
        return self._tokenizer.encode_batch(texts) if texts else []

    def pack(self, encodings: list[Encoding]) -> TokenBatch:
        """Pad one request's encodings to its own longest text, never to the maximum length."""
        lengths = np.fromiter((len(e.ids) for e in encodings), dtype=np.int32, count=len(encodings))
        width = int(lengths.max()) if len(encodings) else 0
        input_ids = np.full((len(encodings), width), self.pad_id, dtype=np.int64)
        attention_mask = np.zeros((len(encodings), width), dtype=np.int64)
        for row, encoding in enumerate(encodings):
            input_ids[row, : lengths[row]] = encoding.ids
            attention_mask[row, : lengths[row]] = 1
        truncated = np.fromiter((bool(e.overflowing) for e in encodings), dtype=bool, count=len(encodings))
        return TokenBatch(input_ids, attention_mask, lengths.reshape(-1, 1), truncated.reshape(-1, 1))
