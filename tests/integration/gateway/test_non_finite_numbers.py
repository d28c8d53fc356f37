"""NaN, Infinity and -Infinity (and numbers too large for a float) are not JSON: every route, REST and gRPC, refuses
them with 400 / INVALID_ARGUMENT naming the field, in declared and pass-through fields alike, and no upstream is
called; what reaches an upstream is strict JSON."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import grpc
import httpx
import pytest
from pydantic import SecretStr

from gateway.grpc.pb.gateway.v1 import gateway_pb2, gateway_pb2_grpc
from gateway.settings import ChatSettings, VideoSettings
from tests.helpers.hunyuan_fixtures import RunningHunyuanSimulator
from tests.helpers.pika_fixtures import RunningPikaSimulator
from tests.helpers.running_gateway import RunningGateway

pytestmark = pytest.mark.slow

NO_TRITON = "127.0.0.1:9"  # refused before any service is asked, so Triton is not needed
VIDEO_KEY = "fal-key-secret"
CHAT = '{"model": "hy3-preview", "messages": [{"role": "user", "content": "hi"}], '


@pytest.fixture
def gateway(
    hunyuan_simulator: RunningHunyuanSimulator,
    pika_simulator: RunningPikaSimulator,
    gateway_factory: Callable[..., RunningGateway],
) -> RunningGateway:
    pika_simulator.config.api_key = VIDEO_KEY
    video = VideoSettings(
        base_url=pika_simulator.base_url, api_key=SecretStr(VIDEO_KEY), webhook_jwks_url=pika_simulator.jwks_url
    )
    chat = ChatSettings(base_url=hunyuan_simulator.base_url, api_key=SecretStr("sim-key"))
    return gateway_factory(NO_TRITON, chat=chat, video=video)


@pytest.mark.parametrize(
    ("path", "body", "param", "location"),
    [
        ("/v1/chat/completions", CHAT + '"temperature": NaN}', "temperature", "temperature"),
        ("/v1/chat/completions", CHAT + '"top_p": Infinity}', "top_p", "top_p"),
        ("/v1/chat/completions", CHAT + '"frequency_penalty": -1e400}', "frequency_penalty", "frequency_penalty"),
        ("/v1/chat/completions", CHAT + '"penalty_score": -Infinity}', "penalty_score", "penalty_score"),
        (
            "/v1/chat/completions",
            CHAT + '"tools": [{"type": "function", "function": {"name": "f", "parameters": {"default": NaN}}}]}',
            "tools",
            "tools.0.function.parameters.default",
        ),
        (
            "/v1/chat/completions",
            '{"model": "hy3-preview", "messages": [{"role": "user", "content": [{"type": "text", "text": "hi", '
            '"weight": Infinity}]}]}',
            "messages",
            "messages.0.content.0.weight",
        ),
        ("/v1/embeddings", '{"input": "hi", "dimensions": NaN}', "dimensions", "dimensions"),
        ("/v1/images/generations", '{"prompt": "a cat", "seed": NaN}', "seed", "seed"),
        (
            "/v1/images/generations",
            '{"prompt": "a cat", "extra": {"guidance": [1, Infinity]}}',
            "extra",
            "extra.guidance.1",
        ),
    ],
    ids=[
        "chat-temperature",
        "chat-top_p",
        "chat-overflow",
        "chat-pass-through",
        "chat-tool-schema",
        "chat-content-part",
        "embeddings",
        "video-pass-through",
        "video-nested",
    ],
)
def test_rest_refuses_non_finite_numbers_naming_the_field(
    gateway: RunningGateway,
    hunyuan_simulator: RunningHunyuanSimulator,
    pika_simulator: RunningPikaSimulator,
    http: httpx.Client,
    path: str,
    body: str,
    param: str,
    location: str,
) -> None:
    answer = http.post(f"{gateway.base_url}{path}", content=body, headers={"Content-Type": "application/json"})
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"] == {
        "message": f"{location}: Input should be a finite number",
        "type": "invalid_request_error",
        "param": param,
        "code": None,
    }
    assert hunyuan_simulator.stats.requests_total == 0
    assert pika_simulator.stats.submitted == 0


def test_grpc_refuses_non_finite_numbers_naming_the_field(
    gateway: RunningGateway, hunyuan_simulator: RunningHunyuanSimulator, pika_simulator: RunningPikaSimulator
) -> None:
    with grpc.insecure_channel(gateway.grpc_target) as channel:
        with pytest.raises(grpc.RpcError) as chat:
            list(gateway_pb2_grpc.ChatStub(channel).Complete(gateway_pb2.ChatRequest(body_json=CHAT + '"top_p": NaN}')))
        with pytest.raises(grpc.RpcError) as video:
            options = '{"seed": 7, "motion": {"strength": -Infinity}}'
            gateway_pb2_grpc.ImagesStub(channel).Submit(gateway_pb2.ImageRequest(prompt="a cat", options_json=options))
    assert (chat.value.code(), chat.value.details()) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "body_json: top_p: Input should be a finite number",
    )
    assert (video.value.code(), video.value.details()) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "motion.strength: Input should be a finite number",
    )
    assert hunyuan_simulator.stats.requests_total == 0
    assert pika_simulator.stats.submitted == 0


def test_finite_numbers_reach_the_upstream_as_strict_json(
    gateway: RunningGateway, hunyuan_simulator: RunningHunyuanSimulator, http: httpx.Client
) -> None:
    body: dict[str, Any] = {"model": "hy3-preview", "messages": [{"role": "user", "content": "hi"}]}
    body |= {"temperature": 0.5, "top_p": 1e308, "penalty_score": -0.0}
    assert http.post(f"{gateway.base_url}/v1/chat/completions", json=body).status_code == 200
    received = hunyuan_simulator.stats.last_request
    assert received is not None
    assert json.loads(json.dumps(received, allow_nan=False)) == received
    assert (received["temperature"], received["top_p"], received["penalty_score"]) == (0.5, 1e308, -0.0)
