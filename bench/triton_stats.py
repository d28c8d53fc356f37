"""What Triton saw during one measurement: calls per text, the model's dynamic batches, how busy it was.

Read from Triton's statistics extension (`GET /v2/models/<model>/stats`) just before and just after a load;
the difference covers that load alone. `inference_stats` sum over requests (a batch of three requests adds
its compute time three times), so the time the model was busy comes from `batch_stats`, which count
each execution once.
"""

from __future__ import annotations

import asyncio
import json
import math
import urllib.request
from dataclasses import dataclass, fields
from typing import Any

ENSEMBLE = "bge"  # what the gateway and the Triton clients call
MODEL = "bge_onnx"  # the encoder behind it, where the dynamic batches form
TOKENIZER = "bge_tokenizer"  # the ensemble's first step
MODELS = (ENSEMBLE, MODEL)
PHASES = ("compute_input", "compute_infer", "compute_output")
SETTLE_READS = 20  # snapshots around a load, until two agree
SETTLE_PAUSE_SECONDS = 0.02


@dataclass(frozen=True)
class ModelCounters:
    """One model's cumulative statistics (all versions of it summed)."""

    requests: int = 0  # successful requests
    rows: int = 0  # batch rows inferred (texts, for the encoder)
    executions: int = 0
    queue_ns: int = 0  # summed over requests
    busy_ns: int = 0  # summed over executions

    @classmethod
    def from_stats(cls, payload: dict[str, Any]) -> ModelCounters:
        total = cls()
        for stats in payload.get("model_stats", []):
            inference = stats["inference_stats"]
            busy = sum(int(batch[phase]["ns"]) for batch in stats.get("batch_stats", []) for phase in PHASES)
            total += cls(
                requests=int(inference["success"]["count"]),
                rows=int(stats["inference_count"]),
                executions=int(stats["execution_count"]),
                queue_ns=int(inference["queue"]["ns"]),
                busy_ns=busy,
            )
        return total

    def __add__(self, other: ModelCounters) -> ModelCounters:
        return ModelCounters(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(self)))

    def __sub__(self, other: ModelCounters) -> ModelCounters:
        return ModelCounters(*(getattr(self, f.name) - getattr(other, f.name) for f in fields(self)))


def load_counters(ensemble: ModelCounters, model: ModelCounters, texts: int, seconds: float) -> dict[str, float]:
    """One load's Triton figures, from the two models' counters over it (NaN where nothing was counted)."""
    nan = math.nan
    return {
        "triton_calls_per_text": ensemble.requests / texts if texts else nan,
        "model_batch": model.rows / model.executions if model.executions else nan,
        "model_busy_percent": 100 * model.busy_ns / (seconds * 1e9) if seconds > 0 else nan,
        "model_queue_ms": model.queue_ns / model.requests / 1e6 if model.requests else nan,
    }


class TritonStats:
    """Snapshots of the ensemble's and the encoder's statistics from Triton's HTTP endpoint."""

    def __init__(self, base_url: str, timeout_seconds: float = 5.0) -> None:
        self._base_url = base_url.rstrip("/")
        self._timeout = timeout_seconds

    async def snapshot(self) -> dict[str, ModelCounters]:
        return {name: ModelCounters.from_stats(await asyncio.to_thread(self._fetch, name)) for name in MODELS}

    async def settled(self) -> dict[str, ModelCounters]:
        """A snapshot once two in a row agree. Triton counts a request when it releases it, which may be just
        after its client has the answer: read at once, the last requests of a load (or of its warm-up) may be
        missing, and would then be counted in the next load."""
        after = await self.snapshot()
        for _ in range(SETTLE_READS):
            await asyncio.sleep(SETTLE_PAUSE_SECONDS)
            again, after = after, await self.snapshot()
            if again == after:
                break
        return after

    async def since(self, before: dict[str, ModelCounters], texts: int, seconds: float) -> dict[str, float]:
        """`load_counters` for what happened since the snapshot `before` (take it `settled`, too)."""
        after = await self.settled()
        return load_counters(after[ENSEMBLE] - before[ENSEMBLE], after[MODEL] - before[MODEL], texts, seconds)

    def _fetch(self, model: str) -> dict[str, Any]:
        with urllib.request.urlopen(f"{self._base_url}/v2/models/{model}/stats", timeout=self._timeout) as answer:
            payload: dict[str, Any] = json.load(answer)
        return payload
