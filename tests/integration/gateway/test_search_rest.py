"""Semantic search through the gateway's REST and gRPC APIs: real gateway, real Triton, the embedded store."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest

from gateway.grpc.pb.gateway.v1 import gateway_pb2, gateway_pb2_grpc
from gateway.settings import SearchSettings
from localtriton.server import TritonProcess
from tests.helpers.running_gateway import RunningGateway

pytestmark = pytest.mark.slow

PASSAGES = [
    {"id": "password", "text": "How do I reset the password of my account?", "metadata": {"topic": "account"}},
    {"id": "cat", "text": "The cat slept all afternoon on the warm windowsill.", "metadata": {"topic": "pets"}},
    {"id": "stocks", "text": "Stock markets fell sharply after the interest rate decision.", "metadata": {"n": 3}},
    {"id": "eggs", "text": "Beat two eggs with flour and milk for the pancake batter.", "metadata": {"tags": ["food"]}},
    {"id": "a/b c", "text": "A document whose id holds a slash and a space.", "metadata": {"ok": True}},
]


def url(gateway: RunningGateway, path: str) -> str:
    return f"{gateway.base_url}/v1/collections{path}"


def create(http: httpx.Client, gateway: RunningGateway, name: str, **fields: Any) -> dict[str, Any]:
    response = http.post(url(gateway, ""), json={"name": name, **fields})
    assert response.status_code == 201, response.text
    body: dict[str, Any] = response.json()
    return body


def upsert(http: httpx.Client, gateway: RunningGateway, name: str, documents: list[dict[str, Any]]) -> httpx.Response:
    return http.post(url(gateway, f"/{name}/documents"), json={"documents": documents})


def search(http: httpx.Client, gateway: RunningGateway, name: str, **body: Any) -> httpx.Response:
    return http.post(url(gateway, f"/{name}/search"), json=body)


def error(response: httpx.Response, status: int) -> str:
    assert response.status_code == status, response.text
    message: str = response.json()["error"]["message"]
    return message


def test_collections_are_created_listed_and_deleted(
    triton: TritonProcess, gateway_factory: Callable[..., RunningGateway], http: httpx.Client
) -> None:
    gateway = gateway_factory(triton.grpc_url)
    body = create(http, gateway, "docs-1", metadata={"team": "search"})
    assert {k: body[k] for k in ("object", "name", "model", "dimensions", "metric", "documents")} == {
        "object": "collection",
        "name": "docs-1",
        "model": "sentence-transformers/all-MiniLM-L6-v2",
        "dimensions": 384,
        "metric": "cosine",
        "documents": 0,
    }
    assert body["query_instruction"] is None and body["metadata"] == {"team": "search"}
    assert "already exists" in error(http.post(url(gateway, ""), json={"name": "docs-1"}), 409)
    assert "collection names" in error(http.post(url(gateway, ""), json={"name": "1bad name"}), 400)
    assert http.get(url(gateway, "")).json() == {"object": "list", "data": [body]}
    assert http.get(url(gateway, "/docs-1")).json() == body
    assert http.delete(url(gateway, "/docs-1")).json() == {
        "name": "docs-1",
        "object": "collection.deleted",
        "deleted": True,
    }
    assert "does not exist" in error(http.get(url(gateway, "/docs-1")), 404)
    assert "does not exist" in error(search(http, gateway, "docs-1", query="anything"), 404)


def test_documents_are_upserted_found_by_meaning_replaced_and_deleted(
    triton: TritonProcess, gateway_factory: Callable[..., RunningGateway], http: httpx.Client
) -> None:
    gateway = gateway_factory(triton.grpc_url)
    create(http, gateway, "faq")
    upserted = upsert(http, gateway, "faq", PASSAGES)
    assert upserted.status_code == 200, upserted.text
    assert [d["id"] for d in upserted.json()["data"]] == [p["id"] for p in PASSAGES]
    assert upserted.json()["usage"]["prompt_tokens"] > 0
    assert http.get(url(gateway, "/faq")).json()["documents"] == len(PASSAGES)

    found = search(http, gateway, "faq", query="I forgot my login password, how can I change it?", top_k=2)
    assert found.status_code == 200, found.text
    assert found.json()["object"] == "search.result"
    hits = found.json()["data"]
    assert hits[0]["id"] == "password" and hits[0]["score"] > hits[1]["score"]
    assert hits[0]["text"] == PASSAGES[0]["text"] and hits[0]["metadata"] == {"topic": "account"}

    filtered = search(http, gateway, "faq", query="password", filter={"topic": {"$ne": "account"}}, top_k=10)
    assert "password" not in [h["id"] for h in filtered.json()["data"]]
    assert len(filtered.json()["data"]) == len(PASSAGES) - 1
    injected = search(http, gateway, "faq", query="password", filter={"topic": 'x" or 1==1 or "'})
    assert injected.status_code == 200 and injected.json()["data"] == []
    high = search(http, gateway, "faq", query=PASSAGES[1]["text"], min_score=0.99)
    assert [h["id"] for h in high.json()["data"]] == ["cat"]

    document = http.get(url(gateway, "/faq/documents/a/b c")).json()
    assert (document["object"], document["id"], document["metadata"]) == ("document", "a/b c", {"ok": True})
    replaced = upsert(http, gateway, "faq", [{"id": "cat", "text": "Dogs bark at the postman.", "metadata": {}}])
    assert replaced.status_code == 200
    again = http.get(url(gateway, "/faq/documents/cat")).json()
    assert again["text"] == "Dogs bark at the postman." and again["created_at"] <= again["updated_at"]
    assert http.get(url(gateway, "/faq")).json()["documents"] == len(PASSAGES)

    assert http.delete(url(gateway, "/faq/documents/cat")).json() == {
        "id": "cat",
        "object": "document.deleted",
        "deleted": True,
    }
    assert "no document" in error(http.get(url(gateway, "/faq/documents/cat")), 404)
    by_ids = http.post(url(gateway, "/faq/documents/delete"), json={"ids": ["eggs", "nope"]})
    assert by_ids.json() == {"object": "documents.deleted", "deleted": 1}
    by_filter = http.post(url(gateway, "/faq/documents/delete"), json={"filter": {"n": {"$gte": 3}}})
    assert by_filter.json()["deleted"] == 1
    assert http.get(url(gateway, "/faq")).json()["documents"] == 2
    exported = http.get(f"{gateway.base_url}/metrics").text
    assert 'gateway_search_store_duration_seconds_count{operation="query",store="embedded"}' in exported


def test_bad_input_is_refused_naming_the_field(
    triton: TritonProcess, gateway_factory: Callable[..., RunningGateway], http: httpx.Client
) -> None:
    gateway = gateway_factory(triton.grpc_url)
    create(http, gateway, "strict")
    long_id = [{"id": "x" * 257, "text": "t"}]
    assert "documents[0].id" in error(upsert(http, gateway, "strict", long_id), 400)
    assert "documents[1].text" in error(
        upsert(http, gateway, "strict", [{"id": "a", "text": "t"}, {"id": "b", "text": " "}]), 400
    )
    nested = [{"id": "a", "text": "t", "metadata": {"x": {"y": 1}}}]
    assert "metadata" in error(upsert(http, gateway, "strict", nested), 400)
    dotted = [{"id": "a", "text": "t", "metadata": {"a.b": 1}}]
    assert "documents[0].metadata.a.b" in error(upsert(http, gateway, "strict", dotted), 400)
    many = [{"id": str(n), "text": "t"} for n in range(1001)]
    assert "maximum is 1000" in error(upsert(http, gateway, "strict", many), 413)
    assert "top_k" in error(search(http, gateway, "strict", query="q", top_k=0), 400)
    assert "top_k" in error(search(http, gateway, "strict", query="q", top_k=101), 400)
    assert "filter.price.$regex" in error(
        search(http, gateway, "strict", query="q", filter={"price": {"$regex": "a"}}), 400
    )
    assert "filter.price.$lt" in error(search(http, gateway, "strict", query="q", filter={"price": {"$lt": "1"}}), 400)
    assert "query" in error(search(http, gateway, "strict", query=""), 400)
    assert "either ids or filter" in error(http.post(url(gateway, "/strict/documents/delete"), json={}), 400)
    assert "does not exist" in error(upsert(http, gateway, "nothing", [{"id": "a", "text": "t"}]), 404)


def test_collections_survive_a_restart_and_a_new_model_revision_asks_for_a_reindex(
    triton: TritonProcess, gateway_factory: Callable[..., RunningGateway], http: httpx.Client, tmp_path: Path
) -> None:
    search_settings = SearchSettings(path=str(tmp_path / "search"))
    first = gateway_factory(triton.grpc_url, search=search_settings)
    create(http, first, "kept")
    assert upsert(http, first, "kept", PASSAGES).status_code == 200
    first.stop()

    second = gateway_factory(triton.grpc_url, search=search_settings)
    assert http.get(url(second, "/kept")).json()["documents"] == len(PASSAGES)
    assert search(http, second, "kept", query="pancake recipe", top_k=1).json()["data"][0]["id"] == "eggs"
    second.stop()

    record = tmp_path / "search" / "collections" / "kept" / "collection.json"
    record.write_text(json.dumps({**json.loads(record.read_text()), "model_revision": "an-older-export"}))
    third = gateway_factory(triton.grpc_url, search=search_settings)
    assert "re-index" in error(search(http, third, "kept", query="pancake"), 409)
    assert "re-index" in error(upsert(http, third, "kept", PASSAGES[:1]), 409)
    assert http.get(url(third, "/kept/documents/eggs")).status_code == 200  # reading stays possible


def test_a_collection_query_instruction_goes_before_the_query(
    triton: TritonProcess, gateway_factory: Callable[..., RunningGateway], http: httpx.Client
) -> None:
    gateway = gateway_factory(triton.grpc_url)
    instruction = "Represent this sentence for searching relevant passages: "
    create(http, gateway, "instructed", query_instruction=instruction)
    create(http, gateway, "plain")
    question = "where is the station"
    documents = [{"id": "prefixed", "text": instruction + question}, {"id": "bare", "text": question}]
    for name in ("instructed", "plain"):
        assert upsert(http, gateway, name, documents).status_code == 200
    assert search(http, gateway, "instructed", query=question, top_k=1).json()["data"][0]["id"] == "prefixed"
    assert search(http, gateway, "plain", query=question, top_k=1).json()["data"][0]["id"] == "bare"


def test_grpc_search_serves_the_same_operations(
    triton: TritonProcess, gateway_factory: Callable[..., RunningGateway]
) -> None:
    gateway = gateway_factory(triton.grpc_url)
    with grpc.insecure_channel(gateway.grpc_target) as channel:
        stub = gateway_pb2_grpc.SearchStub(channel)
        created = stub.CreateCollection(gateway_pb2.CreateCollectionRequest(name="g", metadata_json='{"a": 1}'))
        assert (created.name, created.dimensions, created.metric, created.metadata_json) == (
            "g",
            384,
            "cosine",
            '{"a":1}',
        )
        documents = [
            gateway_pb2.DocumentInput(id=p["id"], text=p["text"], metadata_json=json.dumps(p["metadata"]))
            for p in PASSAGES
        ]
        upserted = stub.UpsertDocuments(gateway_pb2.UpsertDocumentsRequest(collection="g", documents=documents))
        assert [d.status for d in upserted.data] == ["upserted"] * len(PASSAGES)
        found, call = stub.Search.with_call(
            gateway_pb2.SearchRequest(collection="g", query="pancake batter", top_k=1, filter_json='{"tags": "food"}')
        )
        assert [h.id for h in found.data] == ["eggs"] and json.loads(found.data[0].metadata_json) == {"tags": ["food"]}
        assert dict(call.trailing_metadata())["x-cache"] == "miss"
        assert stub.GetDocument(gateway_pb2.DocumentRequest(collection="g", id="cat")).text == PASSAGES[1]["text"]
        deleted = stub.DeleteDocuments(gateway_pb2.DeleteDocumentsRequest(collection="g", ids=["cat", "eggs"]))
        assert deleted.deleted == 2
        assert stub.GetCollection(gateway_pb2.CollectionRequest(name="g")).documents == len(PASSAGES) - 2
        with pytest.raises(grpc.RpcError) as missing:
            stub.GetCollection(gateway_pb2.CollectionRequest(name="nothing"))
        assert missing.value.code() == grpc.StatusCode.NOT_FOUND
        with pytest.raises(grpc.RpcError) as bad:
            stub.Search(gateway_pb2.SearchRequest(collection="g", query="q", filter_json='{"a": {"$bad": 1}}'))
        assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "filter.a.$bad" in str(bad.value.details())
        assert stub.DeleteCollection(gateway_pb2.CollectionRequest(name="g")).deleted
