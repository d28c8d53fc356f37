"""Which requests the simulated Hunyuan lets through: the API key, the QPS quota, the concurrency limit, and the
scripted and random failures due before the first byte. It also records what arrived."""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Mapping
from typing import Any

from simulators.hunyuan.config import SimulatorConfig
from simulators.hunyuan.errors import SimulatedAPIError
from simulators.hunyuan.stats import SimulatorStats


class Admission:
    """The live config, the stats and the admission state of one simulator app."""

    def __init__(self, config: SimulatorConfig) -> None:
        self.config = config
        self.stats = SimulatorStats()
        self._window: deque[float] = deque()
        self._seed = config.seed
        self._random = random.Random(config.seed)

    def record(
        self, body: dict[str, Any] | None, headers: Mapping[str, str], now: float, client: str | None = None
    ) -> None:
        self.stats.requests_total += 1
        if client is not None:
            self.stats.client_addresses.add(client)
        self.stats.arrival_times.append(now)
        self.stats.last_request = body
        self.stats.last_headers = dict(headers)
        if body is not None and isinstance(body.get("model"), str):
            self.stats.requests_by_model[body["model"]] += 1

    def authenticate(self, authorization: str | None) -> None:
        expected = self.config.api_key
        if expected is not None and authorization != f"Bearer {expected}":
            raise SimulatedAPIError(401, "missing or wrong API key in the Authorization: Bearer header")

    def admit(self, now: float, user: str = "") -> None:
        """Raise the failure due before the first byte, or count the request in flight."""
        config = self.config
        if config.fail_next and (status := config.fail_next.pop(0)) != 200:
            raise SimulatedAPIError(status, f"scripted failure {status} (fail_next)")
        self._enforce_quota(config.qps_quota, now)
        if config.max_concurrency is not None and self.stats.in_flight >= config.max_concurrency:
            message = f"{self.stats.in_flight} requests in flight >= concurrency limit {config.max_concurrency}"
            raise SimulatedAPIError(429, message, "concurrency_limit_exceeded")
        self._random_failure(config)
        self.stats.admit(user)

    def stream_drop(self) -> int | None:
        """After how many chunks this stream is cut (None: it is not), counting down `drop_streams`."""
        config = self.config
        if config.drop_stream_after_chunks is None or config.drop_streams == 0:
            return None
        if config.drop_streams is not None:
            config.drop_streams -= 1
        return config.drop_stream_after_chunks

    def _enforce_quota(self, quota: int | None, now: float) -> None:
        while self._window and self._window[0] <= now - 1.0:
            self._window.popleft()
        if quota is not None and len(self._window) >= quota:
            raise SimulatedAPIError(429, f"{len(self._window)} requests in the last second >= quota {quota} QPS")
        self._window.append(now)
        self.stats.accepted_times.append(now)

    def _random_failure(self, config: SimulatorConfig) -> None:
        if config.seed != self._seed:
            self._seed, self._random = config.seed, random.Random(config.seed)
        if self._random.random() < config.rate_limit_rate:
            raise SimulatedAPIError(429, "rate limited (simulated rate_limit_rate)")
        if self._random.random() < config.error_rate:
            raise SimulatedAPIError(500, "internal error (simulated error_rate)")
