"""Schemathesis against the live gateway's own OpenAPI document: no 5xx, no answer outside the document.

The cases are generated from `create_app(...).openapi()` at collection time (schemathesis's
`pytest.from_fixture` loader does not work with pytest 9.2: it sets `Node._nodeid`, which pytest no
longer has), and `test_live_document_is_the_one_tested` pins that to what the live gateway serves.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from pydantic import SecretStr
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import response_schema_conformance, status_code_conformance

from gateway.app import create_app
from gateway.settings import ChatSettings, VideoSettings, all_environment_variables
from localtriton.server import TritonProcess
from simulators.hunyuan import SimulatorConfig
from tests.helpers.hunyuan_fixtures import RunningHunyuanSimulator
from tests.helpers.pika_fixtures import RunningPikaSimulator
from tests.helpers.running_gateway import RunningGateway, gateway_settings

pytestmark = pytest.mark.slow

DOCUMENT = create_app(gateway_settings("127.0.0.1:1")).openapi()  # builds the app only: nothing starts
schema = schemathesis.openapi.from_dict(DOCUMENT)
JSON_HEADERS = {"content-type": "application/json"}
CHECKS = [not_a_server_error, status_code_conformance, response_schema_conformance]


@pytest.fixture(scope="module")
def gateway(triton_fp32: TritonProcess) -> Iterator[RunningGateway]:
    """One gateway for every operation, chat going to a Hunyuan simulator and images to a Pika simulator;
    it reads none of the developer's settings."""
    simulator = RunningHunyuanSimulator(SimulatorConfig(api_key="schema-key")).start()
    pika = RunningPikaSimulator().start()
    llm = ChatSettings(base_url=simulator.base_url, api_key=SecretStr("schema-key"))
    images = VideoSettings(base_url=pika.base_url, api_key=SecretStr("pika-key"), webhook_jwks_url=pika.jwks_url)
    with pytest.MonkeyPatch.context() as env:
        for name in all_environment_variables():
            env.delenv(name, raising=False)
        running = RunningGateway(gateway_settings(triton_fp32.grpc_url, chat=llm, video=images)).start()
        try:
            yield running
        finally:
            running.stop()
            simulator.stop()
            pika.stop()


def test_live_document_is_the_one_tested(gateway: RunningGateway) -> None:
    response = httpx.get(f"{gateway.base_url}/openapi.json", timeout=30)
    assert response.status_code == 200
    assert response.json() == DOCUMENT


@schema.parametrize()
@settings(
    max_examples=100,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
)
def test_gateway_honours_its_openapi_document(case: schemathesis.Case[Any], gateway: RunningGateway) -> None:
    case.call_and_validate(base_url=gateway.base_url, checks=CHECKS, timeout=60)


@pytest.mark.parametrize(
    "body",
    [{"input": ["fine", "lone \ud800 surrogate"]}, {"input": "\udfff"}, {"input": "ok", "user": "\ud83d"}],
    ids=["high-surrogate-in-list", "low-surrogate-string", "surrogate-in-user"],
)
def test_json_strings_schemathesis_does_not_generate(body: dict[str, Any], gateway: RunningGateway) -> None:
    """Schemathesis draws UTF-8-encodable text only; JSON can also carry lone surrogates (`"\\ud800"`)."""
    case = schema["/v1/embeddings"]["POST"].Case(body=body, media_type="application/json")
    case.call_and_validate(base_url=gateway.base_url, checks=CHECKS, timeout=60)


@pytest.mark.parametrize(
    ("path", "body", "where"),
    [
        ("/v1/chat/completions", {"model": "glm-5", "messages": [{"role": "user", "content": "a\ud800"}]},
         "messages[0].content"),
        ("/v1/chat/completions", {"model": "glm-5", "messages": [{"role": "user", "content": "hi"}],
                                  "stream": True, "user": "\udfff"}, "user"),
        ("/v1/images/generations", {"prompt": "a cat", "negative_prompt": "\ud800"}, "negative_prompt"),
        ("/v1/images/generations", {"prompt": "a cat", "style": {"mood": "\ud83d"}}, "style.mood"),
    ],
    ids=["chat-content", "chat-stream-pass-through-field", "image-field", "image-pass-through-field"],
)  # fmt: skip
def test_lone_surrogates_anywhere_in_chat_and_image_bodies_are_400(
    path: str, body: dict[str, Any], where: str, gateway: RunningGateway
) -> None:
    """They pass JSON parsing and the request models but no UTF-8 encoder (cache keys, upstreams, SQLite)."""
    content = json.dumps(body).encode()  # ASCII, surrogates as "\\ud800" escapes (httpx's json= would refuse them)
    response = httpx.post(f"{gateway.base_url}{path}", content=content, headers=JSON_HEADERS, timeout=30)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["message"] == f"{where} is not valid Unicode (a lone surrogate)"
    assert response.json()["error"]["param"] == where.split(".")[0].split("[")[0]
