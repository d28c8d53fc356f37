"""CoalescingEmbedder: no delay when quiet, merged calls when busy, one caller's error stays its own."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from gateway.errors import InvalidRequestError
from gateway.services.coalescing import CoalescingEmbedder
from gateway.upstreams.triton import ModelInfo, TritonEmbeddings

INFO = ModelInfo(name="m", revision="r", max_batch_size=64, max_sequence_length=512, dimension=2)


class SlowEmbedder:
    """Embeds text t as [len(t), 1]; each call takes `seconds`; texts containing "bad" are refused."""

    def __init__(self, seconds: float = 0.05) -> None:
        self.seconds = seconds
        self.calls: list[list[str]] = []

    async def model_info(self, *, refresh: bool = False) -> ModelInfo:
        return INFO

    async def ready(self) -> bool:
        return True

    async def embed(self, texts: list[str]) -> TritonEmbeddings:
        self.calls.append(list(texts))
        await asyncio.sleep(self.seconds)
        if any("bad" in text for text in texts):
            raise InvalidRequestError("bad text")
        vectors = np.array([[len(t), 1.0] for t in texts], dtype=np.float32)
        return TritonEmbeddings(vectors, np.array([len(t) for t in texts], dtype=np.int32), np.zeros(len(texts), bool))


def test_quiet_calls_go_straight_through_and_busy_ones_are_merged() -> None:
    async def scenario() -> None:
        inner = SlowEmbedder()
        embedder = CoalescingEmbedder(inner, max_in_flight=1, max_texts=4)
        assert (await embedder.embed(["a"])).vectors.tolist() == [[1.0, 1.0]]
        texts = [["x" * n] for n in range(1, 7)] + [["yy", "zzz"]]
        results = await asyncio.gather(*(embedder.embed(t) for t in texts))
        for sent, result in zip(texts, results, strict=True):
            assert result.vectors[:, 0].tolist() == [float(len(t)) for t in sent]
            assert result.token_counts.tolist() == [len(t) for t in sent]
        # the first goes alone; the rest wait for the slot and go 4 texts at most per call, requests whole
        assert [len(call) for call in inner.calls] == [1, 1, 4, 3]
        assert inner.calls[1] == ["x"] and inner.calls[2] == ["xx", "xxx", "xxxx", "xxxxx"]

    asyncio.run(scenario())


def test_one_call_more_goes_once_enough_texts_wait() -> None:
    async def scenario() -> None:
        inner = SlowEmbedder(seconds=0.2)
        embedder = CoalescingEmbedder(inner, max_in_flight=1, overlap_texts=3)
        first = asyncio.create_task(embedder.embed(["running"]))
        await asyncio.sleep(0)
        two = [asyncio.create_task(embedder.embed([t])) for t in ("a", "b")]
        await asyncio.sleep(0.05)
        assert len(inner.calls) == 1  # 2 texts waiting: not worth a call of their own
        three = [*two, asyncio.create_task(embedder.embed(["c"]))]
        await asyncio.sleep(0.05)
        assert inner.calls == [["running"], ["a", "b", "c"]]  # sent while the first still runs
        later = [asyncio.create_task(embedder.embed([t])) for t in ("d", "e", "f")]
        await asyncio.sleep(0.05)
        assert len(inner.calls) == 2  # never more than one call beyond max_in_flight
        await asyncio.gather(first, *three, *later)
        assert inner.calls[2] == ["d", "e", "f"]

    asyncio.run(scenario())


def test_a_bad_text_fails_only_its_own_request() -> None:
    async def scenario() -> None:
        inner = SlowEmbedder()
        embedder = CoalescingEmbedder(inner, max_in_flight=1)
        first = asyncio.create_task(embedder.embed(["warm"]))
        await asyncio.sleep(0)
        merged = [embedder.embed(["good"]), embedder.embed(["bad one"]), embedder.embed(["fine"])]
        results = await asyncio.gather(first, *merged, return_exceptions=True)
        assert isinstance(results[2], InvalidRequestError)
        assert [r.vectors[0, 0] for r in (results[1], results[3])] == [4.0, 4.0]  # type: ignore[union-attr]
        assert inner.calls[1] == ["good", "bad one", "fine"]  # merged first, then one by one
        assert sorted(map(tuple, inner.calls[2:])) == [("bad one",), ("fine",), ("good",)]

    asyncio.run(scenario())


def test_a_caller_that_goes_away_does_not_disturb_the_others() -> None:
    async def scenario() -> None:
        inner = SlowEmbedder()
        embedder = CoalescingEmbedder(inner, max_in_flight=1)
        first = asyncio.create_task(embedder.embed(["warm"]))
        await asyncio.sleep(0)
        leaving = asyncio.create_task(embedder.embed(["leaving"]))
        staying = asyncio.create_task(embedder.embed(["staying"]))
        await asyncio.sleep(0)
        leaving.cancel()
        assert (await staying).vectors[0, 0] == 7.0 and (await first).vectors[0, 0] == 4.0
        with pytest.raises(asyncio.CancelledError):
            await leaving
        assert inner.calls[1] == ["staying"]  # the cancelled caller's text was not sent

    asyncio.run(scenario())


def test_limits_must_be_positive() -> None:
    with pytest.raises(ValueError, match=">= 1"):
        CoalescingEmbedder(SlowEmbedder(), max_in_flight=0)
