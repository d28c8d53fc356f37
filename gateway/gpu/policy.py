"""The state of one GPU, judged from its readings one interval at a time, with hysteresis so that it does not flap.

    normal ──memory above GPU_MEMORY_DEGRADE_FRACTION──> degraded ──below it minus 0.05──> normal
    normal ──hotter than GPU_TEMPERATURE_THROTTLE_CELSIUS, or slowed for heat──> throttled (1 step)
    throttled: each interval still hot: one step more (up to `max_steps`); between the two temperatures: held;
               cooler than the threshold minus 5 °C and not slowed: one step less; at 0 steps: normal

Degraded and throttled are independent: a GPU may be both. A step is one call off the gateway's in-flight limit for
Triton calls (`protection`). A reading that lacks a figure (no memory, no temperature: Triton's metrics carry none)
lifts the state that figure drives: missing metrics never hold traffic back.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from gateway.gpu.metrics_text import GpuReading
from gateway.settings.gpu import MEMORY_RECOVERY_MARGIN, TEMPERATURE_RECOVERY_MARGIN, GpuSettings


class GpuState(StrEnum):
    NORMAL = "normal"
    DEGRADED = "degraded"  # memory high: new uncached bulk work refused
    THROTTLED = "throttled"  # hot: fewer Triton calls in flight


@dataclass(frozen=True)
class Thresholds:
    degrade_fraction: float = 0.9
    throttle_celsius: float = 85.0
    memory_budget_bytes: int = 0  # 0: the GPU's total
    max_steps: int = 3  # the in-flight limit's steps down to 1 call (TRITON_MAX_IN_FLIGHT_CALLS - 1)

    @classmethod
    def of(cls, settings: GpuSettings, max_in_flight_calls: int) -> Thresholds:
        return cls(
            degrade_fraction=settings.memory_degrade_fraction,
            throttle_celsius=settings.temperature_throttle_celsius,
            memory_budget_bytes=settings.memory_budget_bytes,
            max_steps=max(0, max_in_flight_calls - 1),
        )

    @property
    def recover_fraction(self) -> float:
        return self.degrade_fraction - MEMORY_RECOVERY_MARGIN

    @property
    def cool_celsius(self) -> float:
        return self.throttle_celsius - TEMPERATURE_RECOVERY_MARGIN


@dataclass(frozen=True)
class Change:
    """A state entered (`entered` True) or left, and the reading that decided it, for the log."""

    state: GpuState
    entered: bool
    why: str


class GpuPolicy:
    """One GPU's states; `observe` each interval's reading of it."""

    def __init__(self, thresholds: Thresholds) -> None:
        self._thresholds = thresholds
        self.degraded = False
        self.throttled = False
        self.steps = 0  # calls taken off the in-flight limit while throttled
        self.memory_fraction: float | None = None
        self.temperature: float | None = None

    @property
    def states(self) -> set[GpuState]:
        states = {GpuState.DEGRADED} if self.degraded else set()
        if self.throttled:
            states.add(GpuState.THROTTLED)
        return states or {GpuState.NORMAL}

    def observe(self, reading: GpuReading) -> list[Change]:
        """The changes this reading makes (none most intervals)."""
        self.memory_fraction = reading.memory_fraction(self._thresholds.memory_budget_bytes)
        self.temperature = reading.temperature_celsius
        changes = [self._judge_memory()]
        changes.append(self._judge_heat(reading))
        return [change for change in changes if change is not None]

    def release(self, why: str) -> list[Change]:
        """Leave every state: the GPU's readings are gone."""
        changes = []
        if self.degraded:
            changes.append(Change(GpuState.DEGRADED, False, why))
        if self.throttled:
            changes.append(Change(GpuState.THROTTLED, False, why))
        self.degraded, self.throttled, self.steps = False, False, 0
        return changes

    def _judge_memory(self) -> Change | None:
        fraction, limits = self.memory_fraction, self._thresholds
        if fraction is None:
            if self.degraded:
                self.degraded = False
                return Change(GpuState.DEGRADED, False, "its memory is no longer reported")
            return None
        if not self.degraded and fraction > limits.degrade_fraction:
            self.degraded = True
            return Change(
                GpuState.DEGRADED, True, f"memory {fraction:.0%} of its budget > {limits.degrade_fraction:.0%}"
            )
        if self.degraded and fraction < limits.recover_fraction:
            self.degraded = False
            return Change(
                GpuState.DEGRADED, False, f"memory {fraction:.0%} of its budget < {limits.recover_fraction:.0%}"
            )
        return None

    def _judge_heat(self, reading: GpuReading) -> Change | None:
        temperature, slowed, limits = reading.temperature_celsius, reading.slowed_for_heat, self._thresholds
        if temperature is None and slowed is None:
            if self.throttled:
                self.throttled, self.steps = False, 0
                return Change(GpuState.THROTTLED, False, "its temperature is no longer reported")
            return None
        hot = bool(slowed) or (temperature is not None and temperature > limits.throttle_celsius)
        cool = not slowed and (temperature is None or temperature < limits.cool_celsius)
        why = _heat(temperature, slowed)
        if hot:
            self.steps = min(self.steps + 1, limits.max_steps)
            if not self.throttled:
                self.throttled = True
                return Change(GpuState.THROTTLED, True, f"{why} (throttled above {limits.throttle_celsius:g} °C)")
        elif cool and self.throttled:
            self.steps = max(0, self.steps - 1)
            if self.steps == 0:
                self.throttled = False
                return Change(GpuState.THROTTLED, False, f"{why} (cool below {limits.cool_celsius:g} °C)")
        return None


def _heat(temperature: float | None, slowed: bool | None) -> str:
    parts = [] if temperature is None else [f"{temperature:g} °C"]
    if slowed:
        parts.append("clocks slowed for heat")
    return ", ".join(parts) or "no heat reported"
