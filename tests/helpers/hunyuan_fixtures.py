"""The Hunyuan simulator served by a real uvicorn on a free port, in a background thread (a pytest plugin).

`hunyuan_simulator` starts one with the default `SimulatorConfig` (no delays, no quota, any key accepted);
a test changes `.config` to make it slow, strict or faulty, points a client at `.base_url` (ending in
`/v1`, like `CHAT_BASE_URL`) and reads `.stats` afterwards.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from simulators.hunyuan import SimulatorConfig, SimulatorStats, create_hunyuan_simulator
from tests.helpers.servers import ThreadedServer


class RunningHunyuanSimulator(ThreadedServer):
    """One simulator app behind uvicorn on 127.0.0.1."""

    def __init__(self, config: SimulatorConfig | None = None) -> None:
        self.config = config if config is not None else SimulatorConfig()
        self.app = create_hunyuan_simulator(self.config)
        super().__init__(self.app, "hunyuan-simulator")

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def stats(self) -> SimulatorStats:
        stats: SimulatorStats = self.app.state.stats
        return stats

    def start(self) -> RunningHunyuanSimulator:
        self.start_server()
        return self


@pytest.fixture
def hunyuan_simulator() -> Iterator[RunningHunyuanSimulator]:
    """A running Hunyuan simulator with the default config; stopped after the test."""
    simulator = RunningHunyuanSimulator().start()
    yield simulator
    simulator.stop()
