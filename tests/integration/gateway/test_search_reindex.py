"""Re-indexing a collection after a new model revision: real gateway, real Triton, the embedded store. A
re-export is simulated by giving the collection's record another revision, as the 409 test does."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest

from gateway.grpc.pb.gateway.v1 import gateway_pb2, gateway_pb2_grpc
from gateway.search.milvus import MilvusStore
from gateway.settings import SearchSettings
from localtriton.server import TritonProcess
from tests.helpers.milvus_fixtures import MilvusStandalone, milvus_server  # noqa: F401 (a fixture)
from tests.helpers.running_gateway import RunningGateway
from tests.integration.gateway.test_search_rest import PASSAGES, create, error, search, upsert, url

pytestmark = pytest.mark.slow

FINAL = ("completed", "failed", "cancelled")


def age_revision(search_path: Path, name: str) -> None:
    """Make the collection's vectors look like those of an older export of the served model."""
    record = search_path / "collections" / name / "collection.json"
    record.write_text(json.dumps({**json.loads(record.read_text()), "model_revision": "an-older-export"}))


async def age_milvus_revision(uri: str, name: str) -> None:
    store = MilvusStore(uri, None, timeout_seconds=30)
    try:
        collection = await store.collection(name)
        await store.update_collection(dataclasses.replace(collection, model_revision="an-older-export"))
    finally:
        await store.aclose()


FINAL_ORDER = ("pending", "processing", *FINAL)


def watch_events(http: httpx.Client, events_url: str) -> list[dict[str, Any]]:
    """The task objects of a watch stream, which must end with [DONE]."""
    with http.stream("GET", events_url) as stream:
        assert stream.status_code == 200 and stream.headers["content-type"].startswith("text/event-stream")
        payloads = [line[len("data: ") :] for line in stream.iter_lines() if line.startswith("data: ")]
    assert payloads[-1] == "[DONE]"
    return [json.loads(payload) for payload in payloads[:-1]]


def wait_final(http: httpx.Client, base_url: str, location: str, timeout: float = 120.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        task: dict[str, Any] = http.get(base_url + location).json()
        if task["status"] in FINAL:
            return task
        assert time.monotonic() < deadline, f"re-index not finished after {timeout} s: {task}"
        time.sleep(0.05)


def test_a_reindex_job_brings_a_collection_to_the_served_revision(
    triton: TritonProcess, gateway_factory: Callable[..., RunningGateway], http: httpx.Client, tmp_path: Path
) -> None:
    settings = SearchSettings(path=str(tmp_path / "search"))
    first = gateway_factory(triton.grpc_url, search=settings)
    served = create(http, first, "kept")
    assert upsert(http, first, "kept", PASSAGES).status_code == 200
    before = {p["id"]: http.get(url(first, f"/kept/documents/{p['id']}")).json() for p in PASSAGES}
    first.stop()

    age_revision(tmp_path / "search", "kept")
    gateway = gateway_factory(triton.grpc_url, search=settings)
    assert http.get(url(gateway, "/kept")).json()["model_revision"] == "an-older-export"
    message = error(search(http, gateway, "kept", query="pancake"), 409)
    assert "POST /v1/collections/kept/reindex" in message
    assert "POST /v1/collections/kept/reindex" in error(upsert(http, gateway, "kept", PASSAGES[:1]), 409)

    accepted = http.post(url(gateway, "/kept/reindex"))
    assert accepted.status_code == 202, accepted.text
    task = accepted.json()
    assert (task["object"], task["collection"], task["model_revision"]) == (
        "collection.reindex.task",
        "kept",
        served["model_revision"],
    )
    assert task["progress"]["total"] == len(PASSAGES)
    assert accepted.headers["location"] == f"/v1/collections/kept/reindex/{task['id']}"
    watched = watch_events(http, gateway.base_url + accepted.headers["location"] + "/events")
    assert [event["id"] for event in watched] == [task["id"]] * len(watched)
    assert watched[-1]["status"] == "completed" and watched[-1]["progress"]["documents"] == len(PASSAGES)
    shown = [(event["status"], event["progress"]["documents"]) for event in watched]
    assert shown == sorted(set(shown), key=lambda s: (FINAL_ORDER.index(s[0]), s[1]))  # each change once, in order
    done = wait_final(http, gateway.base_url, accepted.headers["location"])
    assert (done["status"], done["progress"]) == ("completed", {"documents": len(PASSAGES), "total": len(PASSAGES)})
    assert watch_events(http, gateway.base_url + accepted.headers["location"] + "/events") == [done]  # ended: once

    collection = http.get(url(gateway, "/kept")).json()
    assert (collection["model_revision"], collection["documents"], collection["reindex_task"]) == (
        served["model_revision"],
        len(PASSAGES),
        None,
    )
    assert search(http, gateway, "kept", query="pancake recipe", top_k=1).json()["data"][0]["id"] == "eggs"
    found = search(http, gateway, "kept", query="a sleeping pet", top_k=len(PASSAGES)).json()["data"]
    assert sorted(hit["id"] for hit in found) == sorted(p["id"] for p in PASSAGES)
    after = {p["id"]: http.get(url(gateway, f"/kept/documents/{p['id']}")).json() for p in PASSAGES}
    assert after == before  # texts, metadata and timestamps are the documents' own, untouched
    assert upsert(http, gateway, "kept", PASSAGES[:1]).status_code == 200

    assert http.get(url(gateway, f"/kept/reindex/{task['id']}x")).status_code == 404
    assert http.get(url(gateway, f"/kept/reindex/{task['id']}x/events")).status_code == 404
    assert http.get(url(gateway, f"/other/reindex/{task['id']}/events")).status_code == 404
    assert http.get(url(gateway, f"/other/reindex/{task['id']}")).status_code == 404
    assert http.post(url(gateway, "/nothing/reindex")).status_code == 404


async def test_a_collection_on_milvus_is_reindexed_the_same_way(
    milvus_server: MilvusStandalone,  # noqa: F811
    triton: TritonProcess,
    gateway_factory: Callable[..., RunningGateway],
    http: httpx.Client,
    tmp_path: Path,
) -> None:
    settings = SearchSettings(milvus_uri=milvus_server.uri, path=str(tmp_path / "search"))
    first = gateway_factory(triton.grpc_url, search=settings)
    served = create(http, first, "re_milvus")
    assert upsert(http, first, "re_milvus", PASSAGES).status_code == 200
    first.stop()
    await age_milvus_revision(milvus_server.uri, "re_milvus")

    gateway = gateway_factory(triton.grpc_url, search=settings)
    assert "POST /v1/collections/re_milvus/reindex" in error(search(http, gateway, "re_milvus", query="pancake"), 409)
    accepted = http.post(url(gateway, "/re_milvus/reindex"))
    assert accepted.status_code == 202, accepted.text
    assert wait_final(http, gateway.base_url, accepted.headers["location"])["status"] == "completed"
    collection = http.get(url(gateway, "/re_milvus")).json()
    assert (collection["model_revision"], collection["documents"]) == (served["model_revision"], len(PASSAGES))
    assert search(http, gateway, "re_milvus", query="pancake recipe", top_k=1).json()["data"][0]["id"] == "eggs"
    assert http.delete(url(gateway, "/re_milvus")).status_code == 200


def test_grpc_reindexes_a_collection_too(
    triton: TritonProcess, gateway_factory: Callable[..., RunningGateway], http: httpx.Client, tmp_path: Path
) -> None:
    settings = SearchSettings(path=str(tmp_path / "search"))
    first = gateway_factory(triton.grpc_url, search=settings)
    create(http, first, "g")
    assert upsert(http, first, "g", PASSAGES).status_code == 200
    first.stop()
    age_revision(tmp_path / "search", "g")
    gateway = gateway_factory(triton.grpc_url, search=settings)
    with grpc.insecure_channel(gateway.grpc_target) as channel:
        stub = gateway_pb2_grpc.SearchStub(channel)
        with pytest.raises(grpc.RpcError) as stale:
            stub.Search(gateway_pb2.SearchRequest(collection="g", query="pancake", top_k=1))
        assert stale.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "reindex" in str(stale.value.details())
        task = stub.ReindexCollection(gateway_pb2.CollectionRequest(name="g"))
        assert (task.collection, task.total) == ("g", len(PASSAGES))
        watched = list(stub.WatchReindexTask(gateway_pb2.ReindexTaskRequest(collection="g", id=task.id)))
        assert (watched[-1].id, watched[-1].status, watched[-1].documents) == (task.id, "completed", len(PASSAGES))
        with pytest.raises(grpc.RpcError) as unknown:
            list(stub.WatchReindexTask(gateway_pb2.ReindexTaskRequest(collection="g", id="reindex_nope")))
        assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
        while task.status not in FINAL:
            time.sleep(0.05)
            task = stub.GetReindexTask(gateway_pb2.ReindexTaskRequest(collection="g", id=task.id))
        assert (task.status, task.documents) == ("completed", len(PASSAGES))
        found = stub.Search(gateway_pb2.SearchRequest(collection="g", query="pancake batter", top_k=1))
        assert [h.id for h in found.data] == ["eggs"]
