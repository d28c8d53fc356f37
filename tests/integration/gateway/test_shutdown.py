"""Shutdown always ends: a closing step that hangs is abandoned after the deadline, and the gRPC server, stopped
by both the signal handler and the lifespan, runs grpc.aio's stop once."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import grpc
import pytest
import uvicorn
from fastapi import FastAPI
from grpc_health.v1 import health

import gateway.__main__ as gateway_main
from gateway.__main__ import GatewayServer
from gateway.grpc.server import GrpcServer
from localtriton.ports import free_port

pytestmark = pytest.mark.slow


async def test_a_closing_step_that_hangs_does_not_keep_the_process(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(gateway_main, "SHUTDOWN_MARGIN_SECONDS", 0.5)
    closing_started = asyncio.Event()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        closing_started.set()
        await asyncio.Event().wait()  # a client whose close waits on a peer that never answers

    app = FastAPI(lifespan=lifespan)
    config = uvicorn.Config(app, host="127.0.0.1", port=free_port(), log_config=None, timeout_graceful_shutdown=0)
    server = GatewayServer(config, app, grace_seconds=0.2)

    serving = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    server.should_exit = True  # what SIGTERM does (handle_exit would re-raise the signal in this process)
    await asyncio.wait_for(serving, timeout=10)

    assert closing_started.is_set()
    assert "shutdown did not finish within 1 s" in caplog.text


async def test_the_grpc_server_is_stopped_once_however_often_it_is_asked() -> None:
    server = grpc.aio.server()
    port = server.add_insecure_port("127.0.0.1:0")
    stops: list[float | None] = []
    stop = server.stop

    async def counted_stop(grace: float | None) -> Any:
        stops.append(grace)
        return await stop(grace)

    server.stop = counted_stop
    grpc_server = GrpcServer(server, health.aio.HealthServicer(), port)
    await grpc_server.start()

    await asyncio.gather(grpc_server.stop(1.0), grpc_server.stop(1.0))
    await grpc_server.stop(1.0)

    assert stops == [1.0]


@pytest.fixture(autouse=True)
def _gateway_logs(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="gateway")
