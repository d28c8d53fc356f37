"""One simulated Pika job: what was asked, the faults rolled for it at submission, its state and its result."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from simulators.pika.config import PikaSimulatorConfig

# Job states, as counted in `PikaSimulatorStats.jobs_by_state`.
IN_QUEUE = "IN_QUEUE"
IN_PROGRESS = "IN_PROGRESS"
COMPLETED = "COMPLETED"  # succeeded
FAILED = "FAILED"  # ended in ERROR (simulated failure)
CANCELLED = "CANCELLED"  # ended in ERROR after a cancel


@dataclass
class Job:
    request_id: str
    app_id: str
    model_path: str
    body: dict[str, Any]
    webhook_url: str | None
    config: PikaSimulatorConfig  # a copy, as it was at submission
    submitted_at: float  # monotonic
    sent_at: float  # Unix seconds, when the submit came in (the request history's times are wall-clock)
    will_fail: bool
    lose_callback: bool
    state: str = IN_QUEUE
    result: dict[str, Any] | None = None
    error: str | None = None
    cancel_requested: bool = False
    started_at: float | None = None  # Unix seconds, when it went IN_PROGRESS
    ended_at: float | None = None  # Unix seconds, when it ended (the request history lists it from then)

    @property
    def ended(self) -> bool:
        return self.state in (COMPLETED, FAILED, CANCELLED)

    def video_result(self) -> dict[str, Any]:
        """What a successful job answers at its response URL and carries in its webhook."""
        seed = self.body.get("seed")
        return {
            "video": {
                "url": f"{self.config.video_base_url}/{self.request_id}/video.mp4",
                "content_type": "video/mp4",
                "file_name": "video.mp4",
                "file_size": 1_048_576,
            },
            "seed": seed if isinstance(seed, int) else 42,
        }
