"""OpenTelemetry tracing: on when OTEL_EXPORTER_OTLP_ENDPOINT is set.

Spans come from the request middleware (server span, context taken from the
client's `traceparent`) and from each upstream call, which passes the context on.
"""

from __future__ import annotations

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter

from gateway.settings import ObservabilitySettings


def configure_tracing(settings: ObservabilitySettings, exporter: SpanExporter | None = None) -> TracerProvider | None:
    """Install a global tracer provider exporting to OTLP (or to `exporter`); None when tracing is off."""
    if exporter is None:
        if not settings.otlp_endpoint:
            return None
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter(endpoint=settings.otlp_endpoint)
    provider = TracerProvider(resource=Resource.create({"service.name": settings.service_name}))
    provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    return provider


def tracing_installed() -> bool:
    """Whether a tracer provider is installed (by `configure_tracing` or by the embedding program)."""
    return isinstance(trace.get_tracer_provider(), TracerProvider)
