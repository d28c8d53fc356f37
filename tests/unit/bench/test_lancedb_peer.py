"""LanceDB's peer of the search modes on a few hand-made documents and vectors (no Triton: a fake
/v1/embeddings answers the hand-made vectors)."""

from __future__ import annotations

import json
import socket
from collections.abc import AsyncIterator, Mapping
from pathlib import Path

import lancedb
import numpy as np
import pytest
from aiohttp import web

from bench.search.lancedb_peer import (
    DEFAULT,
    TOKENIZERS,
    PeerTable,
    as_json,
    choose_tokenizer,
    measure,
    run_lancedb,
    table_lines,
)
from bench.search.retrieval import RetrievalSet, Split
from gateway.search.documents import Hit

DOCUMENTS = {
    "cat": "the cat sat on the mat",
    "dog": "dogs chase cats in the garden",
    "physics": "quantum physics of crystals",
    "bread": "a recipe for baking bread",
}
# Each document points its own way; the query's vector points at "dog" while its words match "physics".
VECTORS = {document: np.eye(4, dtype=np.float32)[n] for n, document in enumerate(DOCUMENTS)}
QUERY, QUERY_VECTOR = "crystal physics", np.array([0.1, 0.9, 0.0, 0.0], dtype=np.float32)


def peer_table(documents: Mapping[str, str] = DOCUMENTS) -> PeerTable:
    vectors = np.stack([VECTORS[document] for document in documents])
    return PeerTable.create(lancedb.connect("memory://"), "t", documents, vectors, DEFAULT)


def ids(hits: list[Hit]) -> list[str]:
    return [hit.id for hit in hits]


def test_each_mode_finds_its_own_best_document() -> None:
    table = peer_table()
    assert ids(table.dense(QUERY_VECTOR, 2)) == ["dog", "cat"]  # by cosine: 0.99, then 0.11
    assert ids(table.lexical(QUERY, 4)) == ["physics"]  # stemmed "crystal" and "physics" match one document
    fused = table.hybrid(QUERY, QUERY_VECTOR, 2)
    assert set(ids(fused)) == {"dog", "physics"}  # first in one list each: equal RRF scores, 1 / (60 + 1)
    assert fused[0].score == pytest.approx(1 / 61)


def test_the_figures_follow_the_judgements() -> None:
    split = Split(DOCUMENTS, {"q": QUERY}, {"q": {"physics": 1}})
    results = measure(peer_table(), split, {"q": QUERY_VECTOR})
    assert results["lexical"].figures == {"ndcg@10": 1.0, "recall@100": 1.0}
    assert results["dense"].figures["recall@100"] == 1.0  # all 4 documents come back
    assert results["dense"].figures["ndcg@10"] < 1.0  # "physics" is not first by the vectors
    hybrid = results["hybrid"]
    assert hybrid.figures["recall@100"] == 1.0
    assert sorted(hybrid.latency) == [10, 100] and len(hybrid.latency[10].latencies) == 1


def test_a_chinese_set_chooses_a_tokenizer_that_splits_han_text(tmp_path: Path) -> None:
    split = Split(
        {"0": "手机屏幕碎了怎么办", "1": "怎么才能学好英语", "2": "今天天气怎么样"}, {"q": "手机碎屏"}, {"q": {"0": 1}}
    )
    chosen, tried = choose_tokenizer(split, tmp_path, TOKENIZERS)
    assert tried[DEFAULT.name] == 0.0  # `simple` keeps each sentence as one token
    assert chosen is not DEFAULT and tried[chosen.name] == 1.0
    assert choose_tokenizer(None, tmp_path) == (DEFAULT, {})


@pytest.fixture
async def fake_embeddings() -> AsyncIterator[str]:
    """/v1/embeddings answering each text's hand-made vector (documents by text, queries: QUERY_VECTOR)."""
    by_text = {DOCUMENTS[document]: vector for document, vector in VECTORS.items()}

    async def answer(request: web.Request) -> web.Response:
        body = await request.json()
        assert request.headers["Cache-Control"] == "no-cache"
        texts = body["input"]
        vectors = [by_text[text] if body["input_type"] == "document" else QUERY_VECTOR for text in texts]
        data = [{"index": n, "embedding": vector.tolist()} for n, vector in enumerate(vectors)]
        return web.json_response({"data": data})

    app = web.Application()
    app.router.add_post("/v1/embeddings", answer)
    runner = web.AppRunner(app)
    await runner.setup()
    listener = socket.create_server(("127.0.0.1", 0))
    await web.SockSite(runner, listener).start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        await runner.cleanup()


async def test_a_set_runs_through_the_embeddings_route(
    fake_embeddings: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LANCE_LANGUAGE_MODEL_HOME", str(tmp_path))  # restored after: the run points it at jieba's
    split = Split(DOCUMENTS, {"q": QUERY}, {"q": {"physics": 1, "dog": 1}})
    result = await run_lancedb(fake_embeddings, RetrievalSet("tiny", split, None), tmp_path / "tiny")
    assert result.tokenizer == DEFAULT.name and result.vector_index == "none: exact search"
    assert {mode: r.figures["recall@100"] for mode, r in result.modes.items()} == {
        "dense": 1.0,
        "lexical": 0.5,  # "dog" has none of the query's words
        "hybrid": 1.0,
    }
    assert len(result.query_embedding.latencies) == 1  # the query alone, as the gateway's search embeds it
    lines = table_lines([result])
    assert lines[1].split()[:2] == ["tiny", "dense"] and "vector index none: exact search" in lines[-1]
    assert json.loads(json.dumps(as_json(result)))["scores"]["hybrid"]["recall@100"] == 1.0
