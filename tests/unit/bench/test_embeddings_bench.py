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
from bench.embeddings.loads import batches, measure
from bench.embeddings.plan import CACHED_1, GATEWAY_1, GATEWAY_32, NAIVE, ORT_INT8, TRITON_1, TRITON_32
from bench.embeddings.report import cpu_budget, evaluate_targets, ratio_target, table_rows
from bench.load import closed_loop
from bench.results import Point
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


def test_measure_runs_the_load_in_a_cpu_window_and_counts_every_item() -> None:
    async def request(index: int) -> int:
        await asyncio.sleep(0.001 * (index % 3))
        return 2

    load = closed_loop(request, total=100, concurrency=16)
    stats, window = asyncio.run(measure(load, {"self": os.getpid()}))
    assert stats.items == 200 and len(stats.latencies) == 100
    assert {"self_cpu_percent", "server_cpu_percent", "foreign_cpu_percent"} <= window.percent.keys()


def test_closed_loop_counts_every_item_when_requests_overlap() -> None:
    """An item count read before an await would lose the updates of the requests that end meanwhile."""

    async def request(index: int) -> int:
        await asyncio.sleep(0.001)
        return 1

    stats = asyncio.run(closed_loop(request, total=64, concurrency=8))
    assert len(stats.latencies) == 64
    assert stats.items == 64


def test_failed_requests_are_counted_and_the_first_cause_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    async def request(index: int) -> int:
        if index % 4 == 0:
            raise EmbeddingsError(f"HTTP 503: request {index}")
        return 1

    stats = asyncio.run(closed_loop(request, total=8, concurrency=2))
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
    assert "encoder 4.00 ms (in-process ceiling 4.00 ms), the rest 0.60 ms (gateway 0.30," in note
    assert "cores idle 16 %" in note and "at most 435 texts/s = 0.87 x the ceiling" in note  # 2000 ms / 4.6 ms
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


def test_openai_request_sends_the_input_and_checks_the_vectors() -> None:
    session = FakeSession(vectors=2, cache="hit")
    misses: list[int] = []
    send = openai_request(session, "http://x/v1/embeddings", [["a", "b"]], model="m", misses=misses)
    assert asyncio.run(send(0)) == 2
    assert session.bodies == [{"input": ["a", "b"], "model": "m"}]
    assert misses == []
    short = openai_request(FakeSession(vectors=1), "http://x", [["a", "b"]])
    with pytest.raises(EmbeddingsError, match="1 vectors for 2 texts"):
        asyncio.run(short(0))
    failing = openai_request(FakeSession(vectors=1, status=503), "http://x", ["a"])
    with pytest.raises(EmbeddingsError, match="HTTP 503"):
        asyncio.run(failing(0))


def test_openai_request_counts_answers_not_from_the_cache() -> None:
    misses: list[int] = []
    send = openai_request(
        FakeSession(vectors=1, cache="miss"), "http://x", ["a"], encoding_format="base64", misses=misses
    )
    asyncio.run(send(5))
    assert misses == [5]


# -- targets and table ----------------------------------------------------------------------------------


def point(system: str, x: float, throughput: float, p99_ms: float = 10.0) -> Point:
    return Point(system, x, throughput, p50_ms=p99_ms / 2, p99_ms=p99_ms)


def test_targets_are_met_when_every_ratio_and_latency_is_within_its_goal() -> None:
    points = [
        point(ORT_INT8, 1, 400),
        point(NAIVE, 1, 50),
        point(GATEWAY_1, 32, 360),
        point(GATEWAY_1, 8, 300, p99_ms=45),
        point("infinity-emb torch, 1 text/request", 32, 70),
        point("infinity-emb optimum, 1 text/request", 32, 140),
    ]
    targets = evaluate_targets(points, cache_p99_ms=2.5, infinity_notes=[])
    assert [t.met for t in targets] == [True, True, True, True, True]
    assert targets[0].measured.startswith("0.90 x (360 vs 400")
    assert "infinity-emb optimum" in targets[2].measured  # compared with the fastest engine
    assert targets[2].measured.startswith("2.57 x")


def test_targets_report_misses_and_what_was_not_measured() -> None:
    points = [point(ORT_INT8, 1, 400), point(GATEWAY_1, 32, 200), point(GATEWAY_1, 8, 150, p99_ms=80)]
    targets = evaluate_targets(points, cache_p99_ms=None, infinity_notes=["infinity-emb not run: no wheel"])
    by_name = {t.name: t for t in targets}
    assert not by_name["REST gateway vs in-process INT8"].met
    assert by_name["REST gateway vs naive loop"].measured == "not measured"
    assert by_name["REST gateway vs infinity-emb"].measured == "not measured: infinity-emb not run: no wheel"
    assert not any(t.met for t in targets)
    assert by_name["REST gateway p99, 1 text/request, concurrency 8"].measured == "80.0 ms"


def test_ratio_target_needs_both_numbers() -> None:
    assert not ratio_target("x", 10.0, None, 2, "y").met
    assert ratio_target("x", 10.0, 5.0, 2, "y").met


def test_table_rows_carry_the_ratio_to_the_in_process_ceiling() -> None:
    rows = table_rows([point(GATEWAY_1, 32, 300)], reference=400)
    assert rows[0]["x INT8 in-process"] == pytest.approx(0.75)
    assert rows[0]["concurrency"] == 32 and rows[0]["system"] == GATEWAY_1
    assert math.isnan(rows[0]["bge_onnx batch"])  # no Triton figures for this point


# -- end to end -----------------------------------------------------------------------------------------


@pytest.mark.slow
def test_quick_run_measures_the_gateway_and_triton(tmp_path: Path, minilm_repository: Path) -> None:
    result = asyncio.run(run(tmp_path, quick=True, repository=minilm_repository))
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
    assert len(result.targets) == 5
    assert any("infinity-emb not run" in note for note in result.notes)
