"""The Pika (fal queue) simulator and a webhook receiver, each on real uvicorn on a free port in a thread.

`pika_simulator` starts one with the default `PikaSimulatorConfig` (0.3 s jobs, any key accepted); a test
changes `.config`, points a client at `.base_url` (like `https://queue.fal.run`), and reads `.stats`.
`webhook_receiver` records every POST it gets (`.received`: raw body and headers) and answers 200, or the
statuses queued in `.fail_next`. Import the fixtures (or add "tests.helpers.pika_fixtures" to `pytest_plugins`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import Response

from simulators.pika import (
    DEFAULT_MODEL_PATH,
    JWKS_PATH,
    PikaSimulatorConfig,
    PikaSimulatorStats,
    create_pika_simulator,
)
from tests.helpers.servers import ThreadedServer


class RunningPikaSimulator(ThreadedServer):
    """One Pika simulator app behind uvicorn on 127.0.0.1."""

    def __init__(self, config: PikaSimulatorConfig | None = None) -> None:
        self.config = config if config is not None else PikaSimulatorConfig()
        self.app = create_pika_simulator(self.config)
        super().__init__(self.app, "pika-simulator")

    @property
    def base_url(self) -> str:
        """The queue base URL (the real one is `https://queue.fal.run`)."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def submit_url(self) -> str:
        return f"{self.base_url}/{DEFAULT_MODEL_PATH}"

    @property
    def jwks_url(self) -> str:
        return f"{self.base_url}{JWKS_PATH}"

    @property
    def stats(self) -> PikaSimulatorStats:
        stats: PikaSimulatorStats = self.app.state.stats
        return stats

    def start(self) -> RunningPikaSimulator:
        self.start_server()
        return self


@dataclass(frozen=True)
class ReceivedWebhook:
    body: bytes
    headers: dict[str, str]  # lower-case names
    received_at: float  # time.monotonic()

    def json(self) -> Any:
        return json.loads(self.body)


class RunningWebhookReceiver(ThreadedServer):
    """Records every POST to any path; answers the statuses in `fail_next` first (popped), then 200."""

    def __init__(self) -> None:
        self.received: list[ReceivedWebhook] = []  # accepted (2xx) deliveries
        self.rejected: list[ReceivedWebhook] = []  # deliveries answered with a `fail_next` status
        self.fail_next: list[int] = []
        app = FastAPI(openapi_url=None, docs_url=None, redoc_url=None)

        @app.post("/{path:path}")
        async def receive(request: Request, path: str) -> Response:
            webhook = ReceivedWebhook(await request.body(), dict(request.headers), time.monotonic())
            if self.fail_next:
                self.rejected.append(webhook)
                return Response(status_code=self.fail_next.pop(0))
            self.received.append(webhook)
            return Response(status_code=200)

        self.app = app
        super().__init__(app, "webhook-receiver")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/webhooks/fal"

    def start(self) -> RunningWebhookReceiver:
        self.start_server()
        return self

    def wait_for(self, count: int, timeout: float = 5.0) -> list[ReceivedWebhook]:
        """The accepted webhooks once there are at least `count` (raises on timeout)."""
        deadline = time.monotonic() + timeout
        while len(self.received) < count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(self.received)} webhooks received, expected {count}")
            time.sleep(0.01)
        return list(self.received)


@pytest.fixture
def pika_simulator() -> Iterator[RunningPikaSimulator]:
    """A running Pika simulator with the default config; stopped after the test."""
    simulator = RunningPikaSimulator().start()
    yield simulator
    simulator.stop()


@pytest.fixture
def webhook_receiver() -> Iterator[RunningWebhookReceiver]:
    """A running webhook receiver; stopped after the test."""
    receiver = RunningWebhookReceiver().start()
    yield receiver
    receiver.stop()
