"""The coalescer's in-flight limit changed while it runs (the GPU policy's throttle): a lowered limit holds new calls
back, running ones finish, a raised one sends what waits at once."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from gateway.services.coalescing import CoalescingEmbedder
from gateway.upstreams.triton import ModelInfo, TritonEmbeddings

INFO = ModelInfo(name="m", revision="r", max_batch_size=64, max_sequence_length=512, dimension=2)


class GatedEmbedder:
    """Each call waits for the gate; counts the calls running at once."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.running = 0
        self.most = 0

    async def model_info(self, *, refresh: bool = False) -> ModelInfo:
        return INFO

    async def ready(self) -> bool:
        return True

    async def embed(self, texts: list[str]) -> TritonEmbeddings:
        self.running += 1
        self.most = max(self.most, self.running)
        await self.gate.wait()
        self.running -= 1
        return TritonEmbeddings(
            np.ones((len(texts), 2), np.float32), np.ones(len(texts), np.int32), np.zeros(len(texts), bool)
        )


async def test_a_lowered_limit_holds_new_calls_back_and_a_raised_one_lets_them_go() -> None:
    inner = GatedEmbedder()
    embedder = CoalescingEmbedder(inner, max_in_flight=4)
    embedder.set_max_in_flight(1)
    first = asyncio.create_task(embedder.embed(["a"]))
    rest = [asyncio.create_task(embedder.embed([t])) for t in "bcd"]
    await asyncio.sleep(0.01)
    assert inner.running == 1, "one call in flight at the lowered limit; the others wait, merged"
    embedder.set_max_in_flight(4)
    await asyncio.sleep(0.01)
    assert inner.running == 2, "the waiting texts went at once, as one merged call"
    inner.gate.set()
    await asyncio.gather(first, *rest)
    assert inner.most == 2


def test_the_limit_is_at_least_one_call() -> None:
    with pytest.raises(ValueError):
        CoalescingEmbedder(GatedEmbedder(), max_in_flight=2).set_max_in_flight(0)
