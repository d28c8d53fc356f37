"""The keys benchmark: its keys file, the added latency and CPU against each baseline, the goal's targets, and
one quick end-to-end run against real Triton, gateway and redis-server processes."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import keys
from bench.embeddings.loads import Series
from bench.keys.plan import (
    CONFIGS,
    GOAL_ADDED_P99_MS,
    KEYS_LOCAL,
    KEYS_REDIS,
    OPEN,
    OPEN_REDIS,
    RATE,
    TEAM,
    UNLIMITED_BUDGET,
    UNLIMITED_RPM,
)
from bench.keys.report import build_result, cpu_ms_per_request
from bench.keys.servers import write_keys_file
from bench.run_stats import RunStats
from gateway.keys.keys_file import parse_keys_file
from gateway.keys.model import hash_secret


def series(name: str, *rounds: tuple[float, float, float]) -> Series:
    """A configuration's rounds, each (p50-ish latency ms, p99-ish latency ms, gateway CPU %) over 1 s."""
    found = Series(name, RATE)
    for low, high, cpu in rounds:
        latencies = [low / 1000] * 98 + [high / 1000] * 2
        found.add(RunStats(elapsed=1.0, latencies=latencies), {"gateway_cpu_percent": cpu}, {"cache_misses": 0.0})
    return found


def test_the_keys_file_gives_one_scoped_key_whose_limits_run_but_never_refuse_the_load(tmp_path: Path) -> None:
    path = tmp_path / "keys.yaml"
    write_keys_file(path, "sk-bench-secret")
    parsed = parse_keys_file(path.read_text())
    (key,) = parsed.keys
    assert key.secret_hash == hash_secret("sk-bench-secret") and key.team == TEAM
    assert key.scopes == frozenset({"embeddings"})
    for limits in (key.limits, parsed.teams[TEAM]):
        rpm = limits.rpm_for("embeddings")
        assert rpm is not None and rpm / 60 > 100 * RATE  # one check per request, far from refusing
        assert limits.monthly_budget == UNLIMITED_BUDGET
    assert UNLIMITED_RPM <= 60_000_000  # a GCRA step of at least 1 µs: the rate check is not skipped


def test_added_latency_and_cpu_pair_each_keyed_gateway_with_its_own_stores_round_by_round() -> None:
    found = build_result(
        [
            series(OPEN.name, (2.0, 5.0, 40.0), (3.0, 9.0, 40.0)),
            series(KEYS_LOCAL.name, (2.1, 5.2, 45.0), (3.1, 9.2, 45.0)),
            series(OPEN_REDIS.name, (3.0, 8.0, 50.0), (3.0, 8.0, 50.0)),
            series(KEYS_REDIS.name, (3.5, 9.0, 60.0), (3.5, 8.5, 60.0)),
        ],
        CONFIGS,
        runs=2,
        quick=False,
        load_at_start=0.0,
        notes=[],
    )
    added = {row["configuration"]: row for row in found.table if "added p99 ms" in row}
    local = added[f"added: {KEYS_LOCAL.name} vs {OPEN.name}"]
    assert (local["added p50 ms"], local["added p99 ms"]) == ("0.100", "0.200")
    assert local["added gateway CPU ms/request"] == "0.500"  # 5 % of a core for 1 s over 100 requests
    redis = added[f"added: {KEYS_REDIS.name} vs {OPEN_REDIS.name}"]
    assert (redis["added p50 ms"], redis["added p99 ms"]) == ("0.500", "0.750")  # rounds add 1.0 and 0.5 ms
    assert f"added: {KEYS_REDIS.name} vs {OPEN.name}" in added  # listed, not judged
    assert [(t.name.split(": ", 1)[1], t.met) for t in found.targets] == [
        (f"{KEYS_LOCAL.name} vs {OPEN.name}", True),
        (f"{KEYS_REDIS.name} vs {OPEN_REDIS.name}", False),
    ]
    assert all(t.goal == f"<= {GOAL_ADDED_P99_MS:g} ms" for t in found.targets)
    assert found.targets[1].measured.startswith("0.750 ms (added p50 0.500 ms, gateway CPU 1.000 ms/request")


def test_without_redis_only_the_in_process_pair_is_judged() -> None:
    found = build_result(
        [series(OPEN.name, (2.0, 5.0, 40.0)), series(KEYS_LOCAL.name, (2.0, 5.0, 40.0))],
        [OPEN, KEYS_LOCAL],
        runs=1,
        quick=True,
        load_at_start=0.0,
        notes=["Redis configurations skipped"],
    )
    assert len(found.targets) == 1 and found.targets[0].met
    assert any("Quick mode" in note for note in found.notes)


def test_cpu_per_request_counts_answered_requests_only() -> None:
    assert cpu_ms_per_request(series("x", (1.0, 1.0, 50.0))) == pytest.approx([5.0])  # 0.5 s of CPU, 100 answers


@pytest.mark.slow
async def test_quick_run_measures_every_configuration_from_the_warm_cache(
    tmp_path: Path, minilm_repository: Path
) -> None:
    result = await keys.run(tmp_path, runs=1, quick=True, repository=minilm_repository)
    assert {point.system for point in result.points} == {config.name for config in CONFIGS}
    assert all(point.extra["errors"] == 0 for point in result.points)
    in_process = {config.name for config in CONFIGS if not config.redis}  # a Redis timeout would be a miss
    assert all(point.extra["cache_misses"] == 0 for point in result.points if point.system in in_process)
    assert len(result.targets) == 2
    recorded = next(note for note in result.notes if note.startswith("requests in the key's usage record"))
    assert "not readable" not in recorded and ": 0" not in recorded


def test_a_run_the_cache_did_not_answer_or_with_errors_cannot_meet_the_goal() -> None:
    missed = series(KEYS_LOCAL.name, (2.0, 5.0, 40.0))
    missed.counters[0]["cache_misses"] = 3.0
    found = build_result([series(OPEN.name, (2.0, 5.0, 40.0)), missed], [OPEN, KEYS_LOCAL], 1, False, 0.0, [])
    (target,) = found.targets
    assert not target.met and target.measured.endswith("; 3 cache misses)")
