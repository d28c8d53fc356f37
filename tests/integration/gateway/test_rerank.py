"""Reranking through the gateway, REST and gRPC, on a real Triton serving the real MiniLM export and a tiny random
BERT cross-encoder exported beside it (`triton_fp32`: FP32 graphs, so that scores can be held to
sentence-transformers' CrossEncoder): /v1/rerank in the TEI/Cohere/Jina shape, search with `rerank`, keys, usage
and prices, bad input, and a gateway whose Triton has no reranker."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest

from gateway.grpc.pb.gateway.v1 import gateway_pb2, gateway_pb2_grpc
from gateway.settings import AuthSettings, ModelPrice, UsageSettings
from localtriton.server import TritonProcess
from tests.helpers.running_gateway import RunningGateway
from tests.integration.conftest import RERANKER_MAX_LENGTH
from tests.integration.gateway.test_search_rest import create, search, upsert

pytestmark = pytest.mark.slow

QUERY = "How do I reset my password?"
DOCUMENTS = [
    "Open Settings, choose Account and click 'Reset password'.",
    "Our stores open at nine in the morning.",
    "北京是中华人民共和国的首都。",
    "A list comprehension builds a list from an iterable in one expression.",
]
RERANKER = "sk-rerank-reranker-0001"
SEARCHER = "sk-rerank-searcher-0002"
EVERYTHING_OF_0_2 = "sk-rerank-everything-0003"
PRICE_PER_1000_TOKENS = 3.0


@pytest.fixture(scope="module")
def logits(cross_encoder: Path) -> list[float]:
    import torch
    from sentence_transformers import CrossEncoder

    model = CrossEncoder(str(cross_encoder), device="cpu", max_length=RERANKER_MAX_LENGTH)
    pairs = [(QUERY, d) for d in DOCUMENTS]
    return [float(x) for x in model.predict(pairs, activation_fn=torch.nn.Identity(), show_progress_bar=False)]


@pytest.fixture
def gateway(triton_fp32: TritonProcess, gateway_factory: Callable[..., RunningGateway]) -> RunningGateway:
    return gateway_factory(triton_fp32.grpc_url)


def rerank(
    http: httpx.Client, gateway: RunningGateway, headers: dict[str, str] | None = None, **body: Any
) -> httpx.Response:
    return http.post(f"{gateway.base_url}/v1/rerank", json=body, headers=headers or {})


def sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x))


def test_documents_come_back_best_first_with_the_cross_encoders_relevance(
    gateway: RunningGateway, http: httpx.Client, logits: list[float]
) -> None:
    response = rerank(http, gateway, query=QUERY, documents=DOCUMENTS)
    assert response.status_code == 200, response.text
    body = response.json()
    order = list(np.argsort(-np.asarray(logits)))
    assert [r["index"] for r in body["results"]] == order
    assert [r["relevance_score"] for r in body["results"]] == pytest.approx(
        [sigmoid(logits[i]) for i in order], abs=1e-3
    )
    assert all("document" not in r for r in body["results"])
    assert body["object"] == "list" and body["usage"]["prompt_tokens"] == body["usage"]["total_tokens"] > 20
    # top_n, objects as documents, and the texts back
    best = rerank(
        http, gateway, query=QUERY, documents=[{"text": d} for d in DOCUMENTS], top_n=2, return_documents=True
    )
    assert [(r["index"], r["document"]["text"]) for r in best.json()["results"]] == [
        (i, DOCUMENTS[i]) for i in order[:2]
    ]
    assert len(rerank(http, gateway, query=QUERY, documents=DOCUMENTS, top_n=50).json()["results"]) == 4  # clamped


def test_grpc_reranks_the_same(gateway: RunningGateway, http: httpx.Client) -> None:
    rest = rerank(http, gateway, query=QUERY, documents=DOCUMENTS, top_n=3).json()
    with grpc.insecure_channel(gateway.grpc_target) as channel:
        stub = gateway_pb2_grpc.RerankStub(channel)
        answer = stub.Rerank(
            gateway_pb2.RerankRequest(query=QUERY, documents=DOCUMENTS, top_n=3, return_documents=True)
        )
        assert [(r.index, round(r.relevance_score, 5)) for r in answer.results] == [
            (r["index"], round(r["relevance_score"], 5)) for r in rest["results"]
        ]
        assert answer.results[0].document == DOCUMENTS[answer.results[0].index]
        assert answer.usage.prompt_tokens == rest["usage"]["prompt_tokens"] and answer.model == rest["model"]
        with pytest.raises(grpc.RpcError) as empty:
            stub.Rerank(gateway_pb2.RerankRequest(query=QUERY))
        assert empty.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "documents" in str(empty.value.details())


def test_bad_input_is_refused_naming_the_field(gateway: RunningGateway, http: httpx.Client) -> None:
    def refused(status: int, **body: Any) -> str:
        response = rerank(http, gateway, **body)
        assert response.status_code == status, response.text
        param: str = response.json()["error"]["param"]
        return param

    assert refused(400, query=QUERY, documents=[]) == "documents"
    assert refused(400, query=" ", documents=DOCUMENTS) == "query"
    assert refused(400, query=QUERY, documents=["ok", ""]) == "documents"
    assert refused(400, query=QUERY, documents=DOCUMENTS, top_n=0) == "top_n"
    assert refused(413, query=QUERY, documents=["d"] * 1001) == "documents"
    assert refused(404, query=QUERY, documents=DOCUMENTS, model="cohere-rerank-v3") == "model"
    assert rerank(http, gateway, query=QUERY, documents=DOCUMENTS, model="reranker").status_code == 200


def test_search_reranks_its_candidates(gateway: RunningGateway, http: httpx.Client) -> None:
    create(http, gateway, "kb")
    documents = [{"id": str(i), "text": text} for i, text in enumerate(DOCUMENTS)]
    assert upsert(http, gateway, "kb", documents).status_code == 200
    plain = search(http, gateway, "kb", query=QUERY, top_k=4).json()["data"]
    reranked = search(http, gateway, "kb", query=QUERY, top_k=2, rerank={"candidates": 4}).json()
    direct = rerank(http, gateway, query=QUERY, documents=DOCUMENTS, top_n=2).json()["results"]
    assert [hit["id"] for hit in reranked["data"]] == [str(r["index"]) for r in direct]
    first = reranked["data"][0]
    assert first["score_type"] == "relevance" and first["score"] == pytest.approx(
        direct[0]["relevance_score"], abs=1e-5
    )
    assert first["scores"] == {"retrieval": next(h["score"] for h in plain if h["id"] == first["id"])}
    hybrid = search(http, gateway, "kb", query=QUERY, mode="hybrid", top_k=1, rerank={"candidates": 3}).json()
    assert hybrid["data"][0]["score_type"] == "relevance" and "dense" in hybrid["data"][0]["scores"]
    too_few = search(http, gateway, "kb", query=QUERY, top_k=5, rerank={"candidates": 4})
    assert too_few.status_code == 400 and too_few.json()["error"]["param"] == "top_k"
    with grpc.insecure_channel(gateway.grpc_target) as channel:
        stub = gateway_pb2_grpc.SearchStub(channel)
        found = stub.Search(
            gateway_pb2.SearchRequest(
                collection="kb", query=QUERY, top_k=2, rerank=gateway_pb2.SearchRerank(candidates=4)
            )
        )
    assert [h.id for h in found.data] == [hit["id"] for hit in reranked["data"]] and found.data[
        0
    ].score_type == "relevance"


def test_reranks_need_their_scope_and_go_on_the_usage_record_with_their_price(
    triton_fp32: TritonProcess,
    gateway_factory: Callable[..., RunningGateway],
    http: httpx.Client,
    tmp_path: Path,
) -> None:
    keys_file = tmp_path / "keys.yaml"
    keys_file.write_text(
        "keys:\n"
        f"  - {{name: reranker, team: t, secret: {RERANKER}, scopes: [rerank]}}\n"
        f"  - {{name: searcher, team: t, secret: {SEARCHER}, scopes: [search, embeddings]}}\n"
        f"  - {{name: all, team: t, secret: {EVERYTHING_OF_0_2}, scopes: [embeddings, chat, video, search]}}\n"
    )
    probe = gateway_factory(triton_fp32.grpc_url)
    model = rerank(http, probe, query=QUERY, documents=DOCUMENTS).json()["model"]
    keyed = gateway_factory(
        triton_fp32.grpc_url,
        auth=AuthSettings(keys_file=str(keys_file), keys_sqlite_path=str(tmp_path / "keys.sqlite3")),
        usage=UsageSettings(
            usage_sqlite_path=str(tmp_path / "usage.sqlite3"), prices={model: ModelPrice(rerank=PRICE_PER_1000_TOKENS)}
        ),
    )
    refused = rerank(http, keyed, {"Authorization": f"Bearer {SEARCHER}"}, query=QUERY, documents=DOCUMENTS)
    assert refused.status_code == 403 and "lacks the scope 'rerank'" in refused.json()["error"]["message"]
    every_feature = rerank(http, keyed, {"Authorization": f"Bearer {EVERYTHING_OF_0_2}"}, query=QUERY, documents=["a"])
    assert every_feature.status_code == 200  # a key with every feature's scope of 0.2 has rerank too
    answered = rerank(http, keyed, {"Authorization": f"Bearer {RERANKER}"}, query=QUERY, documents=DOCUMENTS)
    tokens = answered.json()["usage"]["prompt_tokens"]
    assert float(answered.headers["x-request-cost"]) == pytest.approx(tokens * PRICE_PER_1000_TOKENS / 1000)
    with grpc.insecure_channel(keyed.grpc_target) as channel:
        stub = gateway_pb2_grpc.RerankStub(channel)
        stub.Rerank(
            gateway_pb2.RerankRequest(query=QUERY, documents=DOCUMENTS[:2]),
            metadata=[("authorization", f"Bearer {RERANKER}")],
        )
    day = time.strftime("%Y-%m-%d", time.gmtime())
    rows = http.get(
        f"{keyed.base_url}/v1/usage", params={"start": day, "end": day}, headers={"Authorization": f"Bearer {RERANKER}"}
    ).json()["data"]
    (row,) = rows
    assert (row["model"], row["requests"], row["rerank_documents"]) == (model, 2, len(DOCUMENTS) + 2)
    assert row["rerank_tokens"] > tokens and row["cost"] == pytest.approx(
        row["rerank_tokens"] * PRICE_PER_1000_TOKENS / 1000
    )


def test_without_a_reranker_reranks_answer_503_naming_the_model(
    triton: TritonProcess, gateway_factory: Callable[..., RunningGateway], http: httpx.Client
) -> None:
    gateway = gateway_factory(triton.grpc_url)
    response = rerank(http, gateway, query=QUERY, documents=DOCUMENTS)
    assert response.status_code == 503, response.text
    error = response.json()["error"]
    assert error["code"] == "reranker_not_served" and "'reranker'" in error["message"] and error["param"] == "model"
    create(http, gateway, "kb")
    assert upsert(http, gateway, "kb", [{"id": "a", "text": "alpha"}]).status_code == 200
    reranked = search(http, gateway, "kb", query="alpha", rerank={"candidates": 10})
    assert reranked.status_code == 503 and reranked.json()["error"]["code"] == "reranker_not_served"
    assert http.post(f"{gateway.base_url}/v1/embeddings", json={"input": "still embeds"}).status_code == 200
