"""Backup hosts and the start of a stream, end to end: a real gateway in front of Hunyuan simulators.

Chat needs no Triton, so these gateways point at a closed port for it (their embeddings would answer 503).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import httpx
import openai
import pytest
from pydantic import SecretStr

from gateway.grpc.pb.gateway.v1 import gateway_pb2, gateway_pb2_grpc
from gateway.settings import ChatSettings
from localtriton.ports import free_port
from tests.helpers.conditions import until
from tests.helpers.hunyuan_fixtures import RunningHunyuanSimulator
from tests.helpers.running_gateway import RunningGateway

pytestmark = pytest.mark.slow

KEY = "sim-key-secret"
NO_TRITON = "127.0.0.1:1"


@pytest.fixture
def backup_simulator() -> Iterator[RunningHunyuanSimulator]:
    simulator = RunningHunyuanSimulator().start()
    yield simulator
    simulator.stop()


def chat_settings(primary: str, *backups: RunningHunyuanSimulator, **overrides: Any) -> ChatSettings:
    for simulator in backups:
        simulator.config.api_key = KEY
    values: dict[str, Any] = {
        "base_url": primary,
        "backup_base_urls": ",".join(simulator.base_url for simulator in backups),
        "api_key": SecretStr(KEY),
        "retry_base_seconds": 0.01,
    }
    return ChatSettings(**{**values, **overrides})


def started(
    factory: Callable[..., RunningGateway], primary: RunningHunyuanSimulator, **overrides: Any
) -> RunningGateway:
    """A gateway whose only chat host is `primary`."""
    primary.config.api_key = KEY
    return factory(NO_TRITON, chat=chat_settings(primary.base_url, **overrides))


def ask(text: str, **extra: Any) -> dict[str, Any]:
    return {"model": "hy3-preview", "messages": [{"role": "user", "content": text}], **extra}


def client_of(gateway: RunningGateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway.base_url}/v1", api_key="unused", max_retries=0, timeout=30)


def sse_payloads(text: str) -> list[str]:
    return [line[len("data: ") :] for line in text.splitlines() if line.startswith("data: ")]


def host_calls(gateway: RunningGateway, http: httpx.Client, simulator: RunningHunyuanSimulator) -> float:
    line = f'gateway_chat_upstream_calls_total{{host="127.0.0.1:{simulator.port}",model="hy3-preview"}} '
    text = http.get(f"{gateway.base_url}/metrics").text
    return float(text.split(line)[1].split()[0]) if line in text else 0.0


def test_a_primary_that_refuses_connections_falls_over_to_the_backup_within_one_request(
    backup_simulator: RunningHunyuanSimulator, gateway_factory: Callable[..., RunningGateway], http: httpx.Client
) -> None:
    refused = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there
    gateway = gateway_factory(NO_TRITON, chat=chat_settings(refused, backup_simulator, max_retries=0))
    with client_of(gateway) as client:
        whole = client.chat.completions.create(**ask("not streamed"))
        stream = client.chat.completions.create(**ask("streamed"), stream=True)
        pieces = [chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices]
    assert "not streamed" in (whole.choices[0].message.content or "") and "streamed" in "".join(pieces)
    assert backup_simulator.stats.requests_total == 2  # one upstream call each, on the backup
    assert host_calls(gateway, http, backup_simulator) == 2


def test_a_primary_answering_5xx_before_the_first_byte_falls_over_to_the_backup(
    hunyuan_simulator: RunningHunyuanSimulator,
    backup_simulator: RunningHunyuanSimulator,
    gateway_factory: Callable[..., RunningGateway],
    http: httpx.Client,
) -> None:
    settings = chat_settings(hunyuan_simulator.base_url, backup_simulator, max_retries=0)
    hunyuan_simulator.config.api_key = KEY
    gateway = gateway_factory(NO_TRITON, chat=settings)
    hunyuan_simulator.config.fail_next = [503, 500]  # in TokenHub's error body
    with client_of(gateway) as client:
        whole = client.chat.completions.create(**ask("not streamed"))
        stream = client.chat.completions.create(**ask("streamed"), stream=True)
        chunks = list(stream)
    assert whole.choices[0].finish_reason == "stop" and chunks[-1].choices[0].finish_reason == "stop"
    statuses = hunyuan_simulator.stats.responses_by_status
    assert statuses[503] == 1 and statuses[500] == 1
    assert backup_simulator.stats.requests_total == 2
    assert host_calls(gateway, http, backup_simulator) == 2 and host_calls(gateway, http, hunyuan_simulator) == 0


def test_a_stream_that_drops_or_stalls_before_its_first_chunk_is_retried_or_answers_a_status(
    hunyuan_simulator: RunningHunyuanSimulator,
    backup_simulator: RunningHunyuanSimulator,
    gateway_factory: Callable[..., RunningGateway],
    http: httpx.Client,
) -> None:
    one_host = started(gateway_factory, hunyuan_simulator, first_byte_timeout_seconds=0.5)
    url = f"{one_host.base_url}/v1/chat/completions"
    hunyuan_simulator.config.drop_stream_after_chunks = 0  # 200, then the connection drops before any chunk
    hunyuan_simulator.config.drop_streams = 1
    retried = http.post(url, json=ask("dropped once", stream=True))
    assert retried.status_code == 200 and sse_payloads(retried.text)[-1] == "[DONE]"
    assert hunyuan_simulator.stats.requests_total == 2 and hunyuan_simulator.stats.streams_dropped == 1

    hunyuan_simulator.config.drop_streams = None  # every attempt drops: a status, not a 200 with an error event
    dropped = http.post(url, json=ask("always dropped", stream=True))
    assert dropped.status_code == 502 and "stream" in dropped.json()["error"]["message"]
    hunyuan_simulator.config.drop_stream_after_chunks = None

    hunyuan_simulator.config.ttft_seconds = 1.0  # silent for longer than the first-byte timeout on every attempt
    stalled = http.post(url, json=ask("stalled", stream=True))
    assert stalled.status_code == 504 and stalled.json()["error"]["type"]

    with_backup = chat_settings(hunyuan_simulator.base_url, backup_simulator, first_byte_timeout_seconds=0.5)
    backup_url = f"{gateway_factory(NO_TRITON, chat=with_backup).base_url}/v1/chat/completions"
    moved = http.post(backup_url, json=ask("stalled primary", stream=True))
    assert moved.status_code == 200 and sse_payloads(moved.text)[-1] == "[DONE]"
    assert backup_simulator.stats.requests_total == 1


def test_a_stream_failing_before_its_first_chunk_falls_back_to_the_fallback_model_or_gets_429(
    hunyuan_simulator: RunningHunyuanSimulator, gateway_factory: Callable[..., RunningGateway], http: httpx.Client
) -> None:
    fallback = "hy3-preview=deepseek-v4-flash"
    gateway = started(gateway_factory, hunyuan_simulator, max_retries=0, fallback_models=fallback)
    url = f"{gateway.base_url}/v1/chat/completions"
    hunyuan_simulator.config.drop_stream_after_chunks = 0
    hunyuan_simulator.config.drop_streams = 1
    answer = http.post(url, json=ask("fall back", stream=True))
    payloads = sse_payloads(answer.text)
    assert answer.status_code == 200 and payloads[-1] == "[DONE]"
    assert json.loads(payloads[0])["model"] == "deepseek-v4-flash"
    assert dict(hunyuan_simulator.stats.requests_by_model) == {"hy3-preview": 1, "deepseek-v4-flash": 1}

    hunyuan_simulator.config.fail_next = [429, 429]  # the account's quota: the fallback shares it
    limited = http.post(url, json=ask("over quota", stream=True))
    assert limited.status_code == 429 and limited.headers["retry-after"] == "1"
    assert limited.json()["error"]["message"]


def test_a_drop_after_the_first_chunk_ends_with_an_error_event_no_done_and_the_openai_client_raises(
    hunyuan_simulator: RunningHunyuanSimulator, gateway_factory: Callable[..., RunningGateway], http: httpx.Client
) -> None:
    gateway = started(gateway_factory, hunyuan_simulator)
    hunyuan_simulator.config.drop_stream_after_chunks = 2
    raw = http.post(f"{gateway.base_url}/v1/chat/completions", json=ask("cut me", stream=True))
    payloads = sse_payloads(raw.text)
    assert raw.status_code == 200 and "[DONE]" not in payloads
    assert "stream" in json.loads(payloads[-1])["error"]["message"]
    with client_of(gateway) as client, pytest.raises(openai.APIError, match="stream"):
        for _ in client.chat.completions.create(**ask("cut me again"), stream=True):
            pass
    assert hunyuan_simulator.stats.requests_total == 2  # after the first chunk there is no retry


def test_grpc_gets_a_status_for_a_failure_before_the_first_chunk(
    hunyuan_simulator: RunningHunyuanSimulator, gateway_factory: Callable[..., RunningGateway]
) -> None:
    gateway = started(gateway_factory, hunyuan_simulator, max_retries=0, first_byte_timeout_seconds=0.5)
    hunyuan_simulator.config.drop_stream_after_chunks = 0
    with grpc.insecure_channel(gateway.grpc_target) as channel:
        stub = gateway_pb2_grpc.ChatStub(channel)
        call = stub.Complete(gateway_pb2.ChatRequest(body_json=json.dumps(ask("dropped"))))
        with pytest.raises(grpc.RpcError) as dropped:
            list(call)
        assert dropped.value.code() == grpc.StatusCode.UNKNOWN and "stream" in (dropped.value.details() or "")  # 502
        hunyuan_simulator.config.drop_stream_after_chunks = 2  # after the first chunk: the chunks, then a status
        cut = stub.Complete(gateway_pb2.ChatRequest(body_json=json.dumps(ask("cut later"))))
        received = []
        with pytest.raises(grpc.RpcError) as late:
            for chunk in cut:
                received.append(chunk)
        assert len(received) == 2 and late.value.code() != grpc.StatusCode.OK


async def test_identical_streams_arriving_while_one_opens_share_its_first_chunk_or_its_status(
    hunyuan_simulator: RunningHunyuanSimulator, gateway_factory: Callable[..., RunningGateway]
) -> None:
    gateway = started(gateway_factory, hunyuan_simulator, max_retries=0, first_byte_timeout_seconds=0.6)

    async def burst(request: dict[str, Any]) -> list[httpx.Response]:
        """The opener, then two more once its upstream call has begun (its first chunk not yet sent)."""
        calls = hunyuan_simulator.stats.requests_total
        async with httpx.AsyncClient(base_url=gateway.base_url, timeout=30) as client:
            opener = asyncio.create_task(client.post("/v1/chat/completions", json=request))
            await until(lambda: hunyuan_simulator.stats.requests_total > calls, what="the opener's upstream call")
            followers = [client.post("/v1/chat/completions", json=request) for _ in range(2)]
            return list(await asyncio.gather(opener, *followers))

    hunyuan_simulator.config.ttft_seconds = 0.4  # all three arrive before the first chunk
    answers = await burst(ask("share the opening", stream=True))
    assert [a.status_code for a in answers] == [200] * 3 and len({a.text for a in answers}) == 1
    assert hunyuan_simulator.stats.requests_total == 1
    hunyuan_simulator.config.ttft_seconds = 2.0  # no first chunk within 0.6 s: each gets the opener's 504
    failed = await burst(ask("share the failure", stream=True))
    assert [a.status_code for a in failed] == [504] * 3
    assert hunyuan_simulator.stats.requests_total == 2
