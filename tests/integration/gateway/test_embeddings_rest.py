"""POST /v1/embeddings end to end: real gateway, real Triton."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Callable

import httpx
import numpy as np
import pytest

from localtriton.server import TritonProcess
from tests.helpers.metrics import metric
from tests.helpers.running_gateway import RunningGateway
from tests.helpers.sentences import mixed_texts
from tests.helpers.triton_embeddings import cosines, triton_direct

pytestmark = pytest.mark.slow


def vectors_of(body: dict[str, object]) -> np.ndarray:
    data = body["data"]
    assert isinstance(data, list)
    assert [item["index"] for item in data] == list(range(len(data)))
    return np.array([item["embedding"] for item in data], dtype=np.float32)


@pytest.fixture
def fp32_gateway(triton_fp32: TritonProcess, gateway_factory: Callable[..., RunningGateway]) -> RunningGateway:
    # FP32 vectors do not depend on their batch mates (INT8's dynamic activation scales do),
    # so equality with Triton's own output can be asserted tightly.
    return gateway_factory(triton_fp32.grpc_url)


@pytest.mark.parametrize("count", [1, 7, 64, 300])
def test_embeddings_equal_tritons_own_output_in_order(
    count: int, fp32_gateway: RunningGateway, triton_fp32: TritonProcess, http: httpx.Client
) -> None:
    texts = mixed_texts(count)
    response = http.post(f"{fp32_gateway.base_url}/v1/embeddings", json={"input": texts, "model": "bge"})
    assert response.status_code == 200, response.text
    body = response.json()
    expected, tokens = triton_direct(triton_fp32, texts)
    served = vectors_of(body)
    assert served.shape == expected.shape
    cosines = np.sum(served * expected, axis=1) / (np.linalg.norm(served, axis=1) * np.linalg.norm(expected, axis=1))
    assert cosines.min() >= 0.9999
    assert body["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens, "truncated_texts": 0}
    assert body["model"] == "sentence-transformers/all-MiniLM-L6-v2" and body["object"] == "list"


async def test_concurrent_single_texts_are_merged_and_each_gets_its_own_vector(
    fp32_gateway: RunningGateway, triton_fp32: TritonProcess, http: httpx.Client
) -> None:
    """32 clients, one text each, against the real Triton: the coalescer merges them into fewer calls (the
    overlapping ones included), and every caller gets the vector of its own text; bad ones fail alone."""
    texts = mixed_texts(160, tag="merged")
    bad = {40: {"input": ""}, 90: {"input": "word " * 2000, "truncate": False}}
    url = f"{fp32_gateway.base_url}/v1/embeddings"
    merged = "gateway_embedding_coalesced_requests"
    calls_before, requests_before = (
        metric(http, fp32_gateway.base_url, f"{merged}_count"),
        metric(http, fp32_gateway.base_url, f"{merged}_sum"),
    )

    limit = asyncio.Semaphore(32)
    async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=32)) as client:

        async def one(index: int) -> httpx.Response:
            async with limit:
                return await client.post(url, json=bad.get(index, {"input": texts[index]}))

        answers = list(await asyncio.gather(*(one(i) for i in range(len(texts)))))
    assert [answers[i].status_code for i in bad] == [400, 400]
    assert all("error" in answers[i].json() for i in bad)
    good = [i for i in range(len(texts)) if i not in bad]
    assert all(answers[i].status_code == 200 for i in good), [
        answers[i].text for i in good if answers[i].status_code != 200
    ]
    served = np.concatenate([vectors_of(answers[i].json()) for i in good])
    expected, _ = triton_direct(triton_fp32, [texts[i] for i in good])
    assert cosines(served, expected).min() >= 0.9999
    calls = metric(http, fp32_gateway.base_url, f"{merged}_count") - calls_before
    requests = metric(http, fp32_gateway.base_url, f"{merged}_sum") - requests_before
    assert calls >= 1 and requests > calls  # some calls carried several clients' texts


def test_single_string_input_and_base64_encoding(fp32_gateway: RunningGateway, http: httpx.Client) -> None:
    url = f"{fp32_gateway.base_url}/v1/embeddings"
    as_float = http.post(url, json={"input": "hello world"}).json()
    as_base64 = http.post(url, json={"input": "hello world", "encoding_format": "base64"}).json()
    decoded = np.frombuffer(base64.b64decode(as_base64["data"][0]["embedding"]), dtype="<f4")
    np.testing.assert_array_equal(decoded, np.array(as_float["data"][0]["embedding"], dtype=np.float32))
    assert len(decoded) == 384


def test_truncation_is_reported_or_refused(fp32_gateway: RunningGateway, http: httpx.Client) -> None:
    url = f"{fp32_gateway.base_url}/v1/embeddings"
    texts = ["word " * 2000, "short text"]
    response = http.post(url, json={"input": texts})
    assert response.status_code == 200
    assert response.json()["usage"]["truncated_texts"] == 1
    assert response.headers["x-truncated-texts"] == "1"
    refused = http.post(url, json={"input": texts, "truncate": False})
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert "input[0]" in error["message"] and "maximum of 512 tokens" in error["message"]
    assert error["code"] == "context_length_exceeded"


def test_unknown_model_is_404_and_request_id_is_echoed(fp32_gateway: RunningGateway, http: httpx.Client) -> None:
    response = http.post(
        f"{fp32_gateway.base_url}/v1/embeddings",
        json={"input": "x", "model": "text-embedding-3-large"},
        headers={"X-Request-Id": "req-123"},
    )
    assert response.status_code == 404
    assert response.json()["error"]["param"] == "model"
    assert response.headers["x-request-id"] == "req-123"
    assert len(http.get(f"{fp32_gateway.base_url}/healthz").headers["x-request-id"]) == 32
