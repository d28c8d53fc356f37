"""Tensor logic of `reranker_tokenizer`, free of Triton: (query, document) pairs -> the model's token arrays.

It imports only numpy and tokenizers, so the export's parity check tokenises with it too and so measures what
Triton runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from tokenizers import Encoding, Tokenizer

PAD_TOKENS = ("<pad>", "[PAD]")
# The same strategy as sentence-transformers' CrossEncoder (what the parity gate compares with): tokens come off
# the longer text first, so a query shorter than half the maximum length stays whole and only the document is cut
# (`only_second` in effect), while a longer query is cut too instead of failing the request as `only_second` would.
TRUNCATION_STRATEGY = "longest_first"


@dataclass(frozen=True)
class PairBatch:
    """One request's pairs as right-padded token arrays ([pairs, longest] int64) plus per-pair counts."""

    input_ids: npt.NDArray[np.int64]
    attention_mask: npt.NDArray[np.int64]
    token_type_ids: npt.NDArray[np.int64]  # 0: the query and the special tokens around it, 1: the document (BERT-style)
    token_count: npt.NDArray[np.int32]  # [pairs, 1] int32: tokens the model sees, special tokens included
    truncated: npt.NDArray[np.bool_]  # [pairs, 1] bool: query or document was cut at the maximum length


class PairTokenizer:
    """The checkpoint's fast tokenizer encoding (query, document) pairs, at most `max_length` tokens each."""

    def __init__(self, tokenizer_file: str, max_length: int) -> None:
        self._tokenizer = Tokenizer.from_file(tokenizer_file)
        self._tokenizer.no_padding()
        self._tokenizer.enable_truncation(max_length, strategy=TRUNCATION_STRATEGY)
        ids = (self._tokenizer.token_to_id(token) for token in PAD_TOKENS)
        self.pad_id = next((i for i in ids if i is not None), 0)

    def encode(self, queries: Sequence[str], documents: Sequence[str]) -> list[Encoding]:
        """Every pair in one call (in parallel unless TOKENIZERS_PARALLELISM says otherwise)."""
        if len(queries) != len(documents):
            raise ValueError(f"{len(queries)} queries but {len(documents)} documents: pairs need one of each")
        return self._tokenizer.encode_batch(list(zip(queries, documents, strict=True))) if queries else []

    def pack(self, encodings: list[Encoding]) -> PairBatch:
        """Pad one request's pairs to its own longest pair, never to the maximum length."""
        count = len(encodings)
        lengths = np.fromiter((len(e.ids) for e in encodings), dtype=np.int32, count=count)
        width = int(lengths.max()) if count else 0
        input_ids = np.full((count, width), self.pad_id, dtype=np.int64)
        attention_mask = np.zeros((count, width), dtype=np.int64)
        token_type_ids = np.zeros((count, width), dtype=np.int64)
        for row, encoding in enumerate(encodings):
            input_ids[row, : lengths[row]] = encoding.ids
            attention_mask[row, : lengths[row]] = 1
            token_type_ids[row, : lengths[row]] = encoding.type_ids
        truncated = np.fromiter((bool(e.overflowing) for e in encodings), dtype=bool, count=count)
        return PairBatch(input_ids, attention_mask, token_type_ids, lengths.reshape(-1, 1), truncated.reshape(-1, 1))


def graph_inputs(batch: PairBatch, names: Sequence[str]) -> dict[str, npt.NDArray[np.int64]]:
    """The arrays a graph takes, by tensor name (TOKEN_TYPE_IDS only where the model has token types)."""
    arrays = {
        "INPUT_IDS": batch.input_ids,
        "ATTENTION_MASK": batch.attention_mask,
        "TOKEN_TYPE_IDS": batch.token_type_ids,
    }
    return {name: arrays[name] for name in names}
