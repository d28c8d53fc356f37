"""Real gateways (uvicorn + gRPC) in background threads, on free ports, in front of a real Triton."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from tests.helpers.running_gateway import RunningGateway, gateway_settings


@pytest.fixture
def gateway_factory() -> Iterator[Callable[..., RunningGateway]]:
    """Start gateways with `gateway_settings(triton_url, **concerns)`; all are stopped after the test."""
    started: list[RunningGateway] = []

    def start(triton_url: str, **concerns: Any) -> RunningGateway:
        gateway = RunningGateway(gateway_settings(triton_url, **concerns)).start()
        started.append(gateway)
        return gateway

    yield start
    for gateway in started:
        gateway.stop()


@pytest.fixture
def http() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=60) as client:
        yield client
