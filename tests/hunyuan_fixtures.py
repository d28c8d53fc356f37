"""The Hunyuan simulator served by a real uvicorn on a free port, in a background thread (a pytest plugin).

`hunyuan_simulator` starts one with the default `SimulatorConfig` (no delays, no quota, any key accepted);
a test changes `.config` to make it slow, strict or faulty, points a client at `.base_url` (ending in
`/v1`, like `HUNYUAN_BASE_URL`) and reads `.stats` afterwards.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
import uvicorn

from gateway.sim.hunyuan import SimulatorConfig, SimulatorStats, create_hunyuan_simulator
from tests.conftest import free_port


class RunningHunyuanSimulator:
    """One simulator app behind uvicorn on 127.0.0.1."""

    def __init__(self, config: SimulatorConfig | None = None) -> None:
        self.config = config if config is not None else SimulatorConfig()
        self.app = create_hunyuan_simulator(self.config)
        self.port = free_port()
        server_config = uvicorn.Config(
            self.app,
            host="127.0.0.1",
            port=self.port,
            log_config=None,
            access_log=False,
            timeout_graceful_shutdown=2,
        )
        self.server = uvicorn.Server(server_config)
        self.thread = threading.Thread(target=self.server.run, name="hunyuan-simulator", daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def stats(self) -> SimulatorStats:
        stats: SimulatorStats = self.app.state.stats
        return stats

    def start(self) -> RunningHunyuanSimulator:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("Hunyuan simulator did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


@pytest.fixture
def hunyuan_simulator() -> Iterator[RunningHunyuanSimulator]:
    """A running Hunyuan simulator with the default config; stopped after the test."""
    simulator = RunningHunyuanSimulator().start()
    yield simulator
    simulator.stop()
