"""The embeddings benchmark: its workload, counting, targets and table; one slow end-to-end run in quick mode."""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
from pathlib import Path

import orjson
import pytest

from bench.cpu import tree_cpu_seconds, tree_cpu_split, triton_part
from bench.embeddings import run
from bench.embeddings.clients import EmbeddingsError, openai_request
from bench.embeddings.loads import Series, batches, measure
from bench.embeddings.plan import (
    CACHED_1,
    CEILING_BATCHES,
    GATEWAY_1,
    GATEWAY_32,
    NAIVE,
    ORT_ARRIVAL,
    ORT_INT8,
    ORT_ONE_CALL,
    ORT_SIDE_BY_SIDE,
    TOKENIZE_COALESCED,
    TOKENIZE_PER_REQUEST,
    TRITON_1,
    TRITON_32,
    arrival_systems,
    ceiling_systems,
)
from bench.embeddings.report import (
    best_ceiling,
    build_result,
    cpu_budget,
    evaluate_targets,
    latency_target,
    ratio_target,
    same_batches_notes,
    table_rows,
)
from bench.load import closed_loop
from bench.results import Point
from bench.run_stats import RunStats
from bench.workload import MAX_WORDS, MIN_WORDS, samples, texts

CJK = re.compile(r"[\u4e00-\u9fff]")


# -- workload -------------------------------------------------------------------------------------------


def test_texts_are_the_same_for_the_same_seed_and_differ_for_another() -> None:
    assert texts(200, seed=7) == texts(200, seed=7)
    assert texts(200, seed=7) != texts(200, seed=8)


def test_default_workload_is_2000_distinct_texts_half_english_half_chinese() -> None:
    drawn = samples()
    assert len(drawn) == 2000
    assert len({s.text for s in drawn}) == 2000
    assert sum(s.language == "en" for s in drawn) == 1000
    assert sum(s.language == "zh" for s in drawn) == 1000
    languages = [s.language for s in drawn[:100]]
    assert "en" in languages and "zh" in languages  # shuffled together, not two blocks


def test_every_text_has_5_to_60_words_in_its_own_language() -> None:
    for sample in samples(600, seed=3):
        assert MIN_WORDS <= sample.words <= MAX_WORDS
        if sample.language == "en":
            assert len(sample.text.split()) == sample.words
            assert sample.text.isascii() and sample.text.endswith(".")
        else:
            assert CJK.search(sample.text) and " " not in sample.text
            assert sample.text.endswith("。")
            assert sample.words <= len(sample.text) <= 3 * sample.words + sample.text.count("，") + 1


def test_word_counts_cover_the_whole_range() -> None:
    counts = {s.words for s in samples()}
    assert min(counts) == MIN_WORDS and max(counts) == MAX_WORDS


def test_workload_arguments_are_checked() -> None:
    assert texts(0) == []
    with pytest.raises(ValueError, match="count"):
        texts(-1)
    with pytest.raises(ValueError, match="min_words"):
        samples(10, min_words=10, max_words=5)


# -- measuring ------------------------------------------------------------------------------------------


async def test_measure_runs_the_load_in_a_cpu_window_and_counts_every_item() -> None:
    async def request(index: int) -> int:
        await asyncio.sleep(0.001 * (index % 3))
        return 2

    load = closed_loop(request, total=100, concurrency=16)
    stats, window = await measure(load, {"self": os.getpid()})
    assert stats.items == 200 and len(stats.latencies) == 100
    assert {"self_cpu_percent", "server_cpu_percent", "foreign_cpu_percent"} <= window.percent.keys()


async def test_closed_loop_counts_every_item_when_requests_overlap() -> None:
    """An item count read before an await would lose the updates of the requests that end meanwhile."""

    async def request(index: int) -> int:
        await asyncio.sleep(0.001)
        return 1

    stats = await closed_loop(request, total=64, concurrency=8)
    assert len(stats.latencies) == 64
    assert stats.items == 64


async def test_failed_requests_are_counted_and_the_first_cause_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    async def request(index: int) -> int:
        if index % 4 == 0:
            raise EmbeddingsError(f"HTTP 503: request {index}")
        return 1

    stats = await closed_loop(request, total=8, concurrency=2)
    assert stats.errors == 2 and len(stats.latencies) == 6
    failures = [r.getMessage() for r in caplog.records if "failed" in r.getMessage()]
    assert failures == ["request 0 failed: EmbeddingsError('HTTP 503: request 0')"]


def test_tree_cpu_seconds_reads_this_process_and_ignores_a_missing_one() -> None:
    assert tree_cpu_seconds(os.getpid()) > 0
    assert tree_cpu_seconds(2**22 + 12345) == 0.0


def test_tree_cpu_split_labels_each_process_by_its_command_line() -> None:
    own = Path("/proc/self/cmdline").read_bytes().replace(b"\0", b" ").decode()
    split = tree_cpu_split(os.getpid(), lambda command: "this process" if command == own else "a child")
    assert split["this process"] > 0  # the suite may have started servers below it too
    assert sum(split.values()) == pytest.approx(tree_cpu_seconds(os.getpid()), abs=0.05)
    assert tree_cpu_split(2**22 + 12345, lambda command: command) == {}
    stub = "/x/triton_python_backend_stub /repo/bge_onnx/1/model.py triton_python_backend_shm_region_1"
    assert triton_part(stub) == "encoder" and triton_part(stub.replace("bge_onnx", "bge_tokenizer")) == "tokenizer"
    assert triton_part("/x/tritonserver --model-repository /repo") == "frontend"


def test_cpu_budget_bounds_the_served_rate_by_the_ceiling_and_the_rest_of_the_stack() -> None:
    ceiling = point(ORT_INT8, 1, 500)
    ceiling.extra = {"client_cpu_percent": 200.0}  # 4 ms of CPU per text
    served = point(GATEWAY_1, 32, 400)
    served.extra = {
        "triton_encoder_cpu_percent": 160.0,  # 4 ms per text, as lean as the ceiling
        "gateway_cpu_percent": 12.0,  # these four: 0.3 + 0.1 + 0.1 + 0.1 ms per text
        "triton_frontend_cpu_percent": 4.0,
        "triton_tokenizer_cpu_percent": 4.0,
        "client_cpu_percent": 4.0,
        "idle_cpu_percent": 16.0,
    }
    note = cpu_budget([ceiling, served], cores=2)
    assert note is not None
    assert "encoder 4.00 ms (best in-process 4.00 ms), the rest 0.60 ms (gateway 0.30," in note
    assert "cores idle 16 %" in note and "at most 435 texts/s = 0.87 x the best in-process" in note  # 2000 / 4.6
    assert cpu_budget([ceiling], cores=2) is None


def test_batches_keep_order_and_the_remainder() -> None:
    assert batches(["a", "b", "c", "d", "e"], 2) == [["a", "b"], ["c", "d"], ["e"]]


class FakeSession:
    def __init__(self, vectors: int, cache: str = "miss", status: int = 200) -> None:
        self.bodies: list[dict[str, object]] = []
        self._vectors, self._cache, self._status = vectors, cache, status

    async def post(self, url: str, body: bytes) -> tuple[int, bytes, dict[str, str]]:
        self.bodies.append(orjson.loads(body))
        data = [{"embedding": [0.0], "index": i} for i in range(self._vectors)]
        return self._status, orjson.dumps({"data": data}), {"x-cache": self._cache}

    async def aclose(self) -> None:
        return None


async def test_openai_request_sends_the_input_and_checks_the_vectors() -> None:
    session = FakeSession(vectors=2, cache="hit")
    misses: list[int] = []
    send = openai_request(session, "http://x/v1/embeddings", [["a", "b"]], model="m", misses=misses)
    assert await send(0) == 2
    assert session.bodies == [{"input": ["a", "b"], "model": "m"}]
    assert misses == []
    short = openai_request(FakeSession(vectors=1), "http://x", [["a", "b"]])
    with pytest.raises(EmbeddingsError, match="1 vectors for 2 texts"):
        await short(0)
    failing = openai_request(FakeSession(vectors=1, status=503), "http://x", ["a"])
    with pytest.raises(EmbeddingsError, match="HTTP 503"):
        await failing(0)


async def test_openai_request_counts_answers_not_from_the_cache() -> None:
    misses: list[int] = []
    send = openai_request(
        FakeSession(vectors=1, cache="miss"), "http://x", ["a"], encoding_format="base64", misses=misses
    )
    await send(5)
    assert misses == [5]


# -- targets and table ----------------------------------------------------------------------------------


def point(system: str, x: float, throughput: float, p99_ms: float = 10.0, runs: int = 1) -> Point:
    return Point(system, x, throughput, p50_ms=p99_ms / 2, p99_ms=p99_ms, samples=[throughput] * runs)


def passing_points() -> list[Point]:
    return [
        point(ORT_INT8, 1, 380),
        point(ORT_SIDE_BY_SIDE.format(batch=32), 1, 400),
        point(NAIVE, 1, 50),
        point(GATEWAY_1, 32, 360),
        point(GATEWAY_32, 32, 390),
        point(GATEWAY_1, 8, 300, p99_ms=45),
        point("infinity-emb torch, 1 text/request", 32, 70),
        point("infinity-emb optimum, 1 text/request", 32, 140),
    ]


def test_the_ceiling_is_the_fastest_in_process_configuration() -> None:
    assert len(set(ceiling_systems())) == 2 * len(CEILING_BATCHES)
    assert ORT_ONE_CALL.format(batch=32) == ORT_INT8 and ORT_INT8 in ceiling_systems()
    best = best_ceiling(passing_points())
    assert best is not None and best.system == ORT_SIDE_BY_SIDE.format(batch=32)
    assert best_ceiling([point(GATEWAY_1, 32, 900)]) is None  # a served system is never the ceiling


def test_the_encoder_alone_on_the_served_batches_is_a_bound_never_the_ceiling() -> None:
    best = point(ORT_SIDE_BY_SIDE.format(batch=64), 1, 600)
    single, batched = point(GATEWAY_1, 32, 400), point(GATEWAY_32, 32, 500)
    single.extra, batched.extra = {"model_batch": 15.5}, {"model_batch": 231.4}
    alone = [point(ORT_ARRIVAL.format(batch=16), 1, 500), point(ORT_ARRIVAL.format(batch=256), 1, 560)]
    assert best_ceiling([best, *alone]) is best
    assert best_ceiling([point(ORT_ARRIVAL.format(batch=16), 1, 900), best]) is best
    others = [point(ORT_ARRIVAL.format(batch=size), 1, 1) for size in (32, 64, 128)]
    notes = same_batches_notes([best, single, batched, *alone, *others], best)
    assert len(notes) == 2
    # Each served load against the batch size its calls held: 15.5 -> 16, 231.4 -> 256.
    assert notes[0].startswith(f"{GATEWAY_1} at concurrency 32: the encoder's batches held 15.5 texts;")
    assert "batches of 16 in arrival order made 500 texts/s (0.83 x the best in-process)" in notes[0]
    assert "the served path 400 = 0.80 x it; the goal of 0.85 x the best (510 texts/s) is 1.02 x" in notes[0]
    assert "batches of 256 in arrival order made 560 texts/s" in notes[1]
    assert "the goal of 0.95 x the best (570 texts/s) is 1.02 x" in notes[1]
    assert same_batches_notes([best, single], best) == []  # the encoder alone was not measured
    assert same_batches_notes([*alone, single], None) == []


def test_targets_are_met_when_every_ratio_and_latency_is_within_its_goal() -> None:
    cache = point("cache", 500, 500, p99_ms=2.5)
    targets = evaluate_targets(passing_points(), cache, infinity_notes=[])
    assert [t.met for t in targets] == [True] * 6
    # Against the best configuration (side by side, 400), the old ceiling's ratio beside it.
    assert targets[0].measured.startswith("worst 0.90 x of 1 runs (spread 0.90-0.90; medians 360 vs 400")
    assert "old ceiling (ONNX Runtime INT8 in-process, sorted batches of 32) worst 0.95 x" in targets[0].measured
    assert "side by side" in targets[0].goal and "every run" in targets[0].goal
    assert "infinity-emb optimum" in targets[2].measured  # compared with the fastest engine
    assert targets[2].measured.startswith("worst 2.57 x")
    assert targets[4].name == "REST gateway, 32 texts/request vs in-process INT8" and "0.97 x" in targets[4].measured


def test_a_target_is_met_only_when_every_run_meets_it() -> None:
    best = point(ORT_SIDE_BY_SIDE.format(batch=16), 1, 400)
    best.samples = [400.0, 400.0, 400.0]
    gateway = point(GATEWAY_1, 32, 360)
    gateway.samples = [360.0, 380.0, 320.0]  # the median meets 0.85 x, the third run does not
    target = ratio_target("x", gateway, best, 0.85, "y")
    assert not target.met
    assert target.measured.startswith("worst 0.80 x of 3 runs (spread 0.80-0.95; medians 360 vs 400 texts/s)")
    slow = point(GATEWAY_1, 8, 0, p99_ms=45)
    slow.p99_samples = [40.0, 45.0, 52.0]
    judged = latency_target("p99", slow, 50.0, digits=1)
    assert not judged.met and judged.measured == "worst 52.0 ms of 3 runs (spread 40.0-52.0 ms)"
    slow.p99_samples = [40.0, 45.0, 49.0]
    assert latency_target("p99", slow, 50.0, digits=1).met


def test_ratios_are_taken_round_by_round() -> None:
    """A round where the whole machine was slower lowers both systems alike; the ratio stays."""
    best = point(ORT_SIDE_BY_SIDE.format(batch=64), 1, 400)
    best.samples = [400.0, 300.0]
    gateway = point(GATEWAY_1, 32, 340)
    gateway.samples = [360.0, 270.0]
    assert ratio_target("x", gateway, best, 0.9, "y").met


def test_targets_report_misses_and_what_was_not_measured() -> None:
    points = [point(ORT_INT8, 1, 400), point(GATEWAY_1, 32, 200), point(GATEWAY_1, 8, 150, p99_ms=80)]
    targets = evaluate_targets(points, None, infinity_notes=["infinity-emb not run: no wheel"])
    by_name = {t.name: t for t in targets}
    assert not by_name["REST gateway vs in-process INT8"].met
    assert "old ceiling" not in by_name["REST gateway vs in-process INT8"].measured  # it is the best here
    assert by_name["REST gateway vs naive loop"].measured == "not measured"
    assert by_name["REST gateway vs infinity-emb"].measured == "not measured: infinity-emb not run: no wheel"
    assert by_name["cached embeddings p99 at 500 requests/s"].measured == "not measured"
    assert not any(t.met for t in targets)
    assert by_name["REST gateway p99, 1 text/request, concurrency 8"].measured.startswith("worst 80.0 ms")


def test_ratio_target_needs_both_numbers() -> None:
    assert not ratio_target("x", point("a", 1, 10.0), None, 2, "y").met
    assert ratio_target("x", point("a", 1, 10.0), point("b", 1, 5.0), 2, "y").met


def test_table_rows_carry_the_ratios_to_the_best_configuration_and_the_old_ceiling() -> None:
    served = point(GATEWAY_1, 32, 300)
    served.extra = {"gateway_cpu_percent": 15.0}
    rows = table_rows([served], best=point("best", 1, 400), old=point(ORT_INT8, 1, 375))
    assert rows[0]["x best in-process"] == pytest.approx(0.75)
    assert rows[0]["x old ceiling"] == pytest.approx(0.8)
    assert rows[0]["gateway CPU ms/text"] == pytest.approx(0.5)
    assert rows[0]["concurrency"] == 32 and rows[0]["system"] == GATEWAY_1
    assert math.isnan(rows[0]["bge_onnx batch"])  # no Triton figures for this point


def test_the_notes_name_the_machine_the_ceiling_the_gateway_cpu_and_the_tokenizer_stage() -> None:
    def series(system: str, x: float, rates: list[float], cpu: list[dict[str, float]]) -> Series:
        item = Series(system, x)
        for rate, window in zip(rates, cpu, strict=True):
            item.add(RunStats(1.0, [0.01], items=int(rate), client_cpu_seconds=rate / 10_000), window, {})
        return item

    measured = [
        series(ORT_INT8, 1, [300, 310], [{}, {}]),
        series(ORT_SIDE_BY_SIDE.format(batch=32), 1, [340, 350], [{}, {}]),
        series(GATEWAY_1, 32, [250, 200], [{"gateway_cpu_percent": 10.0}, {"gateway_cpu_percent": 12.0}]),
    ]
    tokenizers = [series(TOKENIZE_COALESCED, 1, [4000, 4000], [{}, {}]), series(TOKENIZE_PER_REQUEST, 1, [1000], [{}])]
    result = build_result(measured, Series("cache", 500), 500, [], [], tokenizers)
    notes = "\n".join(result.notes)
    assert "cores; every target is judged on the worst of the 2 runs" in notes
    assert f"The best, reference of every ratio: {ORT_SIDE_BY_SIDE.format(batch=32)}" in notes
    assert "the old ceiling (ONNX Runtime INT8 in-process, sorted batches of 32) reaches 0.88 x it" in notes
    # 10 % of a second over 250 texts, 12 % over 200 texts
    assert "gateway CPU per text, gateway REST, 1 text/request at concurrency 32: 0.500 ms" in notes
    assert "spread 0.400-0.600 ms" in notes
    assert f"{TOKENIZE_COALESCED} 0.100 ms; {TOKENIZE_PER_REQUEST} 0.100 ms" in notes


# -- end to end -----------------------------------------------------------------------------------------


@pytest.mark.slow
async def test_quick_run_measures_the_gateway_and_triton(tmp_path: Path, minilm_repository: Path) -> None:
    result = await run(tmp_path, quick=True, repository=minilm_repository)
    written = json.loads((tmp_path / "embeddings.json").read_text())
    assert written["part"] == "embeddings" and written["x_label"] == "concurrency"
    systems = {p["system"] for p in written["points"]}
    for system in (GATEWAY_1, GATEWAY_32, TRITON_1, TRITON_32, CACHED_1, ORT_INT8):
        measured = [p for p in written["points"] if p["system"] == system]
        assert measured, f"{system} missing from {systems}"
        assert all(p["throughput"] > 0 and p["extra"]["errors"] == 0 for p in measured)
    assert {p["x"] for p in written["points"] if p["system"] == GATEWAY_1} == {1, 8}
    # What Triton saw: every text once, in calls of 1 or 32 texts straight, fewer calls through the gateway.
    seen = {(p["system"], p["x"]): p["extra"] for p in written["points"] if "triton_calls_per_text" in p["extra"]}
    assert {system for system, _ in seen} == {GATEWAY_1, GATEWAY_32, TRITON_1, TRITON_32}
    for (system, _), extra in seen.items():
        calls = {TRITON_1: 1.0, TRITON_32: 1 / 32}.get(system)
        if calls is not None:
            assert extra["triton_calls_per_text"] == pytest.approx(calls)
        else:
            assert 0 < extra["triton_calls_per_text"] <= (1 if system == GATEWAY_1 else 1 / 32)
        assert extra["model_batch"] >= 1 and 0 < extra["model_busy_percent"] <= 105 and extra["model_queue_ms"] >= 0
    assert len(result.targets) == 9
    # The overload step: every request at 4 x the capacity answered or refused, none failed or timed out.
    assert any(note.startswith("overload: ") for note in result.notes)
    waited = next(t for t in result.targets if "waited out their deadline" in t.name)
    assert waited.met, waited.measured
    for system in [*ceiling_systems(), *arrival_systems()]:
        assert any(p["system"] == system for p in written["points"]), f"{system} missing"
    assert any(note.startswith("tokenizer stage, CPU per text") for note in result.notes)
    assert any("infinity-emb not run" in note for note in result.notes)
