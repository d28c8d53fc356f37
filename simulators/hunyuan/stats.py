"""What the simulated Hunyuan saw: requests, answers by status, requests in flight and how streams ended."""

from __future__ import annotations

import bisect
from collections import Counter
from dataclasses import dataclass, field
from typing import Any


@dataclass
class SimulatorStats:
    """What the simulator saw. Written by the server's event loop; read it from tests as a snapshot."""

    requests_total: int = 0  # chat completion requests that arrived, rejected ones included
    requests_by_model: Counter[str] = field(default_factory=Counter)
    arrival_times: list[float] = field(default_factory=list)  # every chat completion request
    accepted_times: list[float] = field(default_factory=list)  # requests the QPS quota let through
    responses_by_status: Counter[int] = field(default_factory=Counter)
    in_flight: int = 0  # admitted requests not yet answered in full
    max_in_flight: int = 0
    streams_open: int = 0
    streams_completed: int = 0  # ended with [DONE]
    streams_cancelled: int = 0  # the client went away before the end
    streams_dropped: int = 0  # cut off on purpose (`drop_stream_after_chunks`)
    last_request: dict[str, Any] | None = None  # the last JSON body received, unknown fields included
    last_headers: dict[str, str] = field(default_factory=dict)
    client_addresses: set[str] = field(default_factory=set)  # host:port of each connection requests came on

    @property
    def rate_limited(self) -> int:
        """429 answers sent, for any reason."""
        return self.responses_by_status[429]

    def max_requests_in_any_window(self, seconds: float = 1.0, *, accepted_only: bool = False) -> int:
        """The most requests whose arrival times fall in one window (t - seconds, t]."""
        times = sorted(self.accepted_times if accepted_only else self.arrival_times)
        counts = (i + 1 - bisect.bisect_right(times, t - seconds, 0, i + 1) for i, t in enumerate(times))
        return max(counts, default=0)

    def admit(self) -> None:
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)

    def close_stream(self, outcome: str) -> None:
        self.in_flight -= 1
        self.streams_open -= 1
        if outcome == "completed":
            self.streams_completed += 1
        elif outcome == "dropped":
            self.streams_dropped += 1
        else:
            self.streams_cancelled += 1
