"""Circuit breakers, one per upstream model (and one per chat host): fail fast while it keeps failing, probe to
recover."""

from __future__ import annotations

import enum
import time
from collections import OrderedDict
from collections.abc import Callable

from prometheus_client import Gauge

from gateway import metrics

MAX_MODELS = 256


class BreakerState(str, enum.Enum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class CircuitBreaker:
    """Opens after `failures` consecutive failures; after `reset_seconds` lets one probe call through
    (half-open): its success closes the breaker, its failure opens it again. A probe that ends with no
    verdict on the upstream (`release`: our quota refused it, the client left, the request itself was
    rejected) lets the next call probe; so does a probe left unanswered for `reset_seconds`, so no lost
    ending can keep a model shut."""

    def __init__(
        self,
        name: str,
        failures: int,
        reset_seconds: float,
        clock: Callable[[], float] = time.monotonic,
        *,
        gauge: Gauge = metrics.BREAKER_STATE,  # labelled by the name alone: a model's, or a host's
    ):
        if failures < 1 or reset_seconds <= 0:
            raise ValueError("failures must be >= 1 and reset_seconds > 0")
        self.name = name
        self._gauge = gauge
        self._threshold = failures
        self._reset_seconds = reset_seconds
        self._clock = clock
        self._failures = 0
        self._opened_at = 0.0
        self._probing = False
        self._probe_started_at = 0.0
        self.state = BreakerState.CLOSED

    def allow(self) -> bool:
        """Whether a call may go to the upstream now."""
        if self.state is BreakerState.CLOSED:
            return True
        if self.state is BreakerState.OPEN and self._clock() - self._opened_at >= self._reset_seconds:
            self.state = BreakerState.HALF_OPEN
            self._probing = False
        if self.state is BreakerState.HALF_OPEN and self._probe_free():
            self._probing = True
            self._probe_started_at = self._clock()
            return True
        return False

    def _probe_free(self) -> bool:
        return not self._probing or self._clock() - self._probe_started_at >= self._reset_seconds

    def retry_after(self) -> float:
        return max(0.0, self._reset_seconds - (self._clock() - self._opened_at))

    def record_success(self) -> None:
        self._failures = 0
        self._probing = False
        self._set(BreakerState.CLOSED)

    def release(self) -> None:
        """The call allowed by `allow` ended with no verdict on the upstream's health."""
        self._probing = False

    def record_failure(self) -> None:
        self._failures += 1
        self._probing = False
        if self.state is BreakerState.HALF_OPEN or self._failures >= self._threshold:
            self._opened_at = self._clock()
            self._set(BreakerState.OPEN)

    def _set(self, state: BreakerState) -> None:
        self.state = state
        self._gauge.labels(self.name).set(1 if state is BreakerState.OPEN else 0)


class BreakerBoard:
    """The breakers of the models asked for, created on first use. Clients name the model, so at most
    `max_models` are kept, the least recently used dropped first (a dropped one starts closed again)."""

    def __init__(
        self,
        failures: int,
        reset_seconds: float,
        clock: Callable[[], float] = time.monotonic,
        *,
        max_models: int = MAX_MODELS,
    ) -> None:
        self._failures = failures
        self._reset_seconds = reset_seconds
        self._clock = clock
        self._max_models = max_models
        self._breakers: OrderedDict[str, CircuitBreaker] = OrderedDict()

    def __getitem__(self, model: str) -> CircuitBreaker:
        breaker = self._breakers.get(model)
        if breaker is None:
            breaker = self._breakers[model] = CircuitBreaker(model, self._failures, self._reset_seconds, self._clock)
            if len(self._breakers) > self._max_models:
                self._breakers.popitem(last=False)
        else:
            self._breakers.move_to_end(model)
        return breaker

    def __len__(self) -> int:
        return len(self._breakers)
