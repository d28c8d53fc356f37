"""Window arithmetic of `bge_chunker`, free of Triton so it can be unit-tested.

A text's tokens (the served tokenizer's, without special tokens) are cut into windows of at most W tokens that
start every W - overlap tokens; the last window ends at the last token. Each window becomes the span of the text
from its first token's start to its last token's end, in code points (Python str indices).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from tokenizers import Tokenizer


class ChunkRequestError(ValueError):
    """A request the chunker refuses; the message names the input, what it allows and what arrived."""


def decode_text(raw: npt.NDArray[np.object_]) -> str:
    """Triton's TYPE_STRING tensor ([1] of bytes) -> str.

    Unlike `bge_tokenizer`'s `decode_texts`, a whitespace-only (or empty) text is valid here: it has no token
    and is answered with one span over the whole text.
    """
    value = raw.reshape(-1)[0]
    if not isinstance(value, bytes):
        return str(value)
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ChunkRequestError(f"TEXT is not valid UTF-8 (byte {exc.start})") from None


@dataclass(frozen=True)
class WindowLimits:
    """What a request may ask of one model: MAX_TOKENS in [special_tokens + 1, max_sequence_length]."""

    special_tokens: int  # added around one text by the model's post-processor ([CLS] ... [SEP]: 2)
    max_sequence_length: int

    def width(self, max_tokens: int, overlap: int) -> int:
        """W = MAX_TOKENS - special_tokens tokens per window, once both inputs are in range."""
        lowest = self.special_tokens + 1
        if not lowest <= max_tokens <= self.max_sequence_length:
            raise ChunkRequestError(f"MAX_TOKENS must be from {lowest} to {self.max_sequence_length}, got {max_tokens}")
        width = max_tokens - self.special_tokens
        if not 0 <= overlap < width:
            raise ChunkRequestError(
                f"OVERLAP must be from 0 to {width - 1} (MAX_TOKENS {max_tokens} less {self.special_tokens} "
                f"special tokens, less 1), got {overlap}"
            )
        return width


def token_windows(count: int, width: int, overlap: int) -> npt.NDArray[np.int64]:
    """[windows, 2] token ranges [first, end): one every `width - overlap` tokens, until one ends at `count`."""
    if count <= width:
        return np.array([[0, count]], dtype=np.int64)
    step = width - overlap
    windows = 1 + -(-(count - width) // step)  # the first window that reaches `count` is the last
    starts = np.arange(windows, dtype=np.int64) * step
    return np.stack([starts, np.minimum(starts + width, count)], axis=1)


def chunk_spans(
    offsets: Sequence[tuple[int, int]], text_length: int, width: int, overlap: int
) -> npt.NDArray[np.int32]:
    """[chunks, 2] int32 code-point spans of the windows over tokens with these `offsets` (in order).

    A text without tokens (whitespace, or only characters the tokenizer drops) is one span over the whole text.
    """
    if not offsets:
        return np.array([[0, text_length]], dtype=np.int32)
    bounds = np.asarray(offsets, dtype=np.int64)
    windows = token_windows(len(bounds), width, overlap)
    return np.stack([bounds[windows[:, 0], 0], bounds[windows[:, 1] - 1, 1]], axis=1).astype(np.int32)


class TextChunker:
    """The checkpoint's fast tokenizer, counting every token of a text (no truncation, no padding)."""

    def __init__(self, tokenizer_file: str, max_sequence_length: int) -> None:
        self._tokenizer = Tokenizer.from_file(tokenizer_file)
        # A tokenizer.json may carry the checkpoint's own padding and truncation (MiniLM's: 128 tokens).
        self._tokenizer.no_padding()
        self._tokenizer.no_truncation()
        special = self._tokenizer.num_special_tokens_to_add(False)
        if max_sequence_length <= special:
            raise ValueError(
                f"max_sequence_length must be above the {special} special tokens, got {max_sequence_length}"
            )
        self.limits = WindowLimits(special, max_sequence_length)

    def spans(self, text: str, max_tokens: int, overlap: int) -> npt.NDArray[np.int32]:
        width = self.limits.width(max_tokens, overlap)  # refused before any tokenizing
        # The Python binding gives offsets in code points of the original text, however the normalizer changed it.
        offsets = self._tokenizer.encode(text, add_special_tokens=False).offsets
        return chunk_spans(offsets, len(text), width, overlap)
