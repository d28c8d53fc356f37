"""Long documents in chunks: a collection created with `chunking` splits each document with Triton's chunker (the
served model's tokens), embeds and indexes every chunk, and answers each document once, by its best chunk, whole.
Real gateway, real Triton, the embedded store; REST and gRPC."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import grpc
import httpx
import pytest

from gateway.grpc.pb.gateway.v1 import gateway_pb2, gateway_pb2_grpc
from localtriton.server import TritonProcess
from tests.helpers.running_gateway import RunningGateway
from tests.integration.gateway.test_search_rest import create, error, search, upsert, url

pytestmark = pytest.mark.slow

MANUAL = (
    "Account help. To reset the password of your account, open Settings, choose Security and click "
    "'Reset password'; a link arrives by e-mail within a minute.\n\n"
    "Pets corner. The cat slept all afternoon on the warm windowsill while the dog watched the birds outside.\n\n"
    "Markets.  Stock markets fell sharply after the interest rate decision, and bond yields rose.\n\n"
    "中文部分：推理服务器在 GPU 上运行嵌入模型，每个请求都会被动态批处理。"
)
SHORT = "A short note about gardening tools and tomato plants."
CHUNKING = {"max_tokens": 24, "overlap": 4}


@pytest.fixture
def gateway(
    triton: TritonProcess, gateway_factory: Callable[..., RunningGateway], http: httpx.Client
) -> RunningGateway:
    running = gateway_factory(triton.grpc_url)
    created = create(http, running, "manuals", chunking=CHUNKING)
    assert created["chunking"] == CHUNKING
    documents = [
        {"id": "manual", "text": MANUAL, "metadata": {"kind": "manual"}},
        {"id": "note", "text": SHORT, "metadata": {"kind": "note"}},
    ]
    response = upsert(http, running, "manuals", documents)
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["prompt_tokens"] > 2 * CHUNKING["max_tokens"]  # every chunk embedded
    return running


def hits(http: httpx.Client, gateway: RunningGateway, **body: Any) -> list[dict[str, Any]]:
    response = search(http, gateway, "manuals", **body)
    assert response.status_code == 200, response.text
    found: list[dict[str, Any]] = response.json()["data"]
    return found


def test_each_document_comes_back_once_by_its_best_chunk_whole(gateway: RunningGateway, http: httpx.Client) -> None:
    assert http.get(url(gateway, "/manuals")).json()["documents"] == 2  # documents, not chunks
    for mode in ("dense", "lexical", "hybrid"):
        found = hits(http, gateway, query="the cat slept on the windowsill", mode=mode, top_k=5)
        assert [h["id"] for h in found][:1] == ["manual"] and len({h["id"] for h in found}) == len(found), mode
        best = found[0]
        assert best["text"] == MANUAL and best["metadata"] == {"kind": "manual"}, mode
        chunk = best["chunk"]
        assert "windowsill" in chunk["text"] and MANUAL[chunk["start"] : chunk["end"]] == chunk["text"], mode
    chinese = hits(http, gateway, query="推理服务器", mode="lexical", top_k=1)[0]
    assert (
        "推理" in chinese["chunk"]["text"]
        and MANUAL[chinese["chunk"]["start"] : chinese["chunk"]["end"]] == chinese["chunk"]["text"]
    )
    # a filter and a document of one chunk
    note = hits(http, gateway, query="tomato", mode="lexical", filter={"kind": "note"})
    assert [(h["id"], h["chunk"]["start"], h["chunk"]["end"]) for h in note] == [("note", 0, len(SHORT))]


def test_a_document_is_read_replaced_and_deleted_whole(gateway: RunningGateway, http: httpx.Client) -> None:
    read = http.get(url(gateway, "/manuals/documents/manual")).json()
    assert read["text"] == MANUAL and read["metadata"] == {"kind": "manual"}  # put back together, whitespace and all
    shorter = "Only gardening now: tomato plants need sun."
    assert upsert(http, gateway, "manuals", [{"id": "manual", "text": shorter}]).status_code == 200
    assert http.get(url(gateway, "/manuals/documents/manual")).json()["text"] == shorter
    assert hits(http, gateway, query="windowsill", mode="lexical") == []  # its old chunks are gone
    assert http.get(url(gateway, "/manuals")).json()["documents"] == 2
    deleted = http.post(url(gateway, "/manuals/documents/delete"), json={"filter": {"kind": "note"}}).json()
    assert deleted["deleted"] == 1
    assert http.delete(url(gateway, "/manuals/documents/manual")).status_code == 200
    assert http.get(url(gateway, "/manuals")).json()["documents"] == 0
    assert hits(http, gateway, query="tomato", mode="hybrid") == []


def test_a_reindex_chunks_every_document_again(gateway: RunningGateway, http: httpx.Client) -> None:
    task = http.post(url(gateway, "/manuals/reindex")).json()
    deadline = time.monotonic() + 60
    while task["status"] not in ("completed", "failed"):
        assert time.monotonic() < deadline, task
        time.sleep(0.1)
        task = http.get(url(gateway, f"/manuals/reindex/{task['id']}")).json()
    assert task["status"] == "completed" and task["progress"]["documents"] == 2, task
    assert http.get(url(gateway, "/manuals/documents/manual")).json()["text"] == MANUAL
    assert hits(http, gateway, query="interest rate decision", mode="hybrid", top_k=1)[0]["id"] == "manual"


def test_bad_chunking_and_reserved_metadata_are_refused(gateway: RunningGateway, http: httpx.Client) -> None:
    too_long = http.post(url(gateway, ""), json={"name": "c1", "chunking": {"max_tokens": 100_000}})
    assert too_long.status_code == 400 and too_long.json()["error"]["param"] == "chunking.max_tokens"
    overlapping = http.post(url(gateway, ""), json={"name": "c2", "chunking": {"max_tokens": 64, "overlap": 40}})
    assert overlapping.status_code == 400 and overlapping.json()["error"]["param"] == "chunking.overlap"
    reserved = [{"id": "x", "text": "t", "metadata": {"__document": "y"}}]
    assert "__" in error(upsert(http, gateway, "manuals", reserved), 400)


def test_grpc_creates_chunked_collections_and_answers_the_chunk(gateway: RunningGateway) -> None:
    with grpc.insecure_channel(gateway.grpc_target) as channel:
        stub = gateway_pb2_grpc.SearchStub(channel)
        created = stub.CreateCollection(
            gateway_pb2.CreateCollectionRequest(name="g", chunking=gateway_pb2.Chunking(max_tokens=24, overlap=4))
        )
        assert (created.chunking.max_tokens, created.chunking.overlap) == (24, 4)
        stub.UpsertDocuments(
            gateway_pb2.UpsertDocumentsRequest(
                collection="g", documents=[gateway_pb2.DocumentInput(id="m", text=MANUAL)]
            )
        )
        found = stub.Search(
            gateway_pb2.SearchRequest(collection="g", query="bond yields rose", mode="lexical", top_k=3)
        )
    assert [h.id for h in found.data] == ["m"] and found.data[0].text == MANUAL
    assert "bond yields" in found.data[0].chunk.text
    assert MANUAL[found.data[0].chunk.start : found.data[0].chunk.end] == found.data[0].chunk.text
