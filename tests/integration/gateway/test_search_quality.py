"""Retrieval quality through the API: questions answered by the gateway's search (real Triton, the embedded store)
rank their own passage as well as exact cosine search over the same vectors does (`make bench-search` measures
the same on labelled data sets at 100,000 documents)."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import numpy as np
import pytest

from bench.search.quality import exact_ranked, quality
from localtriton.server import TritonProcess
from tests.helpers.running_gateway import RunningGateway
from tests.helpers.sentences import paraphrase_pairs

pytestmark = pytest.mark.slow
BATCH = 64  # documents per upsert, and texts per /v1/embeddings request: the same batches give the same vectors


def embed(http: httpx.Client, gateway: RunningGateway, texts: list[str], input_type: str) -> np.ndarray:
    response = http.post(f"{gateway.base_url}/v1/embeddings", json={"input": texts, "input_type": input_type})
    assert response.status_code == 200, response.text
    return np.asarray([item["embedding"] for item in response.json()["data"]], dtype=np.float32)


def test_search_through_the_api_ranks_as_well_as_exact_search(
    triton: TritonProcess, gateway_factory: Callable[..., RunningGateway], http: httpx.Client
) -> None:
    gateway = gateway_factory(triton.grpc_url)
    pairs = paraphrase_pairs()
    passages = [passage for _, passage in pairs]
    base = f"{gateway.base_url}/v1/collections"
    assert http.post(base, json={"name": "quality"}).status_code == 201
    vectors = []
    for start in range(0, len(passages), BATCH):
        chunk = passages[start : start + BATCH]
        documents = [{"id": str(start + i), "text": text} for i, text in enumerate(chunk)]
        response = http.post(f"{base}/quality/documents", json={"documents": documents})
        assert response.status_code == 200, response.text
        vectors.append(embed(http, gateway, chunk, "document"))
    ranked, queries = [], []
    for question, _ in pairs:
        response = http.post(f"{base}/quality/search", json={"query": question, "top_k": 10})
        assert response.status_code == 200, response.text
        ranked.append([int(hit["id"]) for hit in response.json()["data"]])
        queries.append(embed(http, gateway, [question], "query")[0])

    answers = list(range(len(pairs)))
    engine = quality(ranked, answers)
    exact = quality(exact_ranked(np.concatenate(vectors), np.stack(queries)), answers)
    assert exact["recall@10"] > 0.5  # the questions find their passages: the comparison below means something
    assert engine["recall@10"] >= 0.99 * exact["recall@10"], (engine, exact)
    assert engine["mrr"] >= 0.99 * exact["mrr"], (engine, exact)
