"""The embedding cache end to end, with the in-process store and with a real Redis."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import SecretStr
from tritonclient.grpc import model_config_pb2 as mc

from export.repository import copy_with_config
from gateway.settings import CacheSettings, RedisSettings
from localtriton.server import TritonProcess
from tests.helpers.redis_fixtures import RedisServer
from tests.helpers.running_gateway import RunningGateway
from tests.helpers.sentences import mixed_texts
from tests.helpers.triton_embeddings import triton_requests

pytestmark = pytest.mark.slow


@pytest.fixture(params=["memory", "redis"])
def cache(request: pytest.FixtureRequest) -> dict[str, Any]:
    """The gateway's settings for an embedding cache in process memory or in Redis."""
    if request.param == "memory":
        return {"cache": CacheSettings(embedding_cache_mb=16)}
    return {"redis": RedisSettings(url=SecretStr(request.getfixturevalue("redis_url")))}


def embed(http: httpx.Client, gateway: RunningGateway, texts: list[str], **headers: str) -> httpx.Response:
    response = http.post(f"{gateway.base_url}/v1/embeddings", json={"input": texts}, headers=headers)
    assert response.status_code == 200, response.text
    return response


def test_repeated_request_is_a_hit_without_calling_triton(
    cache: dict[str, Any], triton: TritonProcess, gateway_factory: Callable[..., RunningGateway], http: httpx.Client
) -> None:
    gateway = gateway_factory(triton.grpc_url, **cache)
    texts = mixed_texts(5, tag=f"repeat-{'redis' in cache}")
    first = embed(http, gateway, texts)
    assert (first.headers["x-cache"], first.headers["x-cached-texts"]) == ("miss", "0")
    calls = triton_requests(triton)
    second = embed(http, gateway, texts)
    assert (second.headers["x-cache"], second.headers["x-cached-texts"]) == ("hit", "5")
    assert triton_requests(triton) == calls
    assert second.json()["data"] == first.json()["data"]
    assert second.json()["usage"] == first.json()["usage"]


def test_mixed_batch_makes_one_triton_call_for_the_misses_in_order(
    cache: dict[str, Any], triton: TritonProcess, gateway_factory: Callable[..., RunningGateway], http: httpx.Client
) -> None:
    gateway = gateway_factory(triton.grpc_url, **cache)
    texts = mixed_texts(10, tag=f"mixed-{'redis' in cache}")
    known = embed(http, gateway, texts[::2]).json()["data"]
    calls = triton_requests(triton)
    mixed = embed(http, gateway, texts)
    assert mixed.headers["x-cache"] == "miss" and mixed.headers["x-cached-texts"] == "5"
    assert triton_requests(triton) == calls + 1
    data = mixed.json()["data"]
    assert [item["index"] for item in data] == list(range(10))
    assert [data[i]["embedding"] for i in range(0, 10, 2)] == [item["embedding"] for item in known]


def test_cache_control_no_cache_bypasses_the_cache(
    cache: dict[str, Any], triton: TritonProcess, gateway_factory: Callable[..., RunningGateway], http: httpx.Client
) -> None:
    gateway = gateway_factory(triton.grpc_url, **cache)
    texts = mixed_texts(3, tag=f"bypass-{'redis' in cache}")
    embed(http, gateway, texts)
    calls = triton_requests(triton)
    assert embed(http, gateway, texts, **{"Cache-Control": "no-cache"}).headers["x-cache"] == "miss"
    assert embed(http, gateway, texts, **{"Cache-Control": "max-age=0, No-Cache"}).headers["x-cache"] == "miss"
    assert triton_requests(triton) == calls + 2
    assert embed(http, gateway, texts, **{"Cache-Control": "no-store-ish"}).headers["x-cache"] == "hit"


@pytest.mark.parametrize(
    ("parameter", "value"), [("model_revision", "sha256-0000000000000000"), ("max_sequence_length", "64")]
)
def test_a_new_model_revision_or_token_limit_never_serves_old_vectors(
    parameter: str,
    value: str,
    redis_url: str,
    triton: TritonProcess,
    minilm_repository: Path,
    triton_factory: Callable[..., TritonProcess],
    gateway_factory: Callable[..., RunningGateway],
    http: httpx.Client,
    tmp_path: Path,
) -> None:
    """A text cut at another token limit has another vector and another `truncated` flag."""

    def redeploy(config: mc.ModelConfig) -> None:
        config.parameters[parameter].string_value = value

    redeployed = triton_factory(copy_with_config(minilm_repository, tmp_path / "repo", redeploy, model="bge"))
    shared = RedisSettings(url=SecretStr(redis_url))
    old, new = gateway_factory(triton.grpc_url, redis=shared), gateway_factory(redeployed.grpc_url, redis=shared)
    texts = mixed_texts(4, tag=parameter)
    assert embed(http, old, texts).headers["x-cache"] == "miss"
    assert embed(http, old, texts).headers["x-cache"] == "hit"
    assert embed(http, new, texts).headers["x-cache"] == "miss"


def test_requests_succeed_while_redis_is_down_and_the_cache_comes_back(
    redis_server: RedisServer,
    redis_url: str,
    triton: TritonProcess,
    gateway_factory: Callable[..., RunningGateway],
    http: httpx.Client,
) -> None:
    gateway = gateway_factory(triton.grpc_url, redis=RedisSettings(url=SecretStr(redis_url)))
    texts = mixed_texts(3, tag="outage")
    embed(http, gateway, texts)
    redis_server.stop()
    down = embed(http, gateway, texts)
    assert down.headers["x-cache"] == "miss"
    ready = http.get(f"{gateway.base_url}/readyz").json()
    # the cache serves without Redis; video tasks (stored there too) are unavailable; neither makes it unready
    checks = {"triton": "ok", "cache": "degraded", "tasks": "unavailable", "redis": "degraded", "search": "ok"}
    assert ready == {"ready": True, "checks": checks}
    assert (
        'gateway_cache_errors_total{cache="embedding",operation="get"}' in http.get(f"{gateway.base_url}/metrics").text
    )
    redis_server.start()
    time.sleep(1.5)  # past the store's back-off after a failure
    embed(http, gateway, texts)
    assert embed(http, gateway, texts).headers["x-cache"] == "hit"
