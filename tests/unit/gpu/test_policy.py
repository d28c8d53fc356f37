"""The GPU policy stepped through memory and temperature ramps: per GPU (states, hysteresis, steps) and per Triton
(refusals, routing ranks, the in-flight limit, readiness, the log)."""

from __future__ import annotations

import logging

import pytest

from gateway.gpu.metrics_text import GpuReading
from gateway.gpu.policy import GpuPolicy, GpuState, Thresholds
from gateway.gpu.protection import ALL, GpuMemoryHighError, GpuProtection, SeenGpu
from gateway.settings import GpuSettings

GIB = 1 << 30
A, B = "10.0.0.1:8001", "10.0.0.2:8001"


def reading(memory: float | None = 0.5, temperature: float | None = 60.0, reasons: int | None = None) -> GpuReading:
    used = None if memory is None else memory * 16 * GIB
    return GpuReading("GPU-a", "triton", used, 16 * GIB, temperature_celsius=temperature, clock_event_reasons=reasons)


def states_through(policy: GpuPolicy, readings: list[GpuReading]) -> list[tuple[set[GpuState], int]]:
    out = []
    for r in readings:
        policy.observe(r)
        out.append((policy.states, policy.steps))
    return out


def test_memory_degrades_above_90_percent_and_recovers_only_below_85() -> None:
    policy = GpuPolicy(Thresholds())
    ramp = [0.5, 0.89, 0.91, 0.95, 0.87, 0.86, 0.84, 0.89]
    seen = [states for states, _ in states_through(policy, [reading(m) for m in ramp])]
    degraded, normal = {GpuState.DEGRADED}, {GpuState.NORMAL}
    assert seen == [normal, normal, degraded, degraded, degraded, degraded, normal, normal]


def test_heat_throttles_a_step_per_hot_interval_holds_in_between_and_cools_a_step_at_a_time() -> None:
    policy = GpuPolicy(Thresholds(max_steps=3))
    ramp = [80, 86, 87, 90, 91, 83, 79, 78, 77, 76]
    steps = [steps for _, steps in states_through(policy, [reading(temperature=t) for t in ramp])]
    assert steps == [0, 1, 2, 3, 3, 3, 2, 1, 0, 0]
    assert policy.states == {GpuState.NORMAL}


def test_clocks_slowed_for_heat_throttle_at_any_temperature_but_the_power_cap_does_not() -> None:
    policy = GpuPolicy(Thresholds(max_steps=3))
    policy.observe(reading(temperature=70, reasons=0x4))  # SW power cap
    assert policy.states == {GpuState.NORMAL}
    policy.observe(reading(temperature=70, reasons=0x40))  # HW thermal slowdown
    assert policy.states == {GpuState.THROTTLED}


def test_a_gpu_can_be_degraded_and_throttled_and_missing_figures_lift_their_states() -> None:
    policy = GpuPolicy(Thresholds())
    policy.observe(reading(0.95, 90))
    assert policy.states == {GpuState.DEGRADED, GpuState.THROTTLED}
    changes = policy.observe(reading(None, None))
    assert policy.states == {GpuState.NORMAL} and policy.steps == 0
    assert {(c.state, c.entered) for c in changes} == {(GpuState.DEGRADED, False), (GpuState.THROTTLED, False)}


def protection(calls: int = 4) -> tuple[GpuProtection, list[int]]:
    settings = GpuSettings(metrics_urls="http://x:8002/metrics", metrics_interval_seconds=5)
    guard = GpuProtection(settings, calls)
    limits: list[int] = []
    guard.on_limit(limits.append)
    return guard, limits


def seen(scope: str = ALL, uuid: str = "GPU-a", **figures: float | None) -> dict[str, SeenGpu]:
    r = reading(**figures)  # type: ignore[arg-type]
    return {uuid: SeenGpu(GpuReading(uuid, r.source, r.memory_used_bytes, r.memory_total_bytes,
                                     temperature_celsius=r.temperature_celsius), scope)}  # fmt: skip


def test_a_gpu_of_every_triton_short_of_memory_refuses_bulk_work_only(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="gateway.gpu")
    guard, _ = protection()
    guard.observe(seen(memory=0.95), [A])
    with pytest.raises(GpuMemoryHighError) as refused:
        guard.refuse_bulk("embeddings", 2)
    assert refused.value.status_code == 503 and refused.value.code == "gpu_memory_high"
    assert refused.value.headers == {"Retry-After": "10"}, "two intervals: the next reading, and one"
    guard.refuse_bulk("embeddings", 1)  # a single text is served
    for work in ("upsert", "rerank"):
        with pytest.raises(GpuMemoryHighError):
            guard.refuse_bulk(work, 1)  # type: ignore[arg-type]
    assert guard.readiness() == "degraded"
    guard.observe(seen(memory=0.80), [A])
    guard.refuse_bulk("embeddings", 64)
    assert guard.readiness() == "ok"
    messages = [r.getMessage() for r in caplog.records if r.name == "gateway.gpu.protection"]
    assert sum("GPU-a (every triton) degraded" in m for m in messages) == 1
    assert sum("GPU-a (every triton) no longer degraded" in m for m in messages) == 1


def test_one_triton_short_of_memory_loses_the_bulk_calls_while_the_other_serves() -> None:
    guard, _ = protection()
    guard.observe({**seen(A, "GPU-a", memory=0.95), **seen(B, "GPU-b", memory=0.5)}, [A, B])
    guard.refuse_bulk("embeddings", 32)  # the other Triton has room: admitted, and sent there
    assert (guard.rank(A, True), guard.rank(B, True)) == (2, 0)
    assert (guard.rank(A, False), guard.rank(B, False)) == (0, 0), "single texts still go to both"
    guard.observe({**seen(A, "GPU-a", memory=0.95), **seen(B, "GPU-b", memory=0.93)}, [A, B])
    with pytest.raises(GpuMemoryHighError):
        guard.refuse_bulk("embeddings", 32)


def test_a_triton_without_readings_is_not_judged_degraded() -> None:
    guard, _ = protection()
    guard.observe(seen(A, memory=0.95), [A, B])  # B's metrics are stale or missing
    guard.refuse_bulk("upsert", 3)


def test_heat_lowers_the_in_flight_limit_step_by_step_and_restores_it(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="gateway.gpu")
    guard, limits = protection(calls=4)
    for temperature in (70, 86, 87, 88, 89, 84, 79, 79, 79, 79):
        guard.observe(seen(temperature=temperature), [A])
    assert limits == [3, 2, 1, 2, 3, 4]
    assert guard.in_flight_limit == 4
    messages = [r.getMessage() for r in caplog.records if r.name == "gateway.gpu.protection"]
    assert sum(m.startswith("gpu GPU-a (every triton) throttled") for m in messages) == 1
    assert sum(m.startswith("gpu GPU-a (every triton) no longer throttled") for m in messages) == 1
    assert sum(m.startswith("triton in-flight limit") for m in messages) == 6, "one line per step"


def test_a_hot_triton_loses_its_calls_and_the_limit_drops_only_when_every_triton_is_hot() -> None:
    guard, limits = protection(calls=4)
    guard.observe({**seen(A, "GPU-a", temperature=90), **seen(B, "GPU-b", temperature=60)}, [A, B])
    assert (guard.rank(A, False), guard.rank(B, False)) == (1, 0)
    assert limits == []
    guard.observe({**seen(A, "GPU-a", temperature=90), **seen(B, "GPU-b", temperature=90)}, [A, B])
    assert limits == [3], "the fewest steps of any Triton: B's first"


def test_gpus_gone_leave_the_policy_and_no_readings_is_said_once(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="gateway.gpu")
    guard, limits = protection()
    assert guard.readiness() == "unknown"
    guard.observe({}, [A])
    guard.observe({}, [A])
    guard.observe(seen(memory=0.95, temperature=95), [A])
    guard.observe({}, [A])
    guard.refuse_bulk("embeddings", 8)
    assert limits == [3, 4] and guard.readiness() == "unknown"
    messages = [r.getMessage() for r in caplog.records if r.name == "gateway.gpu.protection"]
    assert sum(m.startswith("no GPU readings") for m in messages) == 2, "at the start, and when they went"
    assert sum(m.startswith("gpu policy on") for m in messages) == 1
