"""The reranker's python-backend tensor logic, without Triton: pair tokenization and batching by length."""

from __future__ import annotations

import importlib.util
import sys
from concurrent.futures import ThreadPoolExecutor
from types import ModuleType

import numpy as np
import pytest

from export.checkpoint import Checkpoint
from export.reranker.backends.reranker_tokenizer.pair_tokenization import PairTokenizer, graph_inputs
from export.reranker.repository import BACKENDS
from tests.helpers.model_modules import load_model_module

LONG_DOCUMENT = "Only the document is cut while the query is short. " * 100


@pytest.fixture
def tokenizer(minilm: Checkpoint) -> PairTokenizer:
    return PairTokenizer(str(minilm.path / "tokenizer.json"), 64)


@pytest.fixture
def scorer(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """scorer.py as Triton imports it: beside bge_onnx's encoder.py, importable as `encoder`."""
    monkeypatch.setitem(sys.modules, "encoder", load_model_module("bge_onnx", "encoder"))
    spec = importlib.util.spec_from_file_location("reranker_onnx_scorer", BACKENDS / "reranker_onnx" / "scorer.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_pair_is_one_sequence_with_the_document_as_second_segment(tokenizer: PairTokenizer) -> None:
    batch = tokenizer.pack(tokenizer.encode(["reset password"], ["open the settings"]))
    ids, types = batch.input_ids[0].tolist(), batch.token_type_ids[0].tolist()
    assert ids[0] == 101 and ids.count(102) == 2 and ids[-1] == 102  # [CLS] query [SEP] document [SEP]
    second = ids.index(102) + 1
    assert types == [0] * second + [1] * (len(ids) - second)
    assert batch.token_count.tolist() == [[len(ids)]] and not batch.truncated.any()


def test_a_long_document_is_cut_and_the_short_query_kept_whole(tokenizer: PairTokenizer) -> None:
    query = "why is the document cut"
    (encoding,) = tokenizer.encode([query], [LONG_DOCUMENT])
    batch = tokenizer.pack([encoding])
    assert batch.token_count.tolist() == [[64]] and batch.truncated.tolist() == [[True]]
    alone = tokenizer.encode([query], ["x"])[0]
    query_tokens = alone.ids[: alone.ids.index(102) + 1]
    assert encoding.ids[: len(query_tokens)] == query_tokens


def test_a_request_is_padded_to_its_own_longest_pair(tokenizer: PairTokenizer) -> None:
    batch = tokenizer.pack(tokenizer.encode(["q", "a longer query"], ["d", "a longer document than the first"]))
    lengths = batch.attention_mask.sum(axis=1)
    assert batch.input_ids.shape == (2, int(lengths.max())) and lengths[0] < lengths[1]
    assert (batch.input_ids[0, lengths[0] :] == tokenizer.pad_id).all()
    assert (batch.token_type_ids[0, lengths[0] :] == 0).all()
    assert list(graph_inputs(batch, ["INPUT_IDS", "ATTENTION_MASK"])) == ["INPUT_IDS", "ATTENTION_MASK"]


def test_queries_and_documents_come_in_pairs(tokenizer: PairTokenizer) -> None:
    with pytest.raises(ValueError, match="2 queries but 1 documents"):
        tokenizer.encode(["a", "b"], ["c"])
    assert tokenizer.encode([], []) == []


def fake_scores(features: dict[str, np.ndarray]) -> np.ndarray:
    """A graph whose score changes with every real token and token type, and with no padded position."""
    mask = features["ATTENTION_MASK"]
    value = (features["INPUT_IDS"] * mask).sum(axis=1) + 1000 * (features["TOKEN_TYPE_IDS"] * mask).sum(axis=1)
    return value.astype(np.float32).reshape(-1, 1)


def requests_of_mixed_lengths(tokenizer: PairTokenizer) -> list[dict[str, np.ndarray]]:
    groups = [
        (["q"], ["short"]),
        (["a query", "another"], [LONG_DOCUMENT, "medium length document here"]),
        (["x", "y", "z"], ["one", "two words", "three words here"]),
    ]
    names = ["INPUT_IDS", "ATTENTION_MASK", "TOKEN_TYPE_IDS"]
    return [graph_inputs(tokenizer.pack(tokenizer.encode(q, d)), names) for q, d in groups]


@pytest.mark.parametrize("workers", [1, 2])
def test_batching_by_length_gives_each_request_its_own_scores(
    workers: int, scorer: ModuleType, tokenizer: PairTokenizer
) -> None:
    requests = requests_of_mixed_lengths(tokenizer)
    with ThreadPoolExecutor(workers) as executor:
        parts = scorer.score_by_length(fake_scores, requests, executor=executor, workers=workers)
    assert [p.shape for p in parts] == [(1, 1), (2, 1), (3, 1)]
    for part, request in zip(parts, requests, strict=True):
        np.testing.assert_array_equal(part, fake_scores(request))


def test_token_tensors_of_unequal_shapes_are_refused(scorer: ModuleType) -> None:
    ids = np.ones((2, 5), dtype=np.int64)
    assert scorer.shape_error({"INPUT_IDS": ids, "ATTENTION_MASK": ids}) is None
    error = scorer.shape_error({"INPUT_IDS": ids, "ATTENTION_MASK": np.ones((2, 4), dtype=np.int64)})
    assert error and "[2, 4]" in error
    assert scorer.score_by_length(fake_scores, []) == []
