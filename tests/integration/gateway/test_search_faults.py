"""Semantic search when parts fail, and on Milvus: Triton down (a cached query is still served), the store down
(503 naming it, the rest of the gateway working, /readyz `search: degraded`), and the query instruction the
export records, read from Triton's model config."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest
from tritonclient.grpc import model_config_pb2 as mc

from export.repository import ENSEMBLE, copy_with_config
from gateway.grpc.pb.gateway.v1 import gateway_pb2, gateway_pb2_grpc
from gateway.settings import CacheSettings, SearchSettings
from localtriton.ports import free_port
from localtriton.server import TritonProcess
from tests.helpers.milvus_fixtures import MilvusStandalone, milvus_server  # noqa: F401 (a fixture)
from tests.helpers.running_gateway import RunningGateway
from tests.integration.gateway.test_search_rest import PASSAGES, create, error, search, upsert

pytestmark = pytest.mark.slow

INSTRUCTION = "query: "


def with_instruction(config: mc.ModelConfig) -> None:
    config.parameters["query_instruction"].string_value = INSTRUCTION


def embedding(http: httpx.Client, gateway: RunningGateway, text: str, input_type: str) -> np.ndarray:
    response = http.post(f"{gateway.base_url}/v1/embeddings", json={"input": text, "input_type": input_type})
    assert response.status_code == 200, response.text
    return np.array(response.json()["data"][0]["embedding"], dtype=np.float32)


def test_queries_get_the_model_instruction_and_a_cached_query_outlives_triton(
    minilm_repository: Path,
    triton_factory: Callable[[Path], TritonProcess],
    gateway_factory: Callable[..., RunningGateway],
    http: httpx.Client,
    tmp_path: Path,
) -> None:
    repository = copy_with_config(minilm_repository, tmp_path / "repo", with_instruction, model=ENSEMBLE)
    triton = triton_factory(repository)
    gateway = gateway_factory(triton.grpc_url, cache=CacheSettings(embedding_cache_mb=16))
    as_query = embedding(http, gateway, "where is the station", "query")
    prefixed = embedding(http, gateway, INSTRUCTION + "where is the station", "document")
    assert np.allclose(as_query, prefixed, atol=1e-6)
    assert not np.allclose(as_query, embedding(http, gateway, "where is the station", "document"), atol=1e-3)
    with grpc.insecure_channel(gateway.grpc_target) as channel:
        stub = gateway_pb2_grpc.EmbeddingsStub(channel)
        over_grpc = stub.Embed(gateway_pb2.EmbedRequest(input=["where is the station"], input_type="query"))
        assert np.allclose(np.array(over_grpc.data[0].embedding, dtype=np.float32), as_query, atol=1e-6)
        with pytest.raises(grpc.RpcError) as bad:
            stub.Embed(gateway_pb2.EmbedRequest(input=["x"], input_type="question"))
        assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT

    create(http, gateway, "served")
    assert upsert(http, gateway, "served", PASSAGES).status_code == 200
    before = search(http, gateway, "served", query="how to change my password")
    assert before.json()["data"][0]["id"] == "password"

    triton.stop()
    after = search(http, gateway, "served", query="how to change my password")
    assert after.status_code == 200 and after.json()["data"] == before.json()["data"]
    error(search(http, gateway, "served", query="a query never seen"), 503)
    error(upsert(http, gateway, "served", [{"id": "new", "text": "a text never seen"}]), 503)
    assert http.get(f"{gateway.base_url}/v1/collections/served").json()["documents"] == len(PASSAGES)
    ready = http.get(f"{gateway.base_url}/readyz")  # still ready: without Triton only uncached embeddings fail
    checks = ready.json()["checks"]
    assert ready.status_code == 200 and checks["triton"] == "degraded" and checks["search"] == "ok"


@pytest.mark.parametrize("store", ["milvus", "embedded"])
def test_a_store_that_is_down_answers_503_naming_it_and_the_rest_works(
    store: str,
    triton: TritonProcess,
    gateway_factory: Callable[..., RunningGateway],
    http: httpx.Client,
    tmp_path: Path,
) -> None:
    if store == "milvus":
        settings = SearchSettings(milvus_uri=f"http://127.0.0.1:{free_port()}", timeout_seconds=1)
    else:
        (tmp_path / "not-a-folder").write_text("")  # the store cannot make its folder here
        settings = SearchSettings(path=str(tmp_path / "not-a-folder"))
    gateway = gateway_factory(triton.grpc_url, search=settings)
    refused = http.post(f"{gateway.base_url}/v1/collections", json={"name": "down"})
    assert f"search store ({store})" in error(refused, 503)
    assert refused.json()["error"]["code"] == "search_store_unavailable"
    assert f"search store ({store})" in error(http.get(f"{gateway.base_url}/v1/collections"), 503)
    assert http.post(f"{gateway.base_url}/v1/embeddings", json={"input": "still here"}).status_code == 200
    ready = http.get(f"{gateway.base_url}/readyz")
    assert ready.status_code == 200 and ready.json()["checks"]["search"] == "degraded"


def test_the_gateway_on_milvus_serves_the_same_api(
    milvus_server: MilvusStandalone,  # noqa: F811
    triton: TritonProcess,
    gateway_factory: Callable[..., RunningGateway],
    http: httpx.Client,
) -> None:
    gateway = gateway_factory(triton.grpc_url, search=SearchSettings(milvus_uri=milvus_server.uri))
    create(http, gateway, "on-milvus_1")
    assert "already exists" in error(http.post(f"{gateway.base_url}/v1/collections", json={"name": "on-milvus_1"}), 409)
    assert upsert(http, gateway, "on-milvus_1", PASSAGES).status_code == 200
    found = search(http, gateway, "on-milvus_1", query="I forgot my login password", top_k=2).json()["data"]
    assert found[0]["id"] == "password" and found[0]["metadata"] == {"topic": "account"}
    injected = search(http, gateway, "on-milvus_1", query="password", filter={"topic": 'x" or 1==1 or "'})
    assert injected.status_code == 200 and injected.json()["data"] == []
    assert http.get(f"{gateway.base_url}/v1/collections/on-milvus_1/documents/a/b c").json()["metadata"] == {"ok": True}
    assert http.get(f"{gateway.base_url}/v1/collections/on-milvus_1").json()["documents"] == len(PASSAGES)
    assert http.delete(f"{gateway.base_url}/v1/collections/on-milvus_1").json()["deleted"] is True
    ready = http.get(f"{gateway.base_url}/readyz")
    assert ready.json()["checks"]["search"] == "ok"
