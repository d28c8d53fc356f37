from __future__ import annotations

import numpy as np
import pytest

from export.checkpoint import Checkpoint
from tests.helpers.model_modules import load_model_module

tokenization = load_model_module("bge_tokenizer", "tokenization")


@pytest.fixture(scope="module")
def tokenizer(minilm: Checkpoint) -> object:
    return tokenization.TextTokenizer(str(minilm.path / "tokenizer.json"), max_length=16)


def texts(*values: bytes) -> np.ndarray:
    return np.array([[v] for v in values], dtype=object)


def test_decodes_utf8_bytes() -> None:
    assert tokenization.decode_texts(texts(b"hello", "你好".encode())) == ["hello", "你好"]


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (texts(b"ok", b""), "text 1 is empty or only whitespace"),
        (texts(b" \t\n "), "text 0 is empty or only whitespace"),
        (texts(b"ok", b"ok", b"\xff\xfeabc"), "text 2 is not valid UTF-8 \\(byte 0\\)"),
    ],
)
def test_refuses_what_cannot_be_embedded(raw: np.ndarray, message: str) -> None:
    with pytest.raises(tokenization.InvalidTextError, match=message):
        tokenization.decode_texts(raw)


def test_pads_to_the_longest_text_of_the_request(tokenizer: object) -> None:
    batch = tokenizer.pack(tokenizer.encode(["hi", "a somewhat longer sentence"]))
    assert batch.input_ids.shape == batch.attention_mask.shape == (2, 6)
    assert batch.attention_mask.sum(axis=1).tolist() == [3, 6] == batch.token_count.ravel().tolist()
    assert batch.input_ids[0, 3:].tolist() == [tokenizer.pad_id] * 3
    assert batch.input_ids.dtype == np.int64 and batch.token_count.dtype == np.int32
    assert not batch.truncated.any()


def test_truncates_at_max_length_and_says_so(tokenizer: object) -> None:
    batch = tokenizer.pack(tokenizer.encode(["word " * 100, "short"]))
    assert batch.input_ids.shape == (2, 16)
    assert batch.truncated.ravel().tolist() == [True, False]
    assert batch.token_count.ravel().tolist() == [16, 3]
