"""What the simulated Pika-on-fal saw and did: calls by kind, webhook deliveries, and jobs by state."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any


@dataclass
class PikaSimulatorStats:
    """What the simulator saw and did. Written by the server's event loop; read it from tests as a snapshot."""

    submitted: int = 0
    submitted_by_model: Counter[str] = field(default_factory=Counter)
    submitted_by_prompt: Counter[str] = field(default_factory=Counter)  # a prompt seen twice: a job paid twice
    status_polls: int = 0
    status_failures: int = 0  # status calls answered 503 on purpose
    polls_by_request: dict[str, list[tuple[float, str]]] = field(default_factory=dict)  # (monotonic, User-Agent)
    result_reads: int = 0
    cancels: int = 0  # cancel requests, accepted or not
    cancelled_requests: list[str] = field(default_factory=list)  # the request id of each cancel request
    unauthorized: int = 0  # 401 answers
    history_calls: int = 0  # Platform API request history pages asked for
    callbacks_sent: int = 0  # deliveries the receiver accepted (2xx), duplicates and stale copies included
    callbacks_failed: int = 0  # deliveries that failed every attempt
    callbacks_lost: int = 0  # webhooks dropped on purpose (callback_loss_rate)
    callback_attempts: int = 0  # HTTP tries, retries included
    jobs_by_state: Counter[str] = field(default_factory=Counter)  # current state of every job
    last_request: dict[str, Any] | None = None  # the last submitted JSON body
    last_headers: dict[str, str] = field(default_factory=dict)
