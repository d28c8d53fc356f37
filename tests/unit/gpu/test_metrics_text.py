"""The parse of Triton's and the DCGM exporter's Prometheus text: one reading per GPU, the right units, other
families skipped, bad text refused."""

from __future__ import annotations

import pytest

from gateway.gpu.metrics_text import GpuReading, merge_by_gpu, parse_readings
from tests.helpers.gpu_metrics import GIB, MIB, Gpu, dcgm_text, triton_text

FIRST = Gpu()
SECOND = Gpu(uuid="GPU-bc5610b9-79c8-fedd-8899-07539c7f868a", index=1, used_bytes=70 * GIB, temperature=88.0)


def test_triton_text_gives_memory_power_and_utilisation_per_gpu() -> None:
    readings = parse_readings(triton_text([FIRST, SECOND]))
    assert [r.uuid for r in readings] == [FIRST.uuid, SECOND.uuid]
    first = readings[0]
    assert first.source == "triton"
    assert first.memory_used_bytes == 20 * GIB and first.memory_total_bytes == 80 * GIB
    assert first.utilization == pytest.approx(0.35)
    assert first.power_watts == pytest.approx(310.5) and first.power_limit_watts == 700
    assert first.temperature_celsius is None, "Triton's metrics carry no temperature"
    assert first.slowed_for_heat is None
    assert readings[1].memory_fraction() == pytest.approx(70 / 80)


def test_dcgm_text_gives_temperature_reasons_and_framebuffer_in_bytes() -> None:
    hot = Gpu(temperature=91.0, clock_reasons=0x40 | 0x4)
    (reading,) = parse_readings(dcgm_text([hot]))
    assert reading.source == "dcgm"
    assert reading.temperature_celsius == 91
    assert reading.clock_event_reasons == 0x44
    assert reading.slowed_for_heat is True
    assert reading.utilization == pytest.approx(0.35)
    assert reading.memory_used_bytes == 20 * GIB
    # FB_USED + FB_FREE (the driver's reserve is neither): the total DCGM's default counters allow
    assert reading.memory_total_bytes == pytest.approx(80 * GIB - 581 * MIB)
    assert reading.labels == {
        "gpu": "0",
        "device": "nvidia0",
        "modelName": "NVIDIA H100 80GB HBM3",
        "Hostname": "gpu-node-1",
        "pod": "ai-ai-stack-triton-7d9c-x2x4q",
    }


def test_the_power_cap_alone_is_no_heat() -> None:
    at_cap = Gpu(clock_reasons=0x4)  # SW power cap: normal under load
    (reading,) = parse_readings(dcgm_text([at_cap]))
    assert reading.slowed_for_heat is False


def test_dcgm_33_names_the_reasons_clocks_event_reasons() -> None:
    newer = Gpu(clock_reasons=0x20, reasons_field="DCGM_FI_DEV_CLOCKS_EVENT_REASONS")
    (reading,) = parse_readings(dcgm_text([newer]))
    assert reading.clock_event_reasons == 0x20 and reading.slowed_for_heat is True


def test_readings_of_one_gpu_merge_triton_memory_with_dcgm_heat() -> None:
    merged = merge_by_gpu([*parse_readings(dcgm_text([SECOND])), *parse_readings(triton_text([FIRST, SECOND]))])
    assert set(merged) == {FIRST.uuid, SECOND.uuid}
    both = merged[SECOND.uuid]
    assert both.memory_total_bytes == 80 * GIB, "Triton's exact total, not DCGM's MiB"
    assert both.temperature_celsius == 88
    assert both.labels["Hostname"] == "gpu-node-1"
    assert merged[FIRST.uuid].temperature_celsius is None


def test_memory_is_judged_against_the_budget_when_one_is_set() -> None:
    reading = GpuReading("GPU-x", "triton", memory_used_bytes=9 * GIB, memory_total_bytes=80 * GIB)
    assert reading.memory_fraction() == pytest.approx(9 / 80)
    assert reading.memory_fraction(10 * GIB) == pytest.approx(0.9)
    assert reading.memory_fraction(100 * GIB) == pytest.approx(9 / 80), "a budget above the card is the card"


def test_a_cpu_triton_reports_no_gpu_and_other_text_is_refused() -> None:
    assert parse_readings(triton_text([])) == []
    assert parse_readings("") == []
    with pytest.raises(ValueError):
        parse_readings("<html><body>502 Bad Gateway</body></html>\n")
