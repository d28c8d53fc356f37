"""What the GPUs' states do to the gateway's calls, per Triton: each GPU serves one Triton address of TRITON_URL (or
all of them, `ALL`), and a state acts on the calls to that Triton while the others keep serving.

- degraded (memory high): calls of more than one text avoid that Triton while another is in rotation; once every
  Triton is degraded (or a GPU that governs all calls is), new uncached bulk work is refused with 503
  `gpu_memory_high` and Retry-After: embeddings of more than one uncached text, document upserts (chunked ones) and
  reranks. Single texts, search queries and cached answers are still served.
- throttled (hot): calls avoid that Triton while a cooler one is in rotation; once every Triton is throttled (or a
  GPU that governs all calls is), the in-flight limit of the embedding calls (TRITON_MAX_IN_FLIGHT_CALLS, the
  coalescer's: reranks and chunker calls are not limited) is lowered by the fewest steps any of them has taken, down
  to 1, and raised back as they cool.

`/readyz` reports `gpu: degraded` while any GPU is degraded or throttled, and stays 200: every replica reads the same
GPUs, and going unready together would take the whole service down for a state that only sheds bulk work.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from contextlib import suppress
from dataclasses import dataclass
from typing import Literal

from prometheus_client import Gauge

from gateway import metrics
from gateway.errors import UpstreamUnavailableError
from gateway.gpu.metrics_text import GpuReading
from gateway.gpu.policy import Change, GpuPolicy, GpuState, Thresholds
from gateway.settings.gpu import GpuSettings

log = logging.getLogger(__name__)

ALL = "*"  # the scope of a GPU that governs the calls to every Triton
GpuWork = Literal["embeddings", "upsert", "rerank"]
GpuReadiness = Literal["ok", "degraded", "unknown"]


class GpuMemoryHighError(UpstreamUnavailableError):
    """The GPU memory of every Triton is above `GPU_MEMORY_DEGRADE_FRACTION` of its budget, and the request is new
    uncached bulk work: embeddings of more than one uncached text, a document upsert, a rerank. Single texts, search
    queries and cached answers are still served.

    Do: client: retry after `Retry-After` seconds, or send texts one at a time meanwhile; operator: find what fills
    the GPU (`gateway_gpu_memory_used_ratio`, Triton's `nv_gpu_memory_used_bytes`): another process or model on it,
    or arena caps (`gpu_mem_limit`) too large for `GPU_MEMORY_BUDGET_BYTES`; more Triton replicas or GPUs
    (docs/operations.md, "GPU states").
    """

    code = "gpu_memory_high"

    def __init__(self, message: str, *, retry_after: int) -> None:
        super().__init__(message, headers={"Retry-After": str(retry_after)})


@dataclass(frozen=True)
class SeenGpu:
    """A GPU read this interval, and the Triton it serves: an address of TRITON_URL, or `ALL`."""

    reading: GpuReading
    scope: str


class GpuProtection:
    """The GPUs' states, fed by the poller each interval (`observe`) and read by every request (`refuse_bulk`,
    `rank`); the in-flight limit goes to the listeners `on_limit` registers."""

    def __init__(self, settings: GpuSettings, max_in_flight_calls: int) -> None:
        self._thresholds = Thresholds.of(settings, max_in_flight_calls)
        self._base_limit = max_in_flight_calls
        self._retry_after = max(1, math.ceil(2 * settings.metrics_interval_seconds))  # the next reading, and one
        self._gpus: dict[str, tuple[str, GpuPolicy]] = {}  # uuid -> (scope, policy)
        self._tritons: list[str] = []
        self._limit = max_in_flight_calls
        self._listeners: list[Callable[[int], None]] = []
        self._has_readings: bool | None = None  # None until the first interval
        self._told_no_temperature = False
        metrics.TRITON_IN_FLIGHT_LIMIT.set(max_in_flight_calls)

    @property
    def in_flight_limit(self) -> int:
        return self._limit

    def on_limit(self, listener: Callable[[int], None]) -> None:
        """Call `listener` with the in-flight limit for embedding calls each time it changes."""
        self._listeners.append(listener)

    def observe(self, seen: Mapping[str, SeenGpu], tritons: list[str]) -> None:
        """This interval's GPUs (by UUID; those not fresh are absent) and Triton's addresses now."""
        self._tritons = list(tritons)
        for uuid in [u for u in self._gpus if u not in seen]:
            scope, policy = self._gpus.pop(uuid)
            self._log(uuid, scope, policy.release("its metrics are stale or gone"))
            _forget(uuid)
        for uuid, gpu in seen.items():
            known = self._gpus.get(uuid)
            if known is None or known[0] != gpu.scope:
                known = (gpu.scope, known[1] if known else GpuPolicy(self._thresholds))
                self._gpus[uuid] = known
            self._log(uuid, gpu.scope, known[1].observe(gpu.reading))
            _publish(uuid, known[1])
        self._tell_readings(seen)
        self._set_limit(self._limit_now())

    def refuse_bulk(self, work: GpuWork, texts: int) -> None:
        """Raise `GpuMemoryHighError` where `work` of `texts` texts is bulk and no Triton has memory to spare."""
        if work == "embeddings" and texts <= 1:
            return
        if not self._every_triton(lambda policies: any(p.degraded for p in policies)):
            return
        metrics.GPU_REFUSALS.labels(work=work).inc()
        noun = "texts" if texts != 1 else "text"
        raise GpuMemoryHighError(
            f"GPU memory is high on every Triton: new uncached bulk work ({work}, {texts} {noun}) is refused; "
            f"single texts and cached answers are served; retry after {self._retry_after} s",
            retry_after=self._retry_after,
        )

    def rank(self, address: str, bulk: bool) -> int:
        """How much a call should avoid the Triton at `address` (0: not at all): calls go to the lowest rank in
        rotation. A degraded Triton is avoided by calls of more than one text, a throttled one by every call."""
        policies = self._policies(address)
        degraded = bulk and any(p.degraded for p in policies)
        return 2 * degraded + any(p.throttled for p in policies)

    def readiness(self) -> GpuReadiness:
        if not self._gpus:
            return "unknown"
        if any(policy.states != {GpuState.NORMAL} for _, policy in self._gpus.values()):
            return "degraded"
        return "ok"

    def _policies(self, scope: str) -> list[GpuPolicy]:
        return [policy for gpu_scope, policy in self._gpus.values() if gpu_scope == scope]

    def _every_triton(self, judged: Callable[[list[GpuPolicy]], bool]) -> bool:
        """Whether the GPUs that govern all calls are `judged` so, or every Triton's GPUs are."""
        if judged(self._policies(ALL)):
            return True
        return bool(self._tritons) and all(judged(self._policies(address)) for address in self._tritons)

    def _limit_now(self) -> int:
        steps = max((p.steps for p in self._policies(ALL) if p.throttled), default=0)
        tritons = [self._policies(address) for address in self._tritons]
        if tritons and all(any(p.throttled for p in policies) for policies in tritons):
            steps = max(steps, min(max(p.steps for p in policies) for policies in tritons))
        return max(1, self._base_limit - steps)

    def _set_limit(self, limit: int) -> None:
        if limit == self._limit:
            return
        lowered = limit < self._limit
        self._limit = limit
        metrics.TRITON_IN_FLIGHT_LIMIT.set(limit)
        log.log(
            logging.WARNING if lowered else logging.INFO,
            "triton in-flight limit %s to %d of %d: %s",
            "lowered" if lowered else "raised",
            limit,
            self._base_limit,
            "throttled for heat" if lowered else "cooling" if limit < self._base_limit else "cooled: restored",
        )
        for listener in self._listeners:
            listener(limit)

    def _log(self, uuid: str, scope: str, changes: list[Change]) -> None:
        serving = "every triton" if scope == ALL else f"triton {scope}"
        for change in changes:
            if change.entered:
                log.warning("gpu %s (%s) %s: %s", uuid, serving, change.state, change.why)
            else:
                log.info("gpu %s (%s) no longer %s: %s", uuid, serving, change.state, change.why)

    def _tell_readings(self, seen: Mapping[str, SeenGpu]) -> None:
        """State once that there is no GPU policy (no readings), and once that there is one again."""
        has = bool(seen)
        if has != self._has_readings:
            if has:
                log.info("gpu policy on: %d GPU(s) read from GPU_METRICS_URLS", len(seen))
            else:
                log.warning("no GPU readings from GPU_METRICS_URLS: no GPU policy (traffic is not held back)")
        self._has_readings = has
        heat = [
            g
            for g in seen.values()
            if g.reading.temperature_celsius is not None or g.reading.slowed_for_heat is not None
        ]
        if has and not heat and not self._told_no_temperature:
            self._told_no_temperature = True
            log.info("no GPU temperature read (Triton's metrics carry none; add the DCGM exporter's endpoint to "
                     "GPU_METRICS_URLS): GPUs are not throttled for heat")  # fmt: skip


def _publish(uuid: str, policy: GpuPolicy) -> None:
    states = policy.states
    for state in GpuState:
        metrics.GPU_STATE.labels(gpu=uuid, state=state.value).set(1 if state in states else 0)
    figures = ((metrics.GPU_MEMORY_USED_RATIO, policy.memory_fraction), (metrics.GPU_TEMPERATURE, policy.temperature))
    for gauge, value in figures:
        if value is None:
            _remove(gauge, uuid)
        else:
            gauge.labels(gpu=uuid).set(value)


def _forget(uuid: str) -> None:
    for state in GpuState:
        _remove(metrics.GPU_STATE, uuid, state.value)
    _remove(metrics.GPU_MEMORY_USED_RATIO, uuid)
    _remove(metrics.GPU_TEMPERATURE, uuid)


def _remove(gauge: Gauge, *labels: str) -> None:
    with suppress(KeyError):  # never set
        gauge.remove(*labels)
