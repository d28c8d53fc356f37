"""CoalescingEmbedder: no delay when quiet, merged calls when busy, one caller's error stays its own."""

from __future__ import annotations

import asyncio
import math

import numpy as np
import pytest

from gateway.errors import InvalidRequestError
from gateway.services.coalescing import CoalescingEmbedder, EmbeddingQueueFullError, EncoderPace, overlap_from
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


async def test_quiet_calls_go_straight_through_and_busy_ones_are_merged() -> None:
    inner = SlowEmbedder()
    quiet = CoalescingEmbedder(inner, max_in_flight=1)
    assert (await quiet.embed(["a"])).vectors.tolist() == [[1.0, 1.0]]
    # a fresh coalescer has timed no call yet: nothing overlaps, what waits is merged
    embedder = CoalescingEmbedder(inner, max_in_flight=1, max_texts=4)
    texts = [["x" * n] for n in range(1, 7)] + [["yy", "zzz"]]
    results = await asyncio.gather(*(embedder.embed(t) for t in texts))
    for sent, result in zip(texts, results, strict=True):
        assert result.vectors[:, 0].tolist() == [float(len(t)) for t in sent]
        assert result.token_counts.tolist() == [len(t) for t in sent]
    # the first goes alone; the rest wait for the slot and go 4 texts at most per call, requests whole
    assert [len(call) for call in inner.calls] == [1, 1, 4, 3]
    assert inner.calls[1] == ["x"] and inner.calls[2] == ["xx", "xxx", "xxxx", "xxxxx"]


async def test_merged_calls_hold_up_to_the_models_max_batch_size_by_default() -> None:
    class SmallBatches(SlowEmbedder):
        async def model_info(self, *, refresh: bool = False) -> ModelInfo:
            return ModelInfo(name="m", revision="r", max_batch_size=3, max_sequence_length=512, dimension=2)

    inner = SmallBatches()
    embedder = CoalescingEmbedder(inner, max_in_flight=1)
    texts = [["x" * n] for n in range(1, 9)]
    results = await asyncio.gather(*(embedder.embed(t) for t in texts))
    assert [r.vectors[0, 0] for r in results] == [float(n) for n in range(1, 9)]
    # one alone, then what waited, in calls of the model's 3 texts: one Triton batch each
    assert [len(call) for call in inner.calls] == [1, 3, 3, 1]


def test_the_encoder_pace_is_an_ewma_of_service_times() -> None:
    pace = EncoderPace(weight=0.5)
    assert pace.seconds_per_text is None
    pace.observe(4, started=0.0, ended=0.4)
    assert pace.seconds_per_text == pytest.approx(0.1)
    # sent at 0.2 beside the first, it waited in Triton until 0.4: 2 texts served in 0.4 s, 0.2 s each
    pace.observe(2, started=0.2, ended=0.8)
    assert pace.seconds_per_text == pytest.approx(0.1 + 0.5 * (0.2 - 0.1))
    pace.observe(0, started=1.0, ended=1.1)  # nothing to learn from
    assert pace.seconds_per_text == pytest.approx(0.15)
    with pytest.raises(ValueError, match="weight"):
        EncoderPace(weight=0)


def test_waiting_texts_overlap_at_once_when_as_many_as_running_else_when_one_text_is_left() -> None:
    assert overlap_from(3, running_texts=8, served_since=10.0, seconds_per_text=None) == math.inf  # not timed yet
    assert overlap_from(0, running_texts=8, served_since=10.0, seconds_per_text=0.1) == math.inf
    assert overlap_from(30, running_texts=8, served_since=10.0, seconds_per_text=None) == math.inf
    # 8 texts whose encoding began at 10.0 end at 10.8: fewer than 8 waiting go at 10.7, when one text is left
    assert overlap_from(3, running_texts=8, served_since=10.0, seconds_per_text=0.1) == pytest.approx(10.7)
    assert overlap_from(7, running_texts=8, served_since=10.0, seconds_per_text=0.1) == pytest.approx(10.7)
    # a slower encoder (or a bigger model) lets the texts gather for longer
    assert overlap_from(3, running_texts=8, served_since=10.0, seconds_per_text=0.2) == pytest.approx(11.4)
    # as many as the running call carries, or more: at once, whatever the pace says
    assert overlap_from(8, running_texts=8, served_since=10.0, seconds_per_text=0.1) == pytest.approx(10.0)
    assert overlap_from(30, running_texts=8, served_since=10.0, seconds_per_text=0.2) == pytest.approx(10.0)
    assert overlap_from(1, running_texts=1, served_since=10.0, seconds_per_text=0.1) == pytest.approx(10.0)


def test_a_call_queued_behind_another_is_encoded_from_when_that_one_ended() -> None:
    pace = EncoderPace()
    pace.observe(4, started=0.0, ended=0.4)
    assert pace.served_from(0.2) == 0.4 and pace.served_from(0.5) == 0.5


async def running_call_of_four(inner: SlowEmbedder) -> tuple[CoalescingEmbedder, asyncio.Task[TritonEmbeddings]]:
    """A coalescer that has timed a call at 0.1 s per text (`inner` takes 0.4 s a call), with a call of four
    texts running that ends 0.4 s from now: texts that wait beside it go when one text's encoding is left."""
    embedder = CoalescingEmbedder(inner, max_in_flight=1)
    await embedder.embed(["t1", "t2", "t3", "t4"])
    running = asyncio.create_task(embedder.embed(["r1", "r2", "r3", "r4"]))
    await asyncio.sleep(0)
    return embedder, running


async def test_one_call_more_goes_when_the_waiting_texts_are_worth_it() -> None:
    inner = SlowEmbedder(seconds=0.4)
    embedder, running = await running_call_of_four(inner)
    waiting = asyncio.create_task(embedder.embed(["w1"]))  # it goes when one text is left: 0.3 s from now
    await asyncio.sleep(0.15)
    assert len(inner.calls) == 2 and not running.done()
    await asyncio.sleep(0.2)
    assert inner.calls[2] == ["w1"] and not running.done()  # sent while the running call still runs
    later = [asyncio.create_task(embedder.embed([t])) for t in ("a", "b", "c", "d")]
    await asyncio.sleep(0.01)
    assert len(inner.calls) == 3  # never more than one call beyond max_in_flight
    await asyncio.gather(running, waiting, *later)
    # beside the running call of one text, the overlapping call takes half of the five texts (rounded up)
    assert inner.calls[3:] == [["a", "b", "c"], ["d"]]


async def test_an_overlapping_call_takes_up_to_twice_the_running_call() -> None:
    inner = SlowEmbedder(seconds=0.4)
    embedder, running = await running_call_of_four(inner)
    three = asyncio.create_task(embedder.embed(["w1", "w2", "w3"]))  # goes 0.3 s from now
    await asyncio.sleep(0.35)
    assert inner.calls[2] == ["w1", "w2", "w3"]
    later = [asyncio.create_task(embedder.embed([t])) for t in ("a", "b", "c", "d", "e")]
    await asyncio.gather(running, three, *later)
    # beside the call of three, all five go: half of the eight would leave one text for a call of its own
    assert inner.calls[3:] == [["a", "b", "c", "d", "e"]]


async def test_one_call_more_goes_at_once_when_as_many_texts_wait_as_the_running_call_carries() -> None:
    inner = SlowEmbedder(seconds=0.8)
    embedder = CoalescingEmbedder(inner, max_in_flight=1)
    await embedder.embed(["t1", "t2", "t3", "t4"])  # timed: 0.2 s per text
    running = asyncio.create_task(embedder.embed(["r1", "r2"]))  # ends 0.8 s from now
    await asyncio.sleep(0)
    first = asyncio.create_task(embedder.embed(["w1"]))
    await asyncio.sleep(0.01)
    assert len(inner.calls) == 2  # one text waits beside a call of two: not yet (one text is left at 0.2 s)
    second = asyncio.create_task(embedder.embed(["w2"]))
    await asyncio.sleep(0.01)
    assert inner.calls[2] == ["w1", "w2"] and not running.done()  # two wait: they go together, at once
    await asyncio.gather(running, first, second)


async def test_a_bad_text_fails_only_its_own_request() -> None:
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


async def test_a_caller_that_goes_away_does_not_disturb_the_others() -> None:
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


def test_limits_must_be_positive() -> None:
    with pytest.raises(ValueError, match=">= 1"):
        CoalescingEmbedder(SlowEmbedder(), max_in_flight=0)


async def test_texts_that_would_wait_past_the_queue_bound_are_refused_at_once() -> None:
    inner = SlowEmbedder(seconds=0.1)  # each call 0.1 s whatever its size: one text learns 0.1 s per text
    embedder = CoalescingEmbedder(inner, max_in_flight=1, max_queue_seconds=0.24, pace=EncoderPace(weight=1.0))
    await embedder.embed(["a"])
    first = asyncio.create_task(embedder.embed(["b"]))  # goes at once
    await asyncio.sleep(0)
    overlapping = asyncio.create_task(embedder.embed(["c"]))  # as many waiting as running: goes beside it
    await asyncio.sleep(0)
    queued = asyncio.create_task(embedder.embed(["d"]))  # about 0.2 s of encoding ahead: waits
    await asyncio.sleep(0)
    assert embedder.wait_ahead() == pytest.approx(0.3, abs=0.02)
    with pytest.raises(EmbeddingQueueFullError) as refused:  # 0.3 s ahead of it: refused with no call made
        await embedder.embed(["e"])
    assert (refused.value.status_code, refused.value.code) == (429, "overloaded")
    assert refused.value.headers == {"Retry-After": "1"}
    assert [r.vectors[0, 0] for r in await asyncio.gather(first, overlapping, queued)] == [1.0, 1.0, 1.0]
    assert ["e"] not in inner.calls
    assert (await embedder.embed(["f"])).vectors[0, 0] == 1.0  # the queue drained: served again


async def test_only_calls_that_succeed_time_the_encoders_pace() -> None:
    pace = EncoderPace(weight=1.0)
    embedder = CoalescingEmbedder(SlowEmbedder(seconds=0.05), max_in_flight=1, pace=pace)
    with pytest.raises(InvalidRequestError):
        await embedder.embed(["bad"])  # refused after 0.05 s: says nothing of the encoder's pace
    cancelled = asyncio.create_task(embedder.embed(["gone"]))
    await asyncio.sleep(0.01)
    cancelled.cancel()
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    assert pace.seconds_per_text is None and embedder.wait_ahead() == 0.0
    running = asyncio.create_task(embedder.embed(["warm"]))
    await asyncio.sleep(0)
    merged = [asyncio.create_task(embedder.embed([t])) for t in ("bad 1", "bad 2")]  # a merged call that fails
    await asyncio.gather(running, *merged, return_exceptions=True)
    assert pace.seconds_per_text == pytest.approx(0.05, abs=0.02)  # the one served call alone


async def test_callers_that_went_away_do_not_count_against_the_queue_bound() -> None:
    inner = SlowEmbedder(seconds=0.2)
    embedder = CoalescingEmbedder(inner, max_in_flight=1, max_queue_seconds=0.25, pace=EncoderPace(weight=1.0))
    await embedder.embed(["t1", "t2", "t3", "t4"])  # 0.05 s per text
    running = asyncio.create_task(embedder.embed(["r1", "r2", "r3", "r4"]))  # 0.2 s of encoding left
    await asyncio.sleep(0)
    leaving = asyncio.create_task(embedder.embed(["w1", "w2"]))  # fewer than the running call: waits
    await asyncio.sleep(0)
    assert embedder.wait_ahead() == pytest.approx(0.3, abs=0.01)
    leaving.cancel()
    await asyncio.sleep(0)
    assert embedder.wait_ahead() == pytest.approx(0.2, abs=0.01)
    staying = asyncio.create_task(embedder.embed(["s"]))  # 0.2 s ahead of it, not 0.3: queued, not refused
    assert (await staying).vectors[0, 0] == 1.0
    await running


async def test_callers_that_await_the_model_info_together_are_judged_one_after_another() -> None:
    class SlowInfo(SlowEmbedder):
        async def model_info(self, *, refresh: bool = False) -> ModelInfo:
            await asyncio.sleep(0.01)  # a re-read of the model's config
            return INFO

    pace = EncoderPace(weight=1.0)
    embedder = CoalescingEmbedder(SlowInfo(seconds=0.2), max_in_flight=1, max_queue_seconds=0.275, pace=pace)
    await embedder.embed(["t1", "t2", "t3", "t4"])  # 0.05 s per text
    running = asyncio.create_task(embedder.embed(["r1", "r2", "r3", "r4"]))  # 0.2 s of encoding left
    await asyncio.sleep(0)
    results = await asyncio.gather(*(embedder.embed([t]) for t in "abcd"), return_exceptions=True)
    # about 0.2 s, then 0.25 s ahead of the first two; 0.3 s and more ahead of the others
    assert [isinstance(r, EmbeddingQueueFullError) for r in results] == [False, False, True, True]
    await running
