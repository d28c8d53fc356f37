"""OpenTelemetry: the client's trace continues through the gateway to the Triton call."""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx
import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from gateway.settings import ObservabilitySettings
from gateway.tracing import configure_tracing
from localtriton.server import TritonProcess
from tests.helpers.running_gateway import RunningGateway

pytestmark = pytest.mark.slow

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"


def own_trace(exporter: InMemorySpanExporter) -> list[ReadableSpan]:
    """Only this request's spans: other servers in this test process (simulators, gateways) trace too."""
    return [span for span in exporter.get_finished_spans() if format(span.context.trace_id, "032x") == TRACE_ID]


def test_server_and_triton_spans_join_the_callers_trace(
    triton: TritonProcess, gateway_factory: Callable[..., RunningGateway], http: httpx.Client
) -> None:
    exporter = InMemorySpanExporter()
    provider = configure_tracing(ObservabilitySettings(), exporter=exporter)
    assert provider is not None
    assert configure_tracing(ObservabilitySettings()) is None  # no endpoint: tracing stays off
    gateway = gateway_factory(triton.grpc_url)
    traceparent = f"00-{TRACE_ID}-00f067aa0ba902b7-01"
    response = http.post(
        f"{gateway.base_url}/v1/embeddings", json={"input": "trace me"}, headers={"traceparent": traceparent}
    )
    assert response.status_code == 200
    # The server span ends just after the last byte went out, so it may finish after the client has its answer.
    deadline = time.monotonic() + 5
    while not any(span.kind is SpanKind.SERVER for span in own_trace(exporter)):
        assert time.monotonic() < deadline, "no server span for the request"
        provider.force_flush()
        time.sleep(0.05)
    spans = own_trace(exporter)
    by_id = {span.context.span_id: span for span in spans}
    (server,) = [span for span in spans if span.kind is SpanKind.SERVER]
    (upstream,) = [span for span in spans if span.name == "triton.infer"]
    assert server.parent is not None and format(server.parent.span_id, "016x") == "00f067aa0ba902b7"
    ancestor = upstream
    while ancestor.parent is not None and ancestor.parent.span_id in by_id:
        ancestor = by_id[ancestor.parent.span_id]
    assert ancestor is server  # the Triton call is inside the request's server span
    provider.shutdown()
