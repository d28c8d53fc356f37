"""The GPU state the gateway's GPU policy acts on, read through NVML and written as the Prometheus text it parses.

The gateway reads this state from Triton's metrics endpoint (`nv_gpu_*`, labelled `gpu_uuid`) and, where deployed,
from NVIDIA's DCGM exporter (`DCGM_FI_DEV_*`, labelled `gpu`, `UUID`, `pci_bus_id`, `device`, `modelName`,
`Hostname`). Both take their numbers from NVML; this module reads the same numbers and renders them in both
shapes, with the units each uses (Triton: bytes, a 0-1 utilisation, watts; DCGM: MiB, percent, watts, a bit mask
of clock-event reasons under its old and its new name), so the gateway's parser can be held to live readings.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from bench.gpu_check.steps import StepSkipped

# NVML's clock-event (formerly "throttle") reason bits, which DCGM_FI_DEV_CLOCK_THROTTLE_REASONS also carries.
CLOCK_EVENT_REASONS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
MIB = 1 << 20


@dataclass(frozen=True)
class GpuReading:
    """One GPU at one moment; a field NVML does not support on this GPU is None."""

    index: int
    uuid: str
    name: str
    pci_bus_id: str
    memory_used_bytes: int
    memory_total_bytes: int
    utilization_percent: float | None
    temperature_celsius: float | None
    power_watts: float | None
    power_limit_watts: float | None
    clock_event_reasons: int | None
    sm_clock_mhz: float | None
    energy_millijoules: float | None = None
    at: float = field(default_factory=time.monotonic)

    def as_dict(self) -> dict[str, Any]:
        reasons = None if self.clock_event_reasons is None else reason_names(self.clock_event_reasons)
        return {**asdict(self), "clock_event_reason_names": reasons}


def reason_names(mask: int) -> list[str]:
    return [name for bit, name in CLOCK_EVENT_REASONS.items() if mask & bit] + (
        [f"unknown_0x{mask & ~sum(CLOCK_EVENT_REASONS):x}"] if mask & ~sum(CLOCK_EVENT_REASONS) else []
    )


def open_nvml() -> Any:
    """pynvml, initialised; StepSkipped says why there is no NVML here (no package, no driver, no GPU)."""
    try:
        import pynvml
    except ImportError:
        raise StepSkipped("no GPU readings: nvidia-ml-py (pynvml) is not installed") from None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        raise StepSkipped(f"no GPU: NVML did not initialise ({exc})") from None
    if pynvml.nvmlDeviceGetCount() == 0:
        raise StepSkipped("no GPU: NVML sees no device")
    return pynvml


def driver_version(nvml: Any) -> str:
    return _text(nvml.nvmlSystemGetDriverVersion())


def read_gpus(nvml: Any) -> list[GpuReading]:
    return [read_gpu(nvml, index) for index in range(nvml.nvmlDeviceGetCount())]


def read_gpu(nvml: Any, index: int) -> GpuReading:
    handle = nvml.nvmlDeviceGetHandleByIndex(index)

    def optional(read: Any, *args: Any) -> Any:
        if read is None:  # not in this pynvml
            return None
        try:
            return read(handle, *args)
        except nvml.NVMLError:  # not supported on this GPU
            return None

    memory = nvml.nvmlDeviceGetMemoryInfo(handle)
    utilization = optional(nvml.nvmlDeviceGetUtilizationRates)
    power = optional(nvml.nvmlDeviceGetPowerUsage)
    limit = optional(nvml.nvmlDeviceGetEnforcedPowerLimit)
    # NVML renamed the call with the reasons (clock "events", formerly "throttle reasons"); either gives the mask.
    reasons = optional(getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None))
    if reasons is None:
        reasons = optional(getattr(nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None))
    return GpuReading(
        index=index,
        uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
        name=_text(nvml.nvmlDeviceGetName(handle)),
        pci_bus_id=_text(nvml.nvmlDeviceGetPciInfo(handle).busId),
        memory_used_bytes=int(memory.used),
        memory_total_bytes=int(memory.total),
        utilization_percent=None if utilization is None else float(utilization.gpu),
        temperature_celsius=optional(nvml.nvmlDeviceGetTemperature, nvml.NVML_TEMPERATURE_GPU),
        power_watts=None if power is None else power / 1000.0,
        power_limit_watts=None if limit is None else limit / 1000.0,
        clock_event_reasons=reasons,
        sm_clock_mhz=optional(nvml.nvmlDeviceGetClockInfo, nvml.NVML_CLOCK_SM),
        energy_millijoules=optional(nvml.nvmlDeviceGetTotalEnergyConsumption),
    )


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def triton_text(readings: list[GpuReading]) -> str:
    """Triton's GPU metrics (its metrics port, /metrics) for these readings."""
    families = [
        ("nv_gpu_utilization", "gauge", "GPU utilization rate [0.0 - 1.0)", _scaled("utilization_percent", 0.01)),
        ("nv_gpu_memory_total_bytes", "gauge", "GPU total memory, in bytes", _scaled("memory_total_bytes", 1)),
        ("nv_gpu_memory_used_bytes", "gauge", "GPU used memory, in bytes", _scaled("memory_used_bytes", 1)),
        ("nv_gpu_power_usage", "gauge", "GPU power usage in watts", _scaled("power_watts", 1)),
        ("nv_gpu_power_limit", "gauge", "GPU power management limit in watts", _scaled("power_limit_watts", 1)),
        (
            "nv_energy_consumption",
            "counter",
            "GPU energy consumption in joules since the Triton Server started",
            _scaled("energy_millijoules", 0.001),
        ),
    ]
    return _render(families, readings, lambda r: {"gpu_uuid": r.uuid})


def dcgm_text(readings: list[GpuReading], hostname: str | None = None, driver: str | None = None) -> str:
    """The DCGM exporter's default counters that the policy reads, for these readings."""
    host = hostname or socket.gethostname()
    families = [
        ("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C).", _scaled("temperature_celsius", 1)),
        ("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W).", _scaled("power_watts", 1)),
        ("DCGM_FI_DEV_POWER_MGMT_LIMIT", "gauge", "Power management limit (in W).", _scaled("power_limit_watts", 1)),
        ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %).", _scaled("utilization_percent", 1)),
        ("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB).", _mib("memory_used_bytes")),
        ("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB).", _free_mib),
        ("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz).", _scaled("sm_clock_mhz", 1)),
        # dcgm-exporter names the reasons mask by DCGM's field: CLOCK_THROTTLE_REASONS up to DCGM 3.x, then
        # CLOCKS_EVENT_REASONS; both are written so that the parser is checked on either.
        (
            "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
            "gauge",
            "Current clock throttle reasons.",
            _scaled("clock_event_reasons", 1),
        ),
        (
            "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
            "gauge",
            "Current clock event reasons.",
            _scaled("clock_event_reasons", 1),
        ),
    ]

    def labels(reading: GpuReading) -> dict[str, str]:
        return {
            "gpu": str(reading.index),
            "UUID": reading.uuid,
            "pci_bus_id": reading.pci_bus_id,
            "device": f"nvidia{reading.index}",
            "modelName": reading.name,
            "Hostname": host,
            **({"DCGM_FI_DRIVER_VERSION": driver} if driver else {}),
        }

    return _render(families, readings, labels)


def _scaled(name: str, factor: float) -> Any:
    def value(reading: GpuReading) -> float | None:
        raw = getattr(reading, name)
        return None if raw is None else raw * factor

    return value


def _mib(name: str) -> Any:
    return lambda reading: getattr(reading, name) // MIB


def _free_mib(reading: GpuReading) -> int:
    return (reading.memory_total_bytes - reading.memory_used_bytes) // MIB


def _render(families: list[tuple[str, str, str, Any]], readings: list[GpuReading], labels: Any) -> str:
    lines: list[str] = []
    for name, kind, help_text, value in families:
        samples = [(labels(r), value(r)) for r in readings]
        samples = [(tags, number) for tags, number in samples if number is not None]
        if not samples:  # as the exporters do: a field no GPU supports is left out
            continue
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
        lines += [f"{name}{{{_labels(tags)}}} {_number(number)}" for tags, number in samples]
    return "\n".join(lines) + "\n"


def _labels(tags: dict[str, str]) -> str:
    escaped = {k: v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") for k, v in tags.items()}
    return ",".join(f'{key}="{value}"' for key, value in escaped.items())


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:.6f}"


def check_text(text: str) -> int:
    """Samples in `text` as prometheus_client's parser reads it (what the gateway uses); raises if malformed."""
    from prometheus_client.parser import text_string_to_metric_families

    return sum(len(family.samples) for family in text_string_to_metric_families(text))


class Sampler:
    """Reads every GPU twice a second on a thread while loads run; `peaks` summarises a window of it."""

    def __init__(self, nvml: Any, interval_seconds: float = 0.5) -> None:
        self._nvml = nvml
        self._interval = interval_seconds
        self._samples: list[GpuReading] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="nvml-sampler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            with contextlib.suppress(Exception):  # a failed read is a gap, not an end of the sampling
                self._samples.extend(read_gpus(self._nvml))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)

    def peaks(self, since: float, until: float | None = None) -> dict[str, Any]:
        """Per GPU, the highest memory, utilisation, temperature and power between `since` and `until`
        (`time.monotonic()` values), the clock-event reasons seen, and the reading of the highest power."""
        end = until if until is not None else time.monotonic()
        window = [s for s in list(self._samples) if since <= s.at <= end]
        summary: dict[str, Any] = {"samples": len(window), "gpus": {}}
        for index in sorted({s.index for s in window}):
            mine = [s for s in window if s.index == index]
            mask = 0
            for s in mine:
                mask |= s.clock_event_reasons or 0
            summary["gpus"][str(index)] = {
                "max_memory_used_bytes": max(s.memory_used_bytes for s in mine),
                "max_utilization_percent": _highest(s.utilization_percent for s in mine),
                "max_temperature_celsius": _highest(s.temperature_celsius for s in mine),
                "max_power_watts": _highest(s.power_watts for s in mine),
                "power_limit_watts": mine[-1].power_limit_watts,
                "clock_event_reasons_seen": reason_names(mask),
            }
        return summary

    def hottest(self, since: float) -> list[GpuReading]:
        """Per GPU, the reading of the highest power since `since`: the load's state, for the Prometheus text."""
        window = [s for s in list(self._samples) if s.at >= since]
        best: dict[int, GpuReading] = {}
        for s in window:
            if s.index not in best or (s.power_watts or 0) > (best[s.index].power_watts or 0):
                best[s.index] = s
        return [best[i] for i in sorted(best)]


def _highest(values: Any) -> float | None:
    present = [v for v in values if v is not None]
    return max(present) if present else None
