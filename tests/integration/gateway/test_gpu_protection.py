"""GPU-aware protection end to end: a real gateway in front of the real Triton, its GPU_METRICS_URLS pointing at a
real HTTP server that serves recorded Prometheus text of a GPU Triton and of the DCGM exporter (and at the real
Triton's own metrics port, which on this CPU-only Triton reports no GPU). The test changes the text step by step
through memory and temperature ramps and holds the gateway to its states, answers, Retry-After and log lines."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from gateway.settings import CacheSettings, GpuSettings, TritonSettings
from localtriton.server import TritonProcess
from tests.helpers.conditions import wait_until
from tests.helpers.gpu_metrics import GIB, Gpu, MetricsServer, dcgm_text, triton_text
from tests.helpers.metrics import metric
from tests.helpers.running_gateway import RunningGateway
from tests.integration.gateway.test_search_rest import create, search, upsert

pytestmark = pytest.mark.slow

INTERVAL = 0.15
GPU = Gpu(total_bytes=80 * GIB)
CALLS = 4  # TRITON_MAX_IN_FLIGHT_CALLS, as the chart sets it
BULK = ["the first text of a batch", "the second text of a batch"]


class Scene:
    """The metrics server's GPU and the gateway that reads it."""

    def __init__(self, server: MetricsServer, gateway: RunningGateway, http: httpx.Client) -> None:
        self.server, self.gateway, self.http = server, gateway, http

    def show(self, **figures: Any) -> None:
        """Serve the GPU with `figures` changed, from Triton's endpoint and the DCGM exporter's."""
        for name, value in figures.items():
            setattr(GPU, name, value)
        self.server.texts["/triton"] = triton_text([GPU])
        self.server.texts["/dcgm"] = dcgm_text([GPU])

    def intervals(self, count: int) -> None:
        """Wait until the gateway has read the endpoints `count` more times."""
        before = self.server.reads.get("/triton", 0)
        wait_until(lambda: self.server.reads.get("/triton", 0) >= before + count, 10, f"{count} reads")

    def state(self, state: str) -> float:
        return metric(self.http, self.gateway.base_url, "gateway_gpu_state", gpu=GPU.uuid, state=state)

    def limit(self) -> float:
        return metric(self.http, self.gateway.base_url, "gateway_triton_in_flight_limit")

    def readiness(self) -> str:
        response = self.http.get(f"{self.gateway.base_url}/readyz")
        assert response.status_code == 200, "a GPU state never makes the gateway unready"
        return str(response.json()["checks"].get("gpu"))

    def embed(self, texts: list[str]) -> httpx.Response:
        return self.http.post(f"{self.gateway.base_url}/v1/embeddings", json={"input": texts})


@pytest.fixture
def scene(triton: TritonProcess, gateway_factory: Callable[..., RunningGateway], http: httpx.Client) -> Iterator[Scene]:
    with MetricsServer() as server:
        urls = [server.url("/triton"), server.url("/dcgm"), f"http://{triton.host}:{triton.metrics_port}/metrics"]
        gateway = gateway_factory(
            triton.grpc_url,
            triton=TritonSettings(url=triton.grpc_url, max_in_flight_calls=CALLS),
            gpu=GpuSettings(metrics_urls=",".join(urls), metrics_interval_seconds=INTERVAL),
            cache=CacheSettings(embedding_cache_mb=16),
        )
        yield Scene(server, gateway, http)


def gpu_logs(caplog: pytest.LogCaptureFixture, text: str) -> int:
    """Lines of the GPU policy holding `text`, since the gateway started (in the fixture's setup, or since)."""
    records = [*caplog.get_records("setup"), *caplog.records]
    return sum(text in r.getMessage() for r in records if r.name.startswith("gateway.gpu"))


def assert_refused(response: httpx.Response) -> None:
    assert response.status_code == 503, response.text
    assert response.json()["error"]["code"] == "gpu_memory_high"
    assert response.json()["error"]["type"] == "service_unavailable"
    assert response.headers["retry-after"] == "1", "two intervals of 0.15 s, rounded up"


def test_memory_and_heat_ramps_shed_bulk_work_and_throttle_triton_calls_without_ever_blocking_traffic(
    scene: Scene, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="gateway.gpu")
    gateway, http = scene.gateway, scene.http
    # No GPU text yet (404), and the CPU Triton's metrics hold no GPU: no data, no policy, said once.
    not_read = "not read for 3 intervals (HTTPStatusError: Client error '404"
    wait_until(lambda: gpu_logs(caplog, not_read) == 2, 10, "both endpoints logged as not read")
    scene.intervals(2)
    assert gpu_logs(caplog, not_read) == 2, "once each"
    assert gpu_logs(caplog, "no GPU readings from GPU_METRICS_URLS: no GPU policy") == 1
    assert scene.readiness() == "unknown"
    assert scene.embed(BULK).status_code == 200  # and cached from here on

    create(http, gateway, "faq")
    create(http, gateway, "manuals", chunking={"max_tokens": 16, "overlap": 2})
    assert upsert(http, gateway, "faq", [{"id": "pw", "text": "How do I reset my password?"}]).status_code == 200

    # Memory: 50 % (normal), 95 % (degraded), 87 % (held by the hysteresis), 80 % (normal again).
    scene.show(used_bytes=40 * GIB, temperature=60.0)
    wait_until(lambda: scene.state("normal") == 1, 10, "the GPU read as normal")
    assert scene.readiness() == "ok"
    assert gpu_logs(caplog, "gpu policy on: 1 GPU(s)") == 1

    refused_upserts = metric(http, gateway.base_url, "gateway_gpu_refusals_total", work="upsert")  # per process
    scene.show(used_bytes=76 * GIB)
    wait_until(lambda: scene.state("degraded") == 1, 10, "the GPU degraded")
    assert scene.readiness() == "degraded"
    assert_refused(scene.embed(["a new text", "and another one"]))
    cached = scene.embed(BULK)
    assert cached.status_code == 200 and cached.headers["x-cache"] == "hit", "cached answers are served"
    assert scene.embed(["a single new text"]).status_code == 200, "single texts are served"
    assert scene.embed([*BULK, "one new text among cached ones"]).status_code == 200, "one text to compute: not bulk"
    found = search(http, gateway, "faq", query="forgot my password", top_k=1)
    assert found.status_code == 200 and found.json()["data"][0]["id"] == "pw", "search queries are served"
    assert_refused(upsert(http, gateway, "faq", [{"id": "new", "text": "Opening hours are nine to five."}]))
    assert_refused(upsert(http, gateway, "manuals", [{"id": "m", "text": "A manual page about the printer."}]))
    assert metric(http, gateway.base_url, "gateway_gpu_refusals_total", work="upsert") == refused_upserts + 2

    scene.show(used_bytes=int(0.87 * 80 * GIB))
    scene.intervals(3)
    assert scene.state("degraded") == 1, "87 % is above the 85 % it must fall below"
    assert_refused(scene.embed(["still refused", "while memory is high"]))

    scene.show(used_bytes=64 * GIB)
    wait_until(lambda: scene.state("normal") == 1, 10, "the GPU recovered")
    assert scene.embed(["accepted again", "after recovery"]).status_code == 200
    assert gpu_logs(caplog, f"gpu {GPU.uuid} (every triton) degraded") == 1
    assert gpu_logs(caplog, f"gpu {GPU.uuid} (every triton) no longer degraded") == 1

    # Heat: 86 °C lowers the in-flight limit a call per interval down to 1; 82 °C holds it; 75 °C restores it.
    assert scene.limit() == CALLS
    scene.show(temperature=86.0)
    wait_until(lambda: scene.limit() == 1, 10, "the limit down to 1")
    for limit in (3, 2, 1):  # one step per interval, each logged once
        assert gpu_logs(caplog, f"triton in-flight limit lowered to {limit} of {CALLS}") == 1
    assert scene.state("throttled") == 1 and scene.readiness() == "degraded"
    assert scene.embed(["hot but served", "bulk work is not refused for heat"]).status_code == 200
    scene.show(temperature=82.0)
    scene.intervals(3)
    assert scene.limit() == 1, "82 °C is above the 80 °C it must cool below"
    scene.show(temperature=75.0)
    wait_until(lambda: scene.limit() == CALLS and scene.state("normal") == 1, 10, "restored once cool")
    for limit in (2, 3, 4):
        assert gpu_logs(caplog, f"triton in-flight limit raised to {limit} of {CALLS}") == 1

    # The driver slowing the clocks for heat throttles at any temperature; its power cap alone does not.
    scene.show(temperature=70.0, clock_reasons=0x4)
    scene.intervals(2)
    assert scene.state("normal") == 1
    scene.show(clock_reasons=0x40)
    wait_until(lambda: scene.state("throttled") == 1, 10, "throttled for HW thermal slowdown")
    scene.show(clock_reasons=0)
    wait_until(lambda: scene.state("normal") == 1 and scene.limit() == CALLS, 10, "cooled")
    assert gpu_logs(caplog, f"gpu {GPU.uuid} (every triton) throttled") == 2
    assert gpu_logs(caplog, f"gpu {GPU.uuid} (every triton) no longer throttled") == 2

    # Stale: both endpoints fail; after 3 intervals the GPU leaves the policy and traffic flows, each said once.
    scene.show(used_bytes=78 * GIB)
    wait_until(lambda: scene.state("degraded") == 1, 10, "degraded again")
    scene.server.statuses |= {"/triton": 500, "/dcgm": 500}
    wait_until(lambda: scene.readiness() == "unknown", 10, "the stale GPU left the policy")
    assert scene.state("degraded") == 0
    assert scene.embed(["no data", "no policy"]).status_code == 200
    server_error = "not read for 3 intervals (HTTPStatusError: Server error '500"
    wait_until(lambda: gpu_logs(caplog, server_error) == 2, 10, "both endpoints logged as not read")
    scene.intervals(2)
    assert gpu_logs(caplog, server_error) == 2, "once each"
    assert gpu_logs(caplog, "read again") == 2, "each came back once, when its text was first served"
    assert gpu_logs(caplog, "no GPU readings from GPU_METRICS_URLS: no GPU policy") == 2
