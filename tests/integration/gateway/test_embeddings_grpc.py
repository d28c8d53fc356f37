"""gateway.v1.Embeddings over gRPC end to end: real gateway, real Triton."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import grpc
import httpx
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gateway.grpc.pb.gateway.v1 import gateway_pb2, gateway_pb2_grpc
from localtriton.server import TritonProcess
from tests.helpers.running_gateway import RunningGateway
from tests.helpers.sentences import mixed_texts
from tests.helpers.triton_embeddings import triton_direct, triton_requests

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("count", [1, 7, 64, 300])
def test_grpc_embeddings_equal_tritons_own_output_in_order(
    count: int, triton_fp32: TritonProcess, gateway_factory: Callable[..., RunningGateway]
) -> None:
    gateway = gateway_factory(triton_fp32.grpc_url)
    texts = mixed_texts(count, tag="grpc")
    with grpc.insecure_channel(gateway.grpc_target) as channel:
        response, call = gateway_pb2_grpc.EmbeddingsStub(channel).Embed.with_call(
            gateway_pb2.EmbedRequest(input=texts, model="bge")
        )
    expected, tokens = triton_direct(triton_fp32, texts)
    assert [item.index for item in response.data] == list(range(count))
    served = np.array([item.embedding for item in response.data], dtype=np.float32)
    cosines = np.sum(served * expected, axis=1) / (np.linalg.norm(served, axis=1) * np.linalg.norm(expected, axis=1))
    assert cosines.min() >= 0.9999
    assert (response.usage.prompt_tokens, response.usage.truncated_texts) == (tokens, 0)
    assert dict(call.trailing_metadata())["x-cache"] == response.cache == "miss"


def test_grpc_errors_and_health(triton: TritonProcess, gateway_factory: Callable[..., RunningGateway]) -> None:
    gateway = gateway_factory(triton.grpc_url)
    with grpc.insecure_channel(gateway.grpc_target) as channel:
        stub = gateway_pb2_grpc.EmbeddingsStub(channel)
        with pytest.raises(grpc.RpcError) as empty:
            stub.Embed(gateway_pb2.EmbedRequest(input=[]))
        assert empty.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "at least one text" in str(empty.value.details())
        with pytest.raises(grpc.RpcError) as too_long:
            stub.Embed(gateway_pb2.EmbedRequest(input=["word " * 2000], truncate=False))
        assert too_long.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "maximum of 512 tokens" in str(too_long.value.details())
        health = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service="gateway.v1.Embeddings")
        )
        assert health.status == health_pb2.HealthCheckResponse.SERVING


async def test_concurrent_identical_misses_are_computed_once(
    triton: TritonProcess, gateway_factory: Callable[..., RunningGateway]
) -> None:
    from gateway.settings import CacheSettings

    gateway = gateway_factory(triton.grpc_url, cache=CacheSettings(embedding_cache_mb=16))
    texts = mixed_texts(32, tag="single-flight")

    before = triton_requests(triton)
    async with httpx.AsyncClient(base_url=gateway.base_url, timeout=60) as client:
        requests = [client.post("/v1/embeddings", json={"input": texts}) for _ in range(8)]
        responses = list(await asyncio.gather(*requests))
    assert all(r.status_code == 200 for r in responses)
    assert triton_requests(triton) - before == 1
    first = responses[0].json()["data"]
    assert all(r.json()["data"] == first for r in responses)


def test_grpc_reports_the_cache_like_the_rest_api(
    triton: TritonProcess, gateway_factory: Callable[..., RunningGateway]
) -> None:
    from gateway.settings import CacheSettings

    gateway = gateway_factory(triton.grpc_url, cache=CacheSettings(embedding_cache_mb=16))
    texts = mixed_texts(4, tag="grpc-cache")
    with grpc.insecure_channel(gateway.grpc_target) as channel:
        embed = gateway_pb2_grpc.EmbeddingsStub(channel).Embed
        outcomes = []
        for batch in (texts[:1], texts, texts):
            response, call = embed.with_call(gateway_pb2.EmbedRequest(input=batch))
            assert dict(call.trailing_metadata())["x-cache"] == response.cache
            outcomes.append((response.cache, response.cached_texts))
    assert outcomes == [("miss", 0), ("miss", 1), ("hit", 4)]
