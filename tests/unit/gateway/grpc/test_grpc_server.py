"""The gRPC front end end to end: real grpc.aio server, real channel, generated stubs, fake backend."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from prometheus_client import REGISTRY

from gateway.errors import OverloadedError
from gateway.grpc import codegen
from gateway.grpc.pb.gateway.v1 import gateway_pb2 as pb
from gateway.grpc.server import address
from gateway.limits import InFlightLimit
from tests.helpers.grpc_harness import AUTH, SECRET, Harness, HarnessFactory

EMBED = "/gateway.v1.Embeddings/Embed"


def embed_error(harness: Harness, request: pb.EmbedRequest, metadata: Any = AUTH) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        harness.embeddings.Embed(request, metadata=metadata)
    return info.value


def trailer(call: Any, key: str) -> str | None:
    return next((value for name, value in call.trailing_metadata() or () if name == key), None)


def health_status(harness: Harness, service: str) -> int:
    request = health_pb2.HealthCheckRequest(service=service)
    return int(health_pb2_grpc.HealthStub(harness.channel).Check(request).status)


def latency_count(method: str, code: str) -> float:
    labels = {"method": method, "code": code}
    return REGISTRY.get_sample_value("gateway_grpc_request_duration_seconds_count", labels) or 0.0


def wait_for_count(method: str, code: str, expected: float) -> bool:
    """For outcomes the server records after the client already has its status."""
    deadline = time.monotonic() + 5
    while latency_count(method, code) < expected and time.monotonic() < deadline:
        time.sleep(0.01)
    return latency_count(method, code) == expected


# --- embeddings round trip --------------------------------------------------------------------------------------


def test_embed_answers_every_text_in_input_order(harness: Harness) -> None:
    response, call = harness.embeddings.Embed.with_call(pb.EmbedRequest(input=["a", "ccc", "bb"]), metadata=AUTH)

    assert [item.index for item in response.data] == [0, 1, 2]
    assert [list(item.embedding) for item in response.data] == [[1.0, 1.0, -1.0], [3.0, 1.0, -1.0], [2.0, 1.0, -1.0]]
    assert response.model == "fake/default"
    assert (response.usage.prompt_tokens, response.usage.total_tokens, response.usage.truncated_texts) == (12, 12, 0)
    assert (response.cache, response.cached_texts) == ("hit", 3)
    assert trailer(call, "x-cache") == "hit"


def test_embed_defaults_truncate_to_true_and_model_to_none(harness: Harness) -> None:
    harness.embeddings.Embed(pb.EmbedRequest(input=["a long sentence"]), metadata=AUTH)

    (call,) = harness.backend.calls
    assert (call.texts, call.model, call.truncate, call.use_cache) == (["a long sentence"], None, True, True)


@pytest.mark.parametrize("truncate", [False, True])
def test_embed_passes_explicit_truncate_through(harness: Harness, truncate: bool) -> None:
    response = harness.embeddings.Embed(pb.EmbedRequest(input=["a long sentence"], truncate=truncate), metadata=AUTH)

    assert harness.backend.calls[0].truncate is truncate
    assert response.usage.truncated_texts == int(truncate)


def test_embed_passes_model_and_no_cache_through(harness: Harness) -> None:
    request = pb.EmbedRequest(input=["x"], model="BAAI/bge-large-zh-v1.5", no_cache=True)
    response, call = harness.embeddings.Embed.with_call(request, metadata=AUTH)

    assert harness.backend.calls[0].model == "BAAI/bge-large-zh-v1.5"
    assert harness.backend.calls[0].use_cache is False
    assert (response.model, response.cache, trailer(call, "x-cache")) == ("BAAI/bge-large-zh-v1.5", "miss", "miss")


# --- authentication ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "metadata",
    [(), (("authorization", "Bearer wrong-key"),), (("authorization", f"Basic {'x' * 8}"),)],
    ids=["missing", "wrong", "malformed"],
)
def test_embed_without_the_right_key_is_unauthenticated(harness: Harness, metadata: Any) -> None:
    error = embed_error(harness, pb.EmbedRequest(input=["x"]), metadata=metadata)

    assert error.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "wrong-key" not in (error.details() or "")
    assert harness.backend.calls == []


def test_no_configured_keys_leaves_the_service_open(harness_factory: HarnessFactory) -> None:
    harness = harness_factory(keys=())

    assert len(harness.embeddings.Embed(pb.EmbedRequest(input=["x"])).data) == 1


def test_health_answers_without_a_key(harness: Harness) -> None:
    assert health_status(harness, "") == health_pb2.HealthCheckResponse.SERVING
    assert health_status(harness, "gateway.v1.Embeddings") == health_pb2.HealthCheckResponse.SERVING


# --- error mapping ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "code", "details"),
    [
        ("!invalid", grpc.StatusCode.INVALID_ARGUMENT, "input[0]: expected a non-empty string, got ''"),
        ("!too-long", grpc.StatusCode.INVALID_ARGUMENT, "input[0]: 700 tokens > maximum 512 with truncate=false"),
        ("!not-found", grpc.StatusCode.NOT_FOUND, "model 'nope' not found; served: fake/default"),
        ("!too-large", grpc.StatusCode.INVALID_ARGUMENT, "request of 9000000 bytes > maximum 8388608"),
        ("!overloaded", grpc.StatusCode.RESOURCE_EXHAUSTED, "256 requests in flight, limit 256"),
        ("!upstream", grpc.StatusCode.UNKNOWN, "triton answered an unexpected error"),
        ("!unavailable", grpc.StatusCode.UNAVAILABLE, "triton at 127.0.0.1:8001 is not reachable"),
        ("!timeout", grpc.StatusCode.DEADLINE_EXCEEDED, "triton did not answer within 30.0 s"),
        ("!server", grpc.StatusCode.INTERNAL, "embedding cache returned a malformed vector"),
    ],
)
def test_gateway_errors_map_to_status_codes(harness: Harness, text: str, code: grpc.StatusCode, details: str) -> None:
    error = embed_error(harness, pb.EmbedRequest(input=["fine", text]))

    assert (error.code(), error.details()) == (code, details)


def test_an_error_quoting_a_huge_input_is_cut_to_fit_a_status(harness: Harness) -> None:
    error = embed_error(harness, pb.EmbedRequest(input=["!long"]))

    assert error.code() == grpc.StatusCode.NOT_FOUND
    assert (error.details() or "").endswith("more characters)") and len(error.details() or "") < 1100


def test_messages_up_to_the_body_limit_are_received_and_larger_ones_refused(harness_factory: HarnessFactory) -> None:
    harness = harness_factory(max_message_bytes=6_000_000)  # above gRPC's default of 4 MiB
    large = pb.EmbedRequest(input=["y" * 5_000_000])
    assert harness.embeddings.Embed(large, metadata=AUTH).data[0].embedding[0] == 5_000_000
    error = embed_error(harness, pb.EmbedRequest(input=["y" * 7_000_000]))
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert len(harness.backend.calls) == 1


def test_overloaded_sends_retry_after(harness: Harness) -> None:
    error = embed_error(harness, pb.EmbedRequest(input=["!overloaded"]))

    assert trailer(error, "retry-after") == "7"
    assert trailer(error, "x-cache") is None


def test_unexpected_exception_is_internal_and_not_leaked(harness: Harness, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR, logger="gateway.grpc.interceptors"):
        error = embed_error(harness, pb.EmbedRequest(input=["!crash"]))

    assert (error.code(), error.details()) == (grpc.StatusCode.INTERNAL, "internal error")
    assert SECRET not in str(error.trailing_metadata())
    assert any(record.exc_info and EMBED in record.getMessage() for record in caplog.records)


def test_latency_is_observed_by_method_and_code(harness: Harness) -> None:
    ok, unauthenticated = latency_count(EMBED, "OK"), latency_count(EMBED, "UNAUTHENTICATED")

    harness.embeddings.Embed(pb.EmbedRequest(input=["x"]), metadata=AUTH)
    embed_error(harness, pb.EmbedRequest(input=["x"]), metadata=())

    assert latency_count(EMBED, "OK") == ok + 1
    assert latency_count(EMBED, "UNAUTHENTICATED") == unauthenticated + 1


# --- server-streaming methods go through the same interceptor ---------------------------------------------------


async def count_then_overload(request: bytes, context: Any) -> AsyncIterator[bytes]:
    yield b"1"
    yield b"2"
    raise OverloadedError("stream quota used up", retry_after=3)


async def write_then_overload(request: bytes, context: Any) -> None:
    await context.write(b"1")
    raise OverloadedError("stream quota used up", retry_after=3)


async def abort_itself(request: bytes, context: Any) -> None:
    await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "chose its own status")


def streaming_handler() -> grpc.GenericRpcHandler:
    return grpc.method_handlers_generic_handler(
        "test.v1.Numbers",
        {
            "Count": grpc.unary_stream_rpc_method_handler(count_then_overload),
            "Write": grpc.unary_stream_rpc_method_handler(write_then_overload),
            "Abort": grpc.unary_unary_rpc_method_handler(abort_itself),
        },
    )


def read_stream(harness: Harness, method: str, metadata: Any) -> tuple[list[bytes], grpc.RpcError]:
    received: list[bytes] = []
    with pytest.raises(grpc.RpcError) as info:
        received.extend(harness.channel.unary_stream(method)(b"", metadata=metadata))
    return received, info.value


@pytest.mark.parametrize(("method", "sent"), [("Count", [b"1", b"2"]), ("Write", [b"1"])])
def test_stream_errors_are_mapped_after_the_messages_sent(
    harness_factory: HarnessFactory, method: str, sent: list[bytes]
) -> None:
    harness = harness_factory(handlers=[streaming_handler()])

    received, error = read_stream(harness, f"/test.v1.Numbers/{method}", AUTH)

    assert received == sent
    assert (error.code(), error.details()) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "stream quota used up")
    assert trailer(error, "retry-after") == "3"


def test_stream_without_a_key_is_unauthenticated(harness_factory: HarnessFactory) -> None:
    harness = harness_factory(handlers=[streaming_handler()])

    received, error = read_stream(harness, "/test.v1.Numbers/Count", ())

    assert (received, error.code()) == ([], grpc.StatusCode.UNAUTHENTICATED)


def test_a_status_the_handler_chose_itself_is_kept(harness_factory: HarnessFactory) -> None:
    harness = harness_factory(handlers=[streaming_handler()])
    method = "/test.v1.Numbers/Abort"
    before = latency_count(method, "FAILED_PRECONDITION")

    with pytest.raises(grpc.RpcError) as info:
        harness.channel.unary_unary(method)(b"", metadata=AUTH)

    assert (info.value.code(), info.value.details()) == (grpc.StatusCode.FAILED_PRECONDITION, "chose its own status")
    # The handler's abort() sent the status before the interceptor saw the exception.
    assert wait_for_count(method, "FAILED_PRECONDITION", before + 1)


def test_a_call_the_client_gave_up_on_is_counted_as_cancelled(harness: Harness) -> None:
    before = latency_count(EMBED, "CANCELLED")

    with pytest.raises(grpc.RpcError) as info:
        harness.embeddings.Embed(pb.EmbedRequest(input=["!slow"]), metadata=AUTH, timeout=0.2)

    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert wait_for_count(EMBED, "CANCELLED", before + 1)


@pytest.mark.slow  # waits for the slow call to reach its client deadline
def test_calls_share_the_process_in_flight_limit_and_the_autoscaling_gauge(harness_factory: HarnessFactory) -> None:
    limit = InFlightLimit(1)
    harness = harness_factory(in_flight=limit)
    gauge = REGISTRY.get_sample_value("http_requests_in_flight") or 0.0
    slow = harness.embeddings.Embed.future(pb.EmbedRequest(input=["!slow"]), metadata=AUTH, timeout=2)
    deadline = time.monotonic() + 5
    while limit.count < 1:
        assert time.monotonic() < deadline, "the slow call never started"
        time.sleep(0.01)
    assert REGISTRY.get_sample_value("http_requests_in_flight") == gauge + 1
    shed = embed_error(harness, pb.EmbedRequest(input=["a"]))
    assert shed.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "requests in flight" in shed.details()
    assert limit.acquire() is False  # a REST request now would be refused as well
    with pytest.raises(grpc.RpcError):
        slow.result()
    while limit.count:
        assert time.monotonic() < deadline, "the cancelled call kept its permit"
        time.sleep(0.01)
    assert harness.embeddings.Embed(pb.EmbedRequest(input=["a"]), metadata=AUTH).cache == "hit"
    assert REGISTRY.get_sample_value("http_requests_in_flight") == gauge


def test_a_unary_call_past_the_request_deadline_is_deadline_exceeded(harness_factory: HarnessFactory) -> None:
    harness = harness_factory(timeout_seconds=0.2)
    started = time.monotonic()
    error = embed_error(harness, pb.EmbedRequest(input=["!slow"]))
    assert (error.code(), error.details()) == (grpc.StatusCode.DEADLINE_EXCEEDED, "call took longer than 0.2 s")
    assert time.monotonic() - started < 5


# --- health and reflection --------------------------------------------------------------------------------------


def test_set_serving_flips_health(harness: Harness) -> None:
    harness.loop.run(harness.server.set_serving(False))
    assert health_status(harness, "") == health_pb2.HealthCheckResponse.NOT_SERVING
    assert health_status(harness, "gateway.v1.Embeddings") == health_pb2.HealthCheckResponse.NOT_SERVING

    harness.loop.run(harness.server.set_serving(True))
    assert health_status(harness, "") == health_pb2.HealthCheckResponse.SERVING
    assert health_status(harness, "gateway.v1.Embeddings") == health_pb2.HealthCheckResponse.SERVING


def test_reflection_lists_the_services_without_a_key(harness: Harness) -> None:
    stub = reflection_pb2_grpc.ServerReflectionStub(harness.channel)
    request = reflection_pb2.ServerReflectionRequest(list_services="")

    (response,) = stub.ServerReflectionInfo(iter([request]))

    names = {service.name for service in response.list_services_response.service}
    assert {"gateway.v1.Embeddings", "grpc.health.v1.Health"} <= names


# --- small pieces -----------------------------------------------------------------------------------------------


def test_address_brackets_ipv6_literals() -> None:
    assert address("0.0.0.0", 50051) == "0.0.0.0:50051"
    assert address("::", 0) == "[::]:0"
    assert address("[::1]", 1) == "[::1]:1"


def test_codegen_is_idempotent_and_rewrites_the_package_import(tmp_path: Path) -> None:
    first = {path: path.read_bytes() for path in codegen.generate(out_dir=tmp_path)}
    second = {path: path.read_bytes() for path in codegen.generate(out_dir=tmp_path)}

    assert first == second
    grpc_module = (tmp_path / "gateway" / "v1" / "gateway_pb2_grpc.py").read_text()
    assert "from gateway.grpc.pb.gateway.v1 import gateway_pb2 as" in grpc_module
    assert "from gateway.v1 import" not in grpc_module
    assert (tmp_path / "gateway" / "v1" / "__init__.py").exists()
    assert not codegen.is_stale()
