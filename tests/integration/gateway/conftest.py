"""A real gateway (uvicorn + gRPC) in a background thread, on free ports, in front of a real Triton."""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import tritonclient.grpc as grpcclient

from gateway.app import create_app
from gateway.settings import CacheSettings, ServerSettings, Settings, TaskStoreSettings, TritonSettings
from localtriton.ports import free_port
from localtriton.server import TritonProcess
from tests.servers import ThreadedServer


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


def gateway_settings(triton_url: str, **concerns: Any) -> Settings:
    """Settings for a test gateway: free ports, the given Triton, no cache unless asked for, a task
    database of its own."""
    task_db = Path(tempfile.mkdtemp(prefix="gateway-tasks-")) / "tasks.sqlite3"
    defaults: dict[str, Any] = {
        "server": ServerSettings(host="127.0.0.1", http_port=free_port(), grpc_port=free_port()),
        "triton": TritonSettings(url=triton_url),
        "cache": CacheSettings(embedding_cache_mb=0),
        "tasks": TaskStoreSettings(sqlite_path=str(task_db)),
    }
    return Settings(**{**defaults, **concerns})


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


def triton_requests(triton: TritonProcess, model: str = "bge") -> int:
    """Requests Triton has executed for `model` so far (moves only when the gateway calls it)."""
    with grpcclient.InferenceServerClient(triton.grpc_url) as client:
        stats = client.get_inference_statistics(model, as_json=True)["model_stats"][0]
    return int(stats["inference_stats"]["success"].get("count", 0))
