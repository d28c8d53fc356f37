"""A real gateway (uvicorn + gRPC) in a background thread, on free ports, and the settings tests start it with."""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path
from typing import Any

from gateway.app import create_app
from gateway.settings import (
    AuthSettings,
    CacheSettings,
    SearchSettings,
    ServerSettings,
    Settings,
    TaskStoreSettings,
    TritonSettings,
    UsageSettings,
)
from localtriton.ports import free_port
from tests.helpers.servers import ThreadedServer


class RunningGateway(ThreadedServer):
    """`python -m gateway` in-process: the same app, lifespan and servers, on free ports."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.app = create_app(settings)
        super().__init__(self.app, "gateway", port=settings.server.http_port)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.settings.server.http_port}"

    @property
    def grpc_target(self) -> str:
        return f"127.0.0.1:{self.settings.server.grpc_port}"

    def start(self) -> RunningGateway:
        self.start_server()
        return self


def scratch_dir(prefix: str) -> Path:
    """A new temporary folder, removed when the test process ends (and with it the gateways that use it)."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def gateway_settings(triton_url: str, **concerns: Any) -> Settings:
    """Settings for a test gateway: free ports, the given Triton, no cache unless asked for, task, key and
    usage databases and a search folder of its own."""
    data = scratch_dir("gateway-tasks-")
    defaults: dict[str, Any] = {
        # A test's stop must end well within ThreadedServer.stop's 30 s: in-flight calls get 5 s, not production's 20.
        "server": ServerSettings(
            host="127.0.0.1", http_port=free_port(), grpc_port=free_port(), shutdown_grace_seconds=5
        ),
        "triton": TritonSettings(url=triton_url),
        "cache": CacheSettings(embedding_cache_mb=0),
        "tasks": TaskStoreSettings(sqlite_path=str(data / "tasks.sqlite3")),
        "auth": AuthSettings(keys_sqlite_path=str(data / "keys.sqlite3")),
        "usage": UsageSettings(
            usage_sqlite_path=str(data / "usage.sqlite3"), usage_spool_path=str(data / "usage-spool.sqlite3")
        ),
        "search": SearchSettings(path=str(data / "search")),
    }
    return Settings(**{**defaults, **concerns})
