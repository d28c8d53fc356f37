"""The chat benchmark's arithmetic (added latency, ratios, targets), its SSE reading, its peer config, and
one quick end-to-end run against real simulator and gateway processes."""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from bench.chat import run
from bench.chat.clients import AnswerError, stream_times
from bench.chat.litellm import litellm_config
from bench.chat.loads import Sample
from bench.chat.plan import (
    BARE,
    CACHED,
    GATEWAY,
    LITELLM,
    MODELS,
    PROMPT,
    QUICK,
    SIM_TTFT,
    answer_pieces,
    run_size,
    stream_tps,
)
from bench.chat.report import added_ms, at_least_times, at_most, rows, rps_target, series, streams_target, ttft_targets
from bench.chat.servers import gateway_env
from bench.load import taking_turns
from bench.run_stats import RunStats
from simulators.hunyuan import echo_reply, reasoning_reply, split_pieces, thinks


def stats(*latencies_ms: float, elapsed: float = 1.0) -> RunStats:
    return RunStats(elapsed=elapsed, latencies=[ms / 1000 for ms in latencies_ms])


def test_added_latency_is_the_median_over_rounds_of_percentile_differences() -> None:
    bare = [stats(50, 50, 60), stats(51, 51, 61), stats(49, 49, 59)]
    proxy = [stats(51, 51, 70), stats(55, 55, 62), stats(50, 50, 59)]
    assert added_ms(proxy, bare, 50) == pytest.approx(1.0)  # rounds add 1, 4 and 1 ms
    assert added_ms(proxy, bare, 100) == pytest.approx(1.0)  # rounds add 10, 1 and 0 ms


def test_targets_state_the_measured_value_and_whether_it_is_met() -> None:
    assert at_most("p50", 1.5, 2.0).met and at_most("p50", 1.5, 2.0).measured == "1.50 ms"
    assert not at_most("p50", 2.5, 2.0).met
    missing = at_most("p50", math.nan, 2.0)
    assert (missing.measured, missing.met) == ("not measured", False)
    ratio = at_least_times("rps", 900, 250, 3.0)
    assert ratio.met and ratio.measured.startswith("3.60 x (900 vs 250 requests/s")
    assert not at_least_times("rps", 600, 250, 3.0).met
    assert at_least_times("rps", 600, 0.0, 3.0).measured == "not measured"


def test_streams_are_held_only_when_every_run_completed_all_of_them_at_once() -> None:
    assert streams_target(1000, [1000, 1000], [1000, 1000], 3.0).met
    assert not streams_target(1000, [1000, 999], [1000, 1000], 3.0).met
    assert not streams_target(1000, [1000], [640], 3.0).met  # completed, but never all open together
    assert not streams_target(50, [50], [50], 3.0).met  # quick mode opens too few
    assert streams_target(1000, [], [], math.nan).measured == "not measured"


def test_litellm_config_maps_each_model_to_its_simulator_through_the_openai_provider() -> None:
    config = json.loads(litellm_config({"glm-5": "http://127.0.0.1:1/v1"}, api_key="k"))
    (entry,) = config["model_list"]
    assert entry == {
        "model_name": "glm-5",
        "litellm_params": {"model": "openai/glm-5", "api_base": "http://127.0.0.1:1/v1", "api_key": "k"},
    }
    assert config["litellm_settings"]["num_retries"] == 0


def test_gateway_env_lifts_every_limit_above_the_load_and_switches_only_the_exact_cache() -> None:
    uncached, cached = gateway_env("http://sim/v1", cache=False), gateway_env("http://sim/v1", cache=True)
    assert int(uncached["GATEWAY_MAX_IN_FLIGHT"]) >= 1000 and int(uncached["CHAT_MAX_CONNECTIONS"]) >= 1000
    assert float(uncached["CHAT_REQUESTS_PER_SECOND"]) >= 10_000 and int(uncached["CHAT_MAX_CONCURRENT"]) >= 1000
    assert (uncached["CHAT_CACHE_MB"], cached["CHAT_CACHE_MB"]) == ("0", "64")
    assert uncached["CHAT_SEMANTIC_MATCHER"] == cached["CHAT_SEMANTIC_MATCHER"] == "off"


def test_stream_pacing_makes_an_answer_last_the_requested_time_reasoning_included() -> None:
    messages = [{"role": "user", "content": PROMPT.format(123)}]
    pieces = len(split_pieces(reasoning_reply(messages))) + len(split_pieces(echo_reply(messages)))
    assert answer_pieces() == pieces
    assert SIM_TTFT + (pieces - 1) / stream_tps(10.0) == pytest.approx(10.0)


def test_every_measured_model_streams_reasoning_before_its_answer() -> None:
    assert all(thinks({"model": model, "messages": []}) for model in MODELS.values())


def test_run_size_targets_the_duration_within_bounds() -> None:
    assert run_size(500.0, 3.0, 8) == 1500
    assert run_size(1.0, 3.0, 32) == 128  # at least 4 requests per slot
    assert run_size(1e9, 3.0, 1) == 100_000
    assert run_size(10.0, 3.0, 1, minimum=100) == 100  # enough samples for a p99


async def lines(*events: str) -> AsyncIterator[str]:
    for event in events:
        yield event
        yield ""


def chunk(content: str | None, *, reasoning: bool = False) -> str:
    delta = {"role": "assistant", "content": ""} if content is None else {"content": content}
    if reasoning and content is not None:
        delta = {"reasoning_content": content}
    return "data: " + json.dumps({"choices": [{"index": 0, "delta": delta}]})


async def paced(*events: str, pause: float = 0.01) -> AsyncIterator[str]:
    for event in events:
        await asyncio.sleep(pause)
        yield event


async def test_first_byte_is_the_first_event_and_first_answer_the_first_content_after_the_reasoning() -> None:
    events = (chunk(None), chunk("think", reasoning=True), chunk("more", reasoning=True), chunk("E"), "data: [DONE]")
    times = await stream_times(paced(*events), time.perf_counter())
    assert 0 < times.first_byte < times.first_answer  # the reasoning chunks between them are no answer


async def test_first_content_skips_the_role_chunk_and_reads_to_done() -> None:
    times = await stream_times(lines(chunk(None), chunk("E"), chunk("x"), "data: [DONE]"), 0.0)
    assert times.first_answer >= times.first_byte > 0


@pytest.mark.parametrize(
    ("events", "message"),
    [
        ((chunk(None), chunk("E")), "without \\[DONE\\]"),
        ((chunk(None), "data: [DONE]"), "without content"),
        ((chunk(None), chunk("only thoughts", reasoning=True), "data: [DONE]"), "without content"),
        ((chunk("E"), 'data: {"error": {"message": "upstream broke"}}', "data: [DONE]"), "upstream broke"),
    ],
)
async def test_incomplete_or_failed_streams_are_errors(events: tuple[str, ...], message: str) -> None:
    with pytest.raises(AnswerError, match=message):
        await stream_times(lines(*events), 0.0)


def samples(rps: float, *latencies_ms: float, proxy_cpu: float = 0.0) -> list[Sample]:
    return [Sample(stats(*latencies_ms, elapsed=len(latencies_ms) / rps), proxy_cpu=proxy_cpu) for _ in range(3)]


def test_series_rows_and_targets_compare_each_system_with_the_bare_simulator_and_litellm() -> None:
    results = {
        32: {
            BARE: samples(1000, 1, 1, 2),
            GATEWAY: samples(600, 2, 2, 3, proxy_cpu=0.005),
            LITELLM: samples(150, 10, 10, 30, proxy_cpu=0.02),
        }
    }
    points = series(results)
    gw = next(p for p in points if p.system == GATEWAY)
    assert gw.extra["added_p50_ms"] == pytest.approx(1.0)
    assert gw.extra["ratio_to_reference"] == pytest.approx(0.6)
    assert gw.extra["proxy_cpu_ms_per_request"] == pytest.approx(5 / 3)
    table = {row["system"]: row for row in rows("completions", points, versus_litellm=True)}
    assert table[GATEWAY]["x LiteLLM"] == pytest.approx(4.0)
    assert table[BARE]["proxy CPU %"] is None and table[BARE]["added p50 ms"] == 0.0
    assert rps_target(points).met and "concurrency 32" in rps_target(points).name
    p50, p99 = ttft_targets(points)
    assert p50.met and p99.met and p50.measured == "1.00 ms (LiteLLM 9.0 ms)"


@pytest.mark.slow
async def test_quick_run_measures_gateway_and_bare_and_holds_every_stream_it_opens(tmp_path: Path) -> None:
    result = await run(tmp_path, quick=True)
    assert {BARE, GATEWAY, CACHED} <= {point.system for point in result.points if point.throughput > 0}
    burst = {row["system"]: row for row in result.table if row["measurement"] == "streams at once"}
    assert burst[GATEWAY]["completed"] == f"{QUICK.streams}/{QUICK.streams}"
    assert burst[GATEWAY]["peak open"] == QUICK.streams and burst[GATEWAY]["errors"] == 0
    assert json.loads((tmp_path / "chat.json").read_text())["part"] == "chat"


def test_stream_rows_report_time_to_first_byte_beside_time_to_first_answer() -> None:
    def streamed(first_byte_ms: float, first_answer_ms: float) -> list[Sample]:
        return [
            Sample(stats(first_answer_ms, first_answer_ms), first_byte=[first_byte_ms / 1000] * 2) for _ in range(3)
        ]

    points = series({16: {BARE: streamed(50, 80), GATEWAY: streamed(51, 82)}})
    gateway = {row["system"]: row for row in rows("TTFT", points)}[GATEWAY]
    assert gateway["p50 ms"] == pytest.approx(82) and gateway["TTFB p50 ms"] == pytest.approx(51)
    assert gateway["added p50 ms"] == pytest.approx(2) and gateway["added TTFB p50 ms"] == pytest.approx(1)
    assert "TTFB p50 ms" not in {key for row in rows("completions", series({1: {BARE: samples(10, 1)}})) for key in row}


async def test_systems_taking_turns_alternate_one_request_at_a_time_each_timed_on_its_own() -> None:
    sent: list[tuple[str, int]] = []
    in_flight = 0

    def system(name: str, seconds: float) -> Callable[[int], Awaitable[int]]:
        async def request(index: int) -> int:
            nonlocal in_flight
            in_flight += 1
            assert in_flight == 1  # one request at a time, whatever the system
            sent.append((name, index))
            await asyncio.sleep(seconds)
            in_flight -= 1
            return 1

        return request

    fast, slow = await taking_turns([system("fast", 0.002), system("slow", 0.02)], total=6)

    assert sent[:4] == [("fast", 0), ("slow", 0), ("slow", 1), ("fast", 1)]  # the order turns with each index
    assert sorted(sent) == sorted((name, i) for name in ("fast", "slow") for i in range(6))
    assert len(fast.latencies) == len(slow.latencies) == 6
    assert fast.elapsed < 0.5 * slow.elapsed  # each run's time is its own requests', not the whole alternation
    assert slow.requests_per_second <= 1 / 0.02
