"""Bounded model queues against real Tritons: a call Triton's queue policy refuses answers 429 `overloaded` with
Retry-After (as the gateway's load shedding does), leaves that Triton in rotation, and goes once to another Triton
where there is one; the gateway's own queue refuses what would wait behind more than TRITON_MAX_QUEUE_SECONDS."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from prometheus_client import REGISTRY
from tritonclient.grpc import model_config_pb2 as mc

from export.repository import copy_with_config
from gateway.settings import TritonSettings
from gateway.upstreams.triton import TritonClient, TritonQueueFullError
from localtriton.server import TritonProcess
from tests.helpers.running_gateway import RunningGateway

pytestmark = pytest.mark.slow

CALLS = 12  # concurrent calls of TEXTS each: far more than a one-request queue holds while a batch runs
TEXTS = 32


def one_request_queue(config: mc.ModelConfig) -> None:
    config.dynamic_batching.default_queue_policy.max_queue_size = 1


@pytest.fixture(scope="module")
def narrow_triton(
    minilm_repository: Path, triton_factory: Callable[[Path], TritonProcess], tmp_path_factory: pytest.TempPathFactory
) -> TritonProcess:
    """A Triton whose `bge_onnx` queue holds one request."""
    return triton_factory(copy_with_config(minilm_repository, tmp_path_factory.mktemp("narrow") / "repo",
                                           one_request_queue))  # fmt: skip


async def flood(client: TritonClient) -> list[BaseException | None]:
    async def one(n: int) -> BaseException | None:
        try:
            result = await client.embed([f"call {n} text {i}: " + "words to encode " * 20 for i in range(TEXTS)])
        except Exception as exc:
            return exc
        assert result.vectors.shape == (TEXTS, 384)
        return None

    return await asyncio.gather(*(one(n) for n in range(CALLS)))


def sample(name: str, labels: dict[str, str] | None = None) -> float:
    """This process's own sample (the clients and gateways here run in it)."""
    return REGISTRY.get_sample_value(name, labels or {}) or 0.0


def rejections(queue: str) -> float:
    return sample("gateway_model_queue_rejections_total", {"queue": queue})


async def test_a_full_triton_queue_is_an_overload_answer_not_an_outage(narrow_triton: TritonProcess) -> None:
    before = rejections("triton")
    async with TritonClient(TritonSettings(url=narrow_triton.grpc_url, timeout_seconds=30)) as client:
        outcomes = await flood(client)
        refused = [o for o in outcomes if o is not None]
        assert refused, "a one-request queue refused none of the flood"
        assert all(isinstance(o, TritonQueueFullError) for o in refused), refused
        error = refused[0]
        assert isinstance(error, TritonQueueFullError)
        assert (error.status_code, error.code, error.headers) == (429, "overloaded", {"Retry-After": "1"})
        assert rejections("triton") - before == len(refused)
        # Still in rotation: the next call is served at once, with no outage to wait out.
        assert sample("gateway_triton_addresses", {"state": "serving"}) >= 1
        assert (await client.embed(["after the flood"])).vectors.shape == (1, 384)


async def test_a_refused_call_goes_once_to_another_triton(narrow_triton: TritonProcess, triton: TritonProcess) -> None:
    retries = sample("gateway_triton_retries_total")
    settings = TritonSettings(url=f"ipv4:{narrow_triton.grpc_url},{triton.grpc_url}", timeout_seconds=30)
    async with TritonClient(settings) as client:
        outcomes = await flood(client)
    assert outcomes == [None] * CALLS, "every refused call was served by the other Triton"
    assert sample("gateway_triton_retries_total") > retries


def test_the_gateway_refuses_at_once_what_would_wait_past_its_queue_bound(
    gateway_factory: Callable[..., RunningGateway], triton: TritonProcess
) -> None:
    """A bound below one call's encoding: while a bulk request runs, further texts are refused with 429 and
    Retry-After at once, and none of them reach Triton."""
    gateway = gateway_factory(triton.grpc_url, triton=TritonSettings(url=triton.grpc_url, max_queue_seconds=0.05))
    texts = [f"bulk text {i}: " + "words to encode " * 30 for i in range(256)]
    with httpx.Client(base_url=gateway.base_url, timeout=60) as http:
        assert http.post("/v1/embeddings", json={"input": texts[:8], "model": "bge"}).status_code == 200  # paced

        def post(body: dict[str, object]) -> httpx.Response:
            return http.post("/v1/embeddings", json=body)

        async def bulk_then_single() -> tuple[httpx.Response, httpx.Response]:
            running = asyncio.create_task(asyncio.to_thread(post, {"input": texts, "model": "bge"}))
            await asyncio.sleep(0.05)  # the bulk call is in flight
            behind = await asyncio.to_thread(post, {"input": ["one text more"], "model": "bge"})
            return await running, behind

        before = rejections("gateway")
        bulk, behind = asyncio.run(bulk_then_single())
    assert bulk.status_code == 200
    assert behind.status_code == 429, behind.text
    assert behind.json()["error"]["code"] == "overloaded"
    assert int(behind.headers["Retry-After"]) >= 1
    assert rejections("gateway") == before + 1
