"""The gateway's GPU metrics parser (`gateway.gpu.metrics_text`) held to live readings.

It needs only prometheus_client, which a lent machine has, so the check runs the gateway's own parse on the text
rendered from NVML (it must give back what NVML read, in the policy's units) and on Triton's live metrics (read
beside an NVML reading of the same moment; those two differ by what changed between the reads).
"""

from __future__ import annotations

import math
from typing import Any

from bench.gpu_check.nvml_readings import GpuReading

# What the parse must give back, in its units, for each NVML reading's field: (parsed field, NVML field, factor).
EXPECTED = (
    ("memory_used_bytes", "memory_used_bytes", 1.0),
    ("memory_total_bytes", "memory_total_bytes", 1.0),
    ("utilization", "utilization_percent", 0.01),
    ("power_watts", "power_watts", 1.0),
    ("power_limit_watts", "power_limit_watts", 1.0),
    ("temperature_celsius", "temperature_celsius", 1.0),
    ("clock_event_reasons", "clock_event_reasons", 1.0),
)


def parsed_readings(text: str) -> dict[str, Any]:
    """The parser's merged reading per GPU UUID (as dicts), or why the parser cannot run here."""
    try:
        from gateway.gpu.metrics_text import merge_by_gpu, parse_readings
    except ImportError as exc:
        return {"unavailable": f"the gateway's GPU metrics parser does not import here: {exc}"}
    merged = merge_by_gpu(parse_readings(text))
    return {uuid: {name: getattr(r, name) for name, _, _ in EXPECTED} for uuid, r in merged.items()}


def agreement(readings: list[GpuReading], text: str) -> dict[str, Any]:
    """Whether the parse of `text` (rendered from `readings`) gives back every figure NVML read."""
    parsed = parsed_readings(text)
    if "unavailable" in parsed:
        return parsed
    mismatches: dict[str, dict[str, Any]] = {}
    for reading in readings:
        got = parsed.get(reading.uuid)
        if got is None:
            mismatches[reading.uuid] = {"missing": "the parse has no reading of this GPU"}
            continue
        for name, source, factor in EXPECTED:
            wanted = getattr(reading, source)
            if wanted is not None and not _close(wanted * factor, got[name]):
                mismatches.setdefault(reading.uuid, {})[name] = {"nvml": wanted * factor, "parsed": got[name]}
    return {"agrees": not mismatches, "mismatches": mismatches, "parsed": parsed}


def _close(wanted: float, got: float | None) -> bool:
    # The text carries six decimals and DCGM's framebuffer in MiB; Triton's bytes are kept over DCGM's.
    return got is not None and math.isclose(wanted, got, rel_tol=1e-6, abs_tol=1e-5)
