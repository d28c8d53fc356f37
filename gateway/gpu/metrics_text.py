"""One reading per GPU from the Prometheus text of Triton's metrics endpoint or of the DCGM exporter.

Triton (per GPU, label `gpu_uuid`): `nv_gpu_memory_used_bytes`, `nv_gpu_memory_total_bytes`, `nv_gpu_utilization`
(0-1), `nv_gpu_power_usage` and `nv_gpu_power_limit` (W); no temperature. The DCGM exporter (labels `gpu`, `UUID`,
`device`, `modelName`, `Hostname`, and the pod's where it runs in Kubernetes mode): `DCGM_FI_DEV_GPU_TEMP` (°C),
`DCGM_FI_DEV_FB_USED` / `_FREE` / `_TOTAL` (MiB), `DCGM_FI_DEV_POWER_USAGE` (W), `DCGM_FI_DEV_GPU_UTIL` (%), and the
clock-throttle reasons, NVML's bit mask, as `DCGM_FI_DEV_CLOCK_THROTTLE_REASONS` or, since DCGM 3.3,
`DCGM_FI_DEV_CLOCKS_EVENT_REASONS` (not among the exporter's default counters: the chart's docs say how to add it).
Other families (Triton's per-model metrics, DCGM's other counters) are skipped.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, fields, replace
from typing import Literal

from prometheus_client.parser import text_string_to_metric_families

Source = Literal["triton", "dcgm"]
MIB = 1 << 20

# NVML's clock event (throttle) reasons that mean heat or a hardware slowdown: HW slowdown (0x8), SW thermal
# slowdown (0x20), HW thermal slowdown (0x40), HW power brake (0x80). SW power cap (0x4) is left out: a GPU at its
# power cap under load is working as designed; idle (0x1), application clocks (0x2), sync boost (0x10) and display
# clocks (0x100) say nothing about heat.
HEAT_REASONS = 0x08 | 0x20 | 0x40 | 0x80

TRITON_FIELDS = {
    "nv_gpu_memory_used_bytes": "memory_used_bytes",
    "nv_gpu_memory_total_bytes": "memory_total_bytes",
    "nv_gpu_utilization": "utilization",
    "nv_gpu_power_usage": "power_watts",
    "nv_gpu_power_limit": "power_limit_watts",
}
DCGM_FIELDS = {
    "DCGM_FI_DEV_GPU_TEMP": "temperature_celsius",
    "DCGM_FI_DEV_POWER_USAGE": "power_watts",
    "DCGM_FI_DEV_GPU_UTIL": "utilization",
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": "clock_event_reasons",
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": "clock_event_reasons",
}
DCGM_MEMORY = ("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_RESERVED", "DCGM_FI_DEV_FB_TOTAL")


@dataclass(frozen=True)
class GpuReading:
    """What one endpoint says of one GPU; None where it says nothing."""

    uuid: str
    source: Source
    memory_used_bytes: float | None = None
    memory_total_bytes: float | None = None
    utilization: float | None = None  # 0-1
    power_watts: float | None = None
    power_limit_watts: float | None = None
    temperature_celsius: float | None = None
    clock_event_reasons: int | None = None  # NVML's bit mask
    labels: dict[str, str] = field(default_factory=dict, compare=False)  # DCGM's gpu, modelName, Hostname, ...

    @property
    def slowed_for_heat(self) -> bool | None:
        return None if self.clock_event_reasons is None else bool(self.clock_event_reasons & HEAT_REASONS)

    def memory_fraction(self, budget_bytes: int = 0) -> float | None:
        """Used memory over `budget_bytes` (0: over the GPU's total; a budget above the total counts as the total)."""
        used, total = self.memory_used_bytes, self.memory_total_bytes
        if used is None or not total:
            return None
        return used / (min(total, budget_bytes) if budget_bytes > 0 else total)

    def merged(self, other: GpuReading) -> GpuReading:
        """This reading with what `other` adds: Triton's memory figures (bytes, and Triton's view) are kept over
        DCGM's, DCGM's temperature and reasons are taken, either one's where only one has it."""
        first, second = (self, other) if self.source == "triton" else (other, self)
        values = {f.name: getattr(first, f.name) for f in fields(GpuReading) if f.name not in ("uuid", "source")}
        for name, value in values.items():
            if value is None or (name == "labels" and not value):
                values[name] = getattr(second, name)
        return replace(first, **values)


def parse_readings(text: str) -> list[GpuReading]:
    """Every GPU `text` reports, one reading each, in the order first seen; raises ValueError on text that is not
    Prometheus' exposition format. Runs in a worker thread: a DCGM exporter of many GPUs serves hundreds of KB."""
    found: dict[tuple[Source, str], dict[str, object]] = {}
    dcgm_memory: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name, labels = sample.name, sample.labels
            if name in TRITON_FIELDS and labels.get("gpu_uuid"):
                values = found.setdefault(("triton", labels["gpu_uuid"]), {})
                values.setdefault(TRITON_FIELDS[name], float(sample.value))
            elif name.startswith("DCGM_FI_") and labels.get("UUID"):
                uuid = labels["UUID"]
                values = found.setdefault(("dcgm", uuid), {"labels": _dcgm_labels(labels)})
                if name in DCGM_FIELDS:
                    values.setdefault(DCGM_FIELDS[name], _dcgm_value(name, float(sample.value)))
                elif name in DCGM_MEMORY:
                    dcgm_memory.setdefault(uuid, {}).setdefault(name, float(sample.value))
    readings = []
    for (source, uuid), values in found.items():
        if source == "dcgm":
            values |= _dcgm_memory(dcgm_memory.get(uuid, {}))
        readings.append(GpuReading(uuid, source, **values))  # type: ignore[arg-type]
    return readings


def merge_by_gpu(readings: Iterable[GpuReading]) -> dict[str, GpuReading]:
    """One reading per GPU UUID from every endpoint's readings of it (Triton's and DCGM's of the same GPU)."""
    merged: dict[str, GpuReading] = {}
    for reading in readings:
        known = merged.get(reading.uuid)
        merged[reading.uuid] = reading if known is None else known.merged(reading)
    return merged


def _dcgm_value(name: str, value: float) -> float | int:
    if name == "DCGM_FI_DEV_GPU_UTIL":
        return value / 100
    if "REASONS" in name:
        return int(value)
    return value


def _dcgm_memory(values: dict[str, float]) -> dict[str, float]:
    """DCGM's framebuffer figures (MiB) as bytes; the total is FB_TOTAL where exported, else used + free + reserved."""
    used = values.get("DCGM_FI_DEV_FB_USED")
    if used is None:
        return {}
    total = values.get("DCGM_FI_DEV_FB_TOTAL")
    if total is None and "DCGM_FI_DEV_FB_FREE" in values:
        total = used + values["DCGM_FI_DEV_FB_FREE"] + values.get("DCGM_FI_DEV_FB_RESERVED", 0.0)
    memory = {"memory_used_bytes": used * MIB}
    if total:
        memory["memory_total_bytes"] = total * MIB
    return memory


def _dcgm_labels(labels: dict[str, str]) -> dict[str, str]:
    return {key: labels[key] for key in ("gpu", "device", "modelName", "Hostname", "pod") if labels.get(key)}
