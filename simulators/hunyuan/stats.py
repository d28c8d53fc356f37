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
    # The same by the request's `user` field (OpenAI's end-user id; "" without one): who held the account's slots.
    in_flight_by_user: Counter[str] = field(default_factory=Counter)
    max_in_flight_by_user: Counter[str] = field(default_factory=Counter)
    streams_open: int = 0
    streams_completed: int = 0  # ended with [DONE]
    streams_cancelled: int = 0  # the client went away before the end
    streams_dropped: int = 0  # cut off on purpose (`drop_stream_after_chunks`)
    # The usage of every answer it generated (accepted requests), by the answer's id: what the account is billed,
    # whether or not the caller received the answer in full.
    usage_by_answer: dict[str, dict[str, Any]] = field(default_factory=dict)
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

    def admit(self, user: str = "") -> None:
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        self.in_flight_by_user[user] += 1
        self.max_in_flight_by_user[user] = max(self.max_in_flight_by_user[user], self.in_flight_by_user[user])

    def release(self, user: str = "") -> None:
        """An admitted request answered in full, or given up."""
        self.in_flight -= 1
        self.in_flight_by_user[user] -= 1

    def close_stream(self, outcome: str, user: str = "") -> None:
        self.release(user)
        self.streams_open -= 1
        if outcome == "completed":
            self.streams_completed += 1
        elif outcome == "dropped":
            self.streams_dropped += 1
        else:
            self.streams_cancelled += 1
