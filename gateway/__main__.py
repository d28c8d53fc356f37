"""`python -m gateway`: the REST server (uvicorn) and the gRPC server in one process; nothing else."""

from __future__ import annotations

import asyncio
import gc
import logging
import socket
from types import FrameType

import uvicorn
from fastapi import FastAPI

from gateway.app import create_app
from gateway.http_protocol import with_header_deadline
from gateway.observability import configure_logging
from gateway.settings import Settings
from gateway.tracing import configure_tracing

log = logging.getLogger("gateway")
# After the grace period, what the closing steps may take: clients closing their pools, the task runner's drain.
SHUTDOWN_MARGIN_SECONDS = 15.0
WS_MAX_MESSAGE_BYTES = 64 * 1024  # a subscribe message of 100 task ids is under 5 KB


class GatewayServer(uvicorn.Server):
    """uvicorn, plus: on SIGTERM/SIGINT the gRPC server stops accepting at the same moment as HTTP.

    In-flight HTTP requests and gRPC calls then get the grace period to finish. The whole shutdown has a
    deadline: a closing step that hangs on a peer that never answers is logged and abandoned, so SIGTERM always
    ends the process (a replica that never exits holds its rollout until Kubernetes kills it).
    """

    def __init__(self, config: uvicorn.Config, app: FastAPI, grace_seconds: float) -> None:
        super().__init__(config)
        self._app = app
        self._grace = grace_seconds
        self._loop: asyncio.AbstractEventLoop | None = None

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        # What exists now (modules, the app, clients: a great many objects) lives as long as the process. Out
        # of the collector's sight, a full collection scans only what requests made; scanning it all as well
        # stalls the event loop long enough to show in every open stream's tail time to first token.
        gc.collect()
        gc.freeze()

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        deadline = self._grace + SHUTDOWN_MARGIN_SECONDS
        try:
            async with asyncio.timeout(deadline):
                await super().shutdown(sockets)
        except TimeoutError:
            log.error("shutdown did not finish within %.0f s; exiting without waiting for the rest", deadline)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        grpc_server = getattr(self._app.state, "grpc", None)
        if grpc_server is not None and self._loop is not None:
            stop = grpc_server.stop
            self._loop.call_soon_threadsafe(lambda: self._loop.create_task(stop(self._grace)))  # type: ignore[union-attr]
        super().handle_exit(sig, frame)


def main() -> None:
    settings = Settings()
    configure_logging(settings.server.log_level)
    configure_tracing(settings.observability)
    app = create_app(settings)
    config = uvicorn.Config(
        app,
        host=settings.server.host,
        port=settings.server.http_port,
        log_config=None,
        access_log=False,
        # Nothing reads the client's address or scheme (webhook URLs come from GATEWAY_PUBLIC_URL), so the
        # X-Forwarded-* headers have nothing to correct, and uvicorn's middleware for them would check every
        # request's peer address.
        proxy_headers=False,
        loop="uvloop",  # grpc.aio and tritonclient's aio channel run on it too
        http=with_header_deadline(settings.server.header_timeout_seconds),  # httptools, with a header deadline
        timeout_graceful_shutdown=int(settings.server.shutdown_grace_seconds),
        timeout_keep_alive=int(settings.server.keepalive_seconds),
        # Task sockets: websockets' sans-I/O protocol (the `websockets` package), pinged to stay open through proxies;
        # clients send only small subscribe messages, so a large frame is refused rather than buffered.
        ws="websockets-sansio",
        ws_ping_interval=settings.server.ws_ping_seconds or None,
        ws_ping_timeout=settings.server.ws_ping_seconds or None,
        ws_max_size=WS_MAX_MESSAGE_BYTES,
    )
    GatewayServer(config, app, settings.server.shutdown_grace_seconds).run()


if __name__ == "__main__":
    main()
