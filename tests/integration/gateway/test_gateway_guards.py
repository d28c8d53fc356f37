"""Auth, bad input, limits, Triton outages and metrics: clear 4xx/5xx answers, never a crash."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from pydantic import SecretStr

from gateway.grpc.pb.gateway.v1 import gateway_pb2, gateway_pb2_grpc
from gateway.settings import AuthSettings, CacheSettings, ChatSettings, LimitSettings, SemanticCacheSettings
from localtriton.server import TritonProcess
from tests.helpers.conditions import wait_until
from tests.helpers.hunyuan_fixtures import RunningHunyuanSimulator
from tests.helpers.metrics import metric
from tests.helpers.running_gateway import RunningGateway
from tests.helpers.sentences import SLOW_BATCH, mixed_texts

pytestmark = pytest.mark.slow


def assert_error(response: httpx.Response, status: int, message: str) -> None:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert message in error["message"]


def test_api_keys_guard_every_route_but_the_probes(
    triton: TritonProcess, gateway_factory: Callable[..., RunningGateway], http: httpx.Client
) -> None:
    gateway = gateway_factory(triton.grpc_url, auth=AuthSettings(api_keys=SecretStr("key-one, key-two")))
    url = f"{gateway.base_url}/v1/embeddings"
    missing = http.post(url, json={"input": "hi"})
    assert_error(missing, 401, "missing API key")
    assert missing.headers["www-authenticate"] == "Bearer"
    wrong = http.post(url, json={"input": "hi"}, headers={"Authorization": "Bearer key-three"})
    assert_error(wrong, 401, "invalid API key")
    assert "key-three" not in wrong.text
    assert http.post(url, json={"input": "hi"}, headers={"Authorization": "Bearer key-two"}).status_code == 200
    for probe in ("/healthz", "/readyz", "/metrics"):
        assert http.get(f"{gateway.base_url}{probe}").status_code == 200


@pytest.mark.parametrize(
    ("kwargs", "status", "message"),
    [
        ({"json": {"input": []}}, 400, "at least one text"),
        ({"json": {"input": ["ok", 3]}}, 400, "input"),
        ({"json": {"input": ["ok", ""]}}, 400, "input[1] is empty"),
        ({"json": {"input": [f"t{i}" for i in range(20)]}}, 400, "input has 20 texts; the maximum is 16"),
        ({"json": {"input": "x" * 5001}}, 400, "input[0] has 5001 characters; the maximum is 5000"),
        ({"content": b'{"input": ["unterminated"', "headers": {"content-type": "application/json"}}, 400, "JSON"),
        ({"content": b"input=hello", "headers": {"content-type": "text/plain"}}, 400, ""),
        ({"json": {"input": "hi", "encoding_format": "binary"}}, 400, "encoding_format"),
        ({"json": {"input": "hi", "unknown": 1}}, 400, "unknown"),
        ({"content": b"x" * 70_000, "headers": {"content-type": "application/json"}}, 413, "exceeds the limit"),
        ({"content": iter([b"x" * 40_000] * 2), "headers": {"content-type": "application/json"}}, 413, "exceeds"),
        ({"json": {"input": ["ok", "\u200b\x00\ufeff"]}}, 400, "input[1] is empty or has no visible character"),
    ],
    ids=[
        "empty-list",
        "non-string",
        "empty-text",
        "too-many-texts",
        "oversize-text",
        "invalid-json",
        "wrong-content-type",
        "unknown-encoding",
        "unknown-field",
        "body-too-large",
        "chunked-body-too-large",  # no Content-Length: counted while read
        "invisible-text",
    ],
)
def test_bad_input_gets_a_4xx_in_the_error_shape(
    kwargs: dict[str, object],
    status: int,
    message: str,
    triton: TritonProcess,
    gateway_factory: Callable[..., RunningGateway],
    http: httpx.Client,
) -> None:
    limits = LimitSettings(max_texts_per_request=16, max_text_chars=5000, max_body_bytes=64_000)
    gateway = gateway_factory(triton.grpc_url, limits=limits)
    assert_error(http.post(f"{gateway.base_url}/v1/embeddings", **kwargs), status, message)  # type: ignore[arg-type]
    assert http.post(f"{gateway.base_url}/v1/embeddings", json={"input": "still up"}).status_code == 200


def test_full_in_flight_queue_sheds_with_429_and_retry_after(
    triton: TritonProcess, gateway_factory: Callable[..., RunningGateway], http: httpx.Client
) -> None:
    gateway = gateway_factory(triton.grpc_url, limits=LimitSettings(max_in_flight=1))
    url = f"{gateway.base_url}/v1/embeddings"
    slow = threading.Thread(target=lambda: httpx.post(url, json={"input": SLOW_BATCH}, timeout=120))
    in_flight = metric(http, gateway.base_url, "http_requests_in_flight")  # the process's: /metrics is not counted
    slow.start()
    wait_until(lambda: metric(http, gateway.base_url, "http_requests_in_flight") > in_flight, what="the slow batch")
    shed = http.post(url, json={"input": "one more"})
    slow.join()
    assert_error(shed, 429, "requests in flight")
    assert shed.headers["retry-after"] == "1"
    assert "gateway_requests_shed_total" in http.get(f"{gateway.base_url}/metrics").text


def test_request_past_its_deadline_gets_504(
    triton: TritonProcess, gateway_factory: Callable[..., RunningGateway], http: httpx.Client
) -> None:
    gateway = gateway_factory(triton.grpc_url, limits=LimitSettings(request_timeout_seconds=0.2))
    assert_error(http.post(f"{gateway.base_url}/v1/embeddings", json={"input": SLOW_BATCH}), 504, "longer than 0.2 s")


def test_triton_outage_is_503_naming_triton_and_the_gateway_stays_ready_then_recovers(
    minilm_repository: Path,
    triton_factory: Callable[[Path], TritonProcess],
    gateway_factory: Callable[..., RunningGateway],
    http: httpx.Client,
    caplog: pytest.LogCaptureFixture,
) -> None:
    triton = triton_factory(minilm_repository)
    gateway = gateway_factory(triton.grpc_url, cache=CacheSettings(embedding_cache_mb=8))
    url = f"{gateway.base_url}/v1/embeddings"
    before = http.post(url, json={"input": "before"})
    assert before.status_code == 200
    caplog.set_level(logging.INFO, logger="gateway.upstreams.triton")
    triton.stop()
    for attempt in range(3):
        during = http.post(url, json={"input": f"during {attempt}"})
        assert_error(during, 503, "triton unavailable")
        assert "127.0.0.1" not in during.text and triton.grpc_url not in during.text, "no address to clients"
    for _ in range(2):  # what the cache holds is still served, the first call after the failure and later
        cached = http.post(url, json={"input": "before"})
        assert cached.status_code == 200 and cached.headers["x-cache"] == "hit"
        assert cached.json()["data"] == before.json()["data"]
        time.sleep(1.1)  # past INFO_RETRY_SECONDS (1 s): the next hit re-reads the model info, and still serves
    ready = http.get(f"{gateway.base_url}/readyz")
    assert ready.status_code == 200, "the gateway stays in the Service: chat, video and cached embeddings serve"
    assert ready.json()["ready"] is True and ready.json()["checks"]["triton"] == "degraded"
    assert metric(http, gateway.base_url, "gateway_triton_up") == 0
    with grpc.insecure_channel(gateway.grpc_target) as channel:
        with pytest.raises(grpc.RpcError) as refused:
            gateway_pb2_grpc.EmbeddingsStub(channel).Embed(gateway_pb2.EmbedRequest(input=["during grpc"]))
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        assert refused.value.details() == "triton unavailable"
        # gRPC health follows /readyz's last check: the Embeddings service alone is NOT_SERVING
        health = health_pb2_grpc.HealthStub(channel)
        embeddings_health = health.Check(health_pb2.HealthCheckRequest(service="gateway.v1.Embeddings"))
        assert embeddings_health.status == health_pb2.HealthCheckResponse.NOT_SERVING
        overall = health.Check(health_pb2.HealthCheckRequest(service=""))
        assert overall.status == health_pb2.HealthCheckResponse.SERVING, "chat and video still serve"
    triton.start()
    triton.wait_ready()
    deadline = time.monotonic() + 15  # the gateway's channel reconnects on its own
    while http.post(url, json={"input": "after"}).status_code != 200:
        assert time.monotonic() < deadline, "gateway did not see Triton come back"
        time.sleep(0.05)
    assert http.get(f"{gateway.base_url}/readyz").json()["checks"]["triton"] == "ok"
    assert metric(http, gateway.base_url, "gateway_triton_up") == 1
    records = [r for r in caplog.records if r.name == "gateway.upstreams.triton"]
    warnings = [r for r in records if r.levelno == logging.WARNING]
    recoveries = [r for r in records if r.levelno == logging.INFO and "available again" in r.getMessage()]
    assert len(warnings) == 1, "one WARNING per outage, not one per request"
    assert triton.grpc_url in warnings[0].getMessage(), "the address goes to the log"
    assert len(recoveries) == 1 and warnings[0].created < recoveries[0].created


def test_with_triton_stopped_the_gateway_stays_ready_and_chat_keeps_answering(
    minilm_repository: Path,
    triton_factory: Callable[[Path], TritonProcess],
    hunyuan_simulator: RunningHunyuanSimulator,
    gateway_factory: Callable[..., RunningGateway],
    http: httpx.Client,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The chart's Triton probe: a Triton restart or rollout degrades embeddings alone. Chat stays served,
    also with the semantic cache on the stack's own embeddings (its lookup needs Triton)."""
    triton = triton_factory(minilm_repository)
    hunyuan_simulator.config.api_key = "sim-key"
    gateway = gateway_factory(
        triton.grpc_url,
        chat=ChatSettings(base_url=hunyuan_simulator.base_url, api_key=SecretStr("sim-key")),
        semantic=SemanticCacheSettings(matcher="embedding"),
    )
    chat = f"{gateway.base_url}/v1/chat/completions"
    question = {"model": "hy3-preview", "messages": [{"role": "user", "content": "Is the chat still up?"}]}
    assert http.post(chat, json=question).status_code == 200
    triton.stop()
    ready = http.get(f"{gateway.base_url}/readyz")
    assert ready.status_code == 200 and ready.json()["checks"]["triton"] == "degraded"
    calls = hunyuan_simulator.stats.requests_total
    caplog.set_level(logging.INFO)
    for n in range(3):
        other = {**question, "messages": [{"role": "user", "content": f"And while Triton is away? ({n})"}]}
        answered = http.post(chat, json=other)
        assert answered.status_code == 200 and answered.json()["choices"][0]["message"]["content"]
        streamed = http.post(chat, json={**other, "stream": True, "temperature": 0.5})  # not the cached one
        assert streamed.status_code == 200 and streamed.text.rstrip().endswith("data: [DONE]")
    assert hunyuan_simulator.stats.requests_total == calls + 6, "answered by the upstream, not refused"
    assert http.get(f"{gateway.base_url}/readyz").status_code == 200
    cache_warnings = [r for r in caplog.records if r.name.startswith("gateway.cache") and r.levelno >= logging.WARNING]
    assert cache_warnings == [], "the outage is logged once by the Triton client, not once per chat request"


def test_metrics_expose_the_autoscaling_gauge_and_request_latency(
    triton: TritonProcess, gateway_factory: Callable[..., RunningGateway], http: httpx.Client
) -> None:
    gateway = gateway_factory(triton.grpc_url)
    http.post(f"{gateway.base_url}/v1/embeddings", json={"input": mixed_texts(3, tag="metrics")})
    text = http.get(f"{gateway.base_url}/metrics").text
    assert "http_requests_in_flight 0.0" in text
    assert 'gateway_http_request_duration_seconds_count{method="POST",route="/v1/embeddings",status="200"}' in text
    assert "gateway_triton_request_duration_seconds_count" in text
    assert "gateway_embedding_batch_size_bucket" in text
