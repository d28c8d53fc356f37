"""Semantic search joined to the rest of the gateway: its upserts and queries on the usage record with their
cost (REST and gRPC), the `search` scope and requests per minute (REST and gRPC), SEARCH_ENABLED=false, and an
embedded store whose folder cannot be made (the gateway starts, search alone is degraded). Real gateway, real
Triton."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest

from gateway.grpc.pb.gateway.v1 import gateway_pb2, gateway_pb2_grpc
from gateway.settings import AuthSettings, ModelPrice, SearchSettings, UsageSettings
from localtriton.server import TritonProcess
from tests.helpers.running_gateway import RunningGateway
from tests.integration.gateway.test_search_rest import PASSAGES, error, url

pytestmark = pytest.mark.slow

MODEL = "sentence-transformers/all-MiniLM-L6-v2"  # what the test Triton serves
SEARCHER = "sk-search-usage-searcher-0001"
EMBEDDER = "sk-search-usage-embedder-0002"
LIMITED = "sk-search-usage-limited-0003"
KEYS = f"""
keys:
  - {{name: searcher, team: search, secret: {SEARCHER}, scopes: [search]}}
  - {{name: embedder, team: search, secret: {EMBEDDER}, scopes: [embeddings]}}
  - {{name: limited, team: other, secret: {LIMITED}, scopes: [search], limits: {{requests_per_minute: {{search: 1}}}}}}
"""
PRICE_PER_1000_TOKENS = 2.0


def bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


def grpc_auth(secret: str) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {secret}")]


@pytest.fixture
def keyed(triton: TritonProcess, gateway_factory: Callable[..., RunningGateway], tmp_path: Path) -> RunningGateway:
    keys_file = tmp_path / "keys.yaml"
    keys_file.write_text(KEYS)
    return gateway_factory(
        triton.grpc_url,
        auth=AuthSettings(keys_file=str(keys_file), keys_sqlite_path=str(tmp_path / "keys.sqlite3")),
        usage=UsageSettings(
            usage_sqlite_path=str(tmp_path / "usage.sqlite3"),
            prices={MODEL: ModelPrice(embedding=PRICE_PER_1000_TOKENS)},
        ),
    )


def todays_usage(http: httpx.Client, gateway: RunningGateway, secret: str) -> dict[str, Any]:
    day = time.strftime("%Y-%m-%d", time.gmtime())
    response = http.get(f"{gateway.base_url}/v1/usage", params={"start": day, "end": day}, headers=bearer(secret))
    assert response.status_code == 200, response.text
    rows: list[dict[str, Any]] = response.json()["data"]
    assert len(rows) == 1 and rows[0]["model"] == MODEL, rows
    return rows[0]


def wait_for_usage(http: httpx.Client, gateway: RunningGateway, secret: str, **expected: float) -> dict[str, Any]:
    """The row once it shows `expected` (search usage is written in the background, as embeddings')."""
    deadline = time.monotonic() + 5.0
    while True:
        row = todays_usage(http, gateway, secret)
        if all(row[name] == value for name, value in expected.items()):
            return row
        assert time.monotonic() < deadline, (row, expected)
        time.sleep(0.05)


def test_search_upserts_and_queries_are_on_the_usage_record_with_their_cost(
    keyed: RunningGateway, http: httpx.Client
) -> None:
    headers = bearer(SEARCHER)
    assert http.post(url(keyed, ""), json={"name": "metered"}, headers=headers).status_code == 201
    upserted = http.post(url(keyed, "/metered/documents"), json={"documents": PASSAGES}, headers=headers)
    assert upserted.status_code == 200, upserted.text
    upsert_tokens = upserted.json()["usage"]["prompt_tokens"]
    assert float(upserted.headers["x-request-cost"]) == pytest.approx(upsert_tokens * PRICE_PER_1000_TOKENS / 1000)
    found = http.post(url(keyed, "/metered/search"), json={"query": "reset my password"}, headers=headers)
    assert found.status_code == 200 and found.json()["data"][0]["id"] == "password"
    query_tokens = found.json()["usage"]["prompt_tokens"]
    assert float(found.headers["x-request-cost"]) == pytest.approx(query_tokens * PRICE_PER_1000_TOKENS / 1000)

    with grpc.insecure_channel(keyed.grpc_target) as channel:
        stub = gateway_pb2_grpc.SearchStub(channel)
        more = gateway_pb2.UpsertDocumentsRequest(
            collection="metered", documents=[gateway_pb2.DocumentInput(id="grpc", text="Sent over gRPC.")]
        )
        grpc_upsert = stub.UpsertDocuments(more, metadata=grpc_auth(SEARCHER))
        query = gateway_pb2.SearchRequest(collection="metered", query="a cat asleep", top_k=2)
        grpc_search = stub.Search(query, metadata=grpc_auth(SEARCHER))
    assert grpc_search.data[0].id == "cat"

    tokens = upsert_tokens + query_tokens + grpc_upsert.usage.prompt_tokens + grpc_search.usage.prompt_tokens
    row = wait_for_usage(http, keyed, SEARCHER, requests=4, search_queries=2, search_documents=len(PASSAGES) + 1)
    assert row["embedding_tokens"] == tokens
    assert row["cost"] == pytest.approx(tokens * PRICE_PER_1000_TOKENS / 1000)


def test_a_key_without_the_search_scope_is_refused_over_rest_and_grpc(
    keyed: RunningGateway, http: httpx.Client
) -> None:
    for method, path in (("POST", ""), ("GET", ""), ("GET", "/any"), ("POST", "/any/search")):
        refused = http.request(method, url(keyed, path), json={"name": "x", "query": "q"}, headers=bearer(EMBEDDER))
        assert refused.status_code == 403, (method, path, refused.text)
        assert "lacks the scope 'search'" in refused.json()["error"]["message"]
    with grpc.insecure_channel(keyed.grpc_target) as channel:
        stub = gateway_pb2_grpc.SearchStub(channel)
        with pytest.raises(grpc.RpcError) as refused_rpc:
            stub.Search(gateway_pb2.SearchRequest(collection="any", query="q"), metadata=grpc_auth(EMBEDDER))
        assert refused_rpc.value.code() == grpc.StatusCode.PERMISSION_DENIED
        with pytest.raises(grpc.RpcError) as listed:
            stub.ListCollections(gateway_pb2.ListCollectionsRequest(), metadata=grpc_auth(EMBEDDER))
        assert listed.value.code() == grpc.StatusCode.PERMISSION_DENIED


def test_a_keys_search_requests_per_minute_hold(keyed: RunningGateway, http: httpx.Client) -> None:
    assert http.get(url(keyed, ""), headers=bearer(LIMITED)).status_code == 200
    refused = http.get(url(keyed, ""), headers=bearer(LIMITED))
    assert refused.status_code == 429 and refused.json()["error"]["code"] == "rate_limit_exceeded"
    assert "requests per minute" in refused.json()["error"]["message"] and int(refused.headers["retry-after"]) >= 1
    with grpc.insecure_channel(keyed.grpc_target) as channel, pytest.raises(grpc.RpcError) as over:
        gateway_pb2_grpc.SearchStub(channel).ListCollections(
            gateway_pb2.ListCollectionsRequest(), metadata=grpc_auth(LIMITED)
        )
    assert over.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert http.get(url(keyed, ""), headers=bearer(SEARCHER)).status_code == 200  # another key, other limits


def test_with_search_disabled_no_store_is_opened_and_search_answers_503_search_disabled(
    triton: TritonProcess, gateway_factory: Callable[..., RunningGateway], http: httpx.Client, tmp_path: Path
) -> None:
    folder = tmp_path / "never-made"
    gateway = gateway_factory(triton.grpc_url, search=SearchSettings(enabled=False, path=str(folder)))
    for method, path in (("POST", ""), ("GET", ""), ("GET", "/docs/documents/a"), ("POST", "/docs/search")):
        answer = http.request(method, url(gateway, path), json={"name": "docs", "query": "q"})
        assert "SEARCH_ENABLED=true" in error(answer, 503)
        assert answer.json()["error"]["code"] == "search_disabled"
    with grpc.insecure_channel(gateway.grpc_target) as channel, pytest.raises(grpc.RpcError) as disabled:
        gateway_pb2_grpc.SearchStub(channel).Search(gateway_pb2.SearchRequest(collection="docs", query="q"))
    assert disabled.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "SEARCH_ENABLED=true" in (disabled.value.details() or "")
    ready = http.get(f"{gateway.base_url}/readyz")
    assert ready.status_code == 200 and ready.json()["checks"]["search"] == "disabled"
    assert http.post(f"{gateway.base_url}/v1/embeddings", json={"input": "still served"}).status_code == 200
    assert not folder.exists()


def test_an_embedded_store_folder_that_cannot_be_made_leaves_the_gateway_up_and_search_degraded(
    triton: TritonProcess, gateway_factory: Callable[..., RunningGateway], http: httpx.Client
) -> None:
    # sysfs refuses new folders even to root (as a read-only root filesystem would): no permission to be had.
    gateway = gateway_factory(triton.grpc_url, search=SearchSettings(path="/sys/ai-gateway-search-test"))
    refused = http.post(url(gateway, ""), json={"name": "docs"})
    assert "search store (embedded)" in error(refused, 503)
    assert refused.json()["error"]["code"] == "search_store_unavailable"
    ready = http.get(f"{gateway.base_url}/readyz")
    assert ready.status_code == 200 and ready.json()["checks"]["search"] == "degraded"
    assert http.post(f"{gateway.base_url}/v1/embeddings", json={"input": "still served"}).status_code == 200
