"""TritonClient's calls against tritonclient's side of two Tritons: a full queue is retried only on a Triton in
rotation and stays a 429, counted once; a request's chunks are all or nothing; the reranker's info is read by one
request at a time and kept through a brief outage."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from prometheus_client import REGISTRY
from tritonclient.utils import InferenceServerException

from gateway.settings import TritonSettings
from gateway.upstreams import triton_reranker
from gateway.upstreams.triton import TritonClient, TritonQueueFullError, TritonUnavailableError
from gateway.upstreams.triton_reranker import TritonReranker

A, B = "10.0.0.1:8001", "10.0.0.2:8001"


class FakeTriton:
    """tritonclient's side of one Triton. `answer`: "ok", "full" (its model queue refuses) or "stopping"."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.answer = "ok"
        self.calls = 0
        self.config_reads = 0
        self.infers: list[tuple[float, str]] = []  # per inference, in order: (seconds, answer); past it: at once, ok
        self.infer_calls = 0
        self.cancelled = 0

    def _answered(self, answer: str) -> None:
        self.calls += 1
        if answer == "full":
            raise InferenceServerException("Exceeds maximum queue size", status="StatusCode.UNAVAILABLE")
        if answer == "stopping":
            raise InferenceServerException("Server is stopping", status="StatusCode.UNAVAILABLE")

    async def work(self) -> str:
        self._answered(self.answer)
        return self.address

    async def get_model_config(self, model: str, client_timeout: float) -> Any:
        self.config_reads += 1
        await asyncio.sleep(0.01)
        self._answered(self.answer)
        output = SimpleNamespace(name="EMBEDDING", dims=[-1, 2])
        return SimpleNamespace(config=SimpleNamespace(name=model, max_batch_size=2, parameters={}, output=[output]))

    async def infer(self, model: str, inputs: list[Any], **options: Any) -> Any:
        turn, self.infer_calls = self.infer_calls, self.infer_calls + 1
        seconds, answer = self.infers[turn] if turn < len(self.infers) else (0.0, "ok")
        try:
            await asyncio.sleep(seconds)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        self._answered(answer)
        rows = inputs[-1].shape()[0]
        outputs = {"EMBEDDING": np.full((rows, 2), turn), "SCORE": np.full(rows, turn)}
        return SimpleNamespace(as_numpy=lambda name: outputs.get(name, np.zeros(rows)))

    async def is_model_ready(self, model: str) -> bool:
        return self.answer == "ok"

    async def close(self) -> None:
        pass


@pytest.fixture
async def tritons() -> AsyncIterator[tuple[TritonClient, FakeTriton, FakeTriton]]:
    fakes = {A: FakeTriton(A), B: FakeTriton(B)}
    client = TritonClient(TritonSettings(url=f"ipv4:{A},{B}"), lambda address: fakes[address])  # type: ignore[arg-type,return-value]
    yield client, fakes[A], fakes[B]
    await client.aclose()


def rejections() -> float:
    return REGISTRY.get_sample_value("gateway_model_queue_rejections_total", {"queue": "triton"}) or 0.0


async def work(client: TritonClient) -> Any:
    return await client.call(lambda c, seconds: c.work(), 5.0)


async def test_a_full_queue_is_not_retried_on_a_triton_out_of_rotation(
    tritons: tuple[TritonClient, FakeTriton, FakeTriton],
) -> None:
    client, a, b = tritons
    b.answer = "stopping"
    assert [await work(client), await work(client)] == [A, A]  # B failed the second, which A then served
    a.answer, calls_to_b = "full", b.calls
    before = rejections()
    with pytest.raises(TritonQueueFullError):  # not B's "unavailable": a 503 for what is overload
        await work(client)
    assert b.calls == calls_to_b and rejections() == before + 1


async def test_a_full_queue_whose_retry_finds_the_other_triton_gone_stays_a_full_queue(
    tritons: tuple[TritonClient, FakeTriton, FakeTriton],
) -> None:
    client, a, b = tritons
    a.answer, b.answer = "full", "stopping"
    with pytest.raises(TritonQueueFullError):
        await work(client)
    assert (a.calls, b.calls) == (1, 1)


async def test_a_refusal_is_counted_once_and_only_when_the_caller_gets_it(
    tritons: tuple[TritonClient, FakeTriton, FakeTriton],
) -> None:
    client, a, b = tritons
    a.answer = "full"
    before = rejections()
    assert await work(client) == B  # A refused, B served: no refusal reached the caller
    assert rejections() == before
    b.answer = "full"
    with pytest.raises(TritonQueueFullError):
        await work(client)  # refused by both: one refusal
    assert rejections() == before + 1


async def test_chunks_come_back_in_order_and_one_failure_cancels_the_others() -> None:
    fake = FakeTriton(A)
    client = TritonClient(TritonSettings(url=A), lambda address: fake)  # type: ignore[arg-type,return-value]
    fake.infers = [(0.02, "ok")]  # the first chunk ends last
    served = await client.embed(["a", "b", "c"])  # in chunks of 2 and 1
    assert served.vectors[:, 0].tolist() == [0.0, 0.0, 1.0]
    fake.infers, fake.infer_calls = [(10.0, "ok"), (0.01, "full")], 0
    with pytest.raises(TritonQueueFullError):  # itself, not an ExceptionGroup: the client gets its 429
        await client.embed(["a", "b", "c"])
    assert fake.cancelled == 1, "the first chunk's call was cancelled, not left to load Triton"
    await client.aclose()


async def test_rerank_chunks_are_all_or_nothing() -> None:
    fake = FakeTriton(A)
    client = TritonClient(TritonSettings(url=A), lambda address: fake)  # type: ignore[arg-type,return-value]
    fake.infers = [(10.0, "ok"), (0.01, "full")]
    with pytest.raises(TritonQueueFullError):
        await TritonReranker(client, TritonSettings(url=A)).rerank("q", ["d1", "d2", "d3"])
    assert fake.cancelled == 1
    await client.aclose()


async def test_the_reranker_info_is_read_by_one_request_and_kept_through_an_outage(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(triton_reranker, "INFO_SECONDS", 0.05)
    fake = FakeTriton(A)
    client = TritonClient(TritonSettings(url=A), lambda address: fake)  # type: ignore[arg-type,return-value]
    reranker = TritonReranker(client, TritonSettings(url=A))
    info = await reranker.reranker_info()
    await asyncio.sleep(0.06)
    assert await asyncio.gather(*(reranker.reranker_info() for _ in range(5))) == [info] * 5
    assert fake.config_reads == 2, "one re-read for the five requests"
    await asyncio.sleep(0.06)
    fake.answer = "stopping"
    assert await reranker.reranker_info() == info  # Triton unreachable at the re-read: the last info is answered
    with pytest.raises(TritonUnavailableError):
        await TritonReranker(client, TritonSettings(url=A)).reranker_info()  # nothing known yet: the error
    await client.aclose()
