"""`EmbeddingService`'s single flight (`CallerLedFlight`): concurrent requests share the calls of the texts they
have in common; the first caller makes each call, and when it goes away its followers make it themselves."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

import numpy as np
import pytest

from gateway.services.embeddings import EmbeddingService
from gateway.services.single_flight import CallerLedFlight
from gateway.settings import LimitSettings
from gateway.upstreams.triton import ModelInfo, TritonEmbeddings

DIMENSIONS = 4


class HeldEmbedder:
    """An upstream whose calls wait for `release()` (or fail then); records the texts of every call."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.calls: list[list[str]] = []
        self.released = asyncio.Event()

    async def model_info(self, *, refresh: bool = False) -> ModelInfo:
        return ModelInfo(name="m", revision="r", max_batch_size=64, max_sequence_length=16, dimension=DIMENSIONS)

    async def ready(self) -> bool:
        return True

    async def embed(self, texts: list[str]) -> TritonEmbeddings:
        self.calls.append(list(texts))
        await self.released.wait()
        if self.fail:
            raise RuntimeError("upstream failed")
        rows = np.array([[len(text), 0, 0, 0] for text in texts], dtype=np.float32)
        ones, cut = np.ones(len(texts), np.int32), np.zeros(len(texts), np.bool_)
        return TritonEmbeddings(vectors=rows, token_counts=ones, truncated=cut)


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def first_column(vectors: Any) -> list[float]:
    return [float(row[0]) for row in vectors]


async def test_concurrent_requests_compute_each_shared_text_once() -> None:
    embedder = HeldEmbedder()
    service = EmbeddingService(embedder, None, LimitSettings())
    first = asyncio.create_task(service.embed(["a", "bb"], use_cache=False))
    await settle()
    second = asyncio.create_task(service.embed(["bb", "ccc"], use_cache=False))
    await settle()
    embedder.released.set()
    results = await asyncio.gather(first, second)
    vectors = [first_column(result.vectors) for result in results]
    assert embedder.calls == [["a", "bb"], ["ccc"]]  # "bb" came from the first request's call
    assert vectors == [[1.0, 2.0], [2.0, 3.0]]


async def test_when_the_first_caller_goes_away_its_followers_make_the_call() -> None:
    embedder = HeldEmbedder()
    service = EmbeddingService(embedder, None, LimitSettings())
    leader = asyncio.create_task(service.embed(["a", "bb"], use_cache=False))
    await settle()
    follower = asyncio.create_task(service.embed(["bb"], use_cache=False))
    await settle()
    leader.cancel()  # its client went away; its call went with it
    await settle()
    embedder.released.set()
    result = await follower
    assert leader.cancelled()
    vectors = first_column(result.vectors)
    assert embedder.calls == [["a", "bb"], ["bb"]]
    assert vectors == [2.0]


async def test_the_followers_get_the_first_callers_error_and_nothing_is_logged_as_never_retrieved() -> None:
    reported: list[dict[str, Any]] = []
    asyncio.get_running_loop().set_exception_handler(lambda _, context: reported.append(context))
    embedder = HeldEmbedder(fail=True)
    service = EmbeddingService(embedder, None, LimitSettings())
    leader = asyncio.create_task(service.embed(["a"], use_cache=False))
    await settle()
    follower = asyncio.create_task(service.embed(["a"], use_cache=False))
    await settle()
    embedder.released.set()
    outcomes = await asyncio.gather(leader, follower, return_exceptions=True)
    alone = CallerLedFlight[str, int]()  # a failing call that nobody followed

    async def fails() -> int:
        raise RuntimeError("alone")

    with pytest.raises(RuntimeError):
        await alone.lead(["k"], fails())
    gc.collect()
    await settle()
    assert [str(outcome) for outcome in outcomes] == ["upstream failed", "upstream failed"]
    assert reported == []
