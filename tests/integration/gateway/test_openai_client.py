"""The official `openai` client against the gateway: embeddings, auth and errors arrive unchanged."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import numpy as np
import numpy.typing as npt
import openai
import pytest
from pydantic import SecretStr

from gateway.settings import AuthSettings
from localtriton.server import TritonProcess
from tests.helpers.running_gateway import RunningGateway

pytestmark = pytest.mark.slow

TEXTS = [
    "How do I reset my password?",
    "如何重置我的密码？",
    "The weather is lovely today.",
    "今天天气很好。",
    "Triton batches requests together.",
]

ClientFactory = Callable[..., openai.OpenAI]


@pytest.fixture
def fp32_gateway(triton_fp32: TritonProcess, gateway_factory: Callable[..., RunningGateway]) -> RunningGateway:
    # FP32 vectors do not depend on their batch mates, so the client's and httpx's answers can be compared exactly.
    return gateway_factory(triton_fp32.grpc_url)


@pytest.fixture
def auth_gateway(triton_fp32: TritonProcess, gateway_factory: Callable[..., RunningGateway]) -> RunningGateway:
    return gateway_factory(triton_fp32.grpc_url, auth=AuthSettings(api_keys=SecretStr("k1,k2")))


@pytest.fixture
def openai_client() -> Iterator[ClientFactory]:
    """`openai.OpenAI` clients pointed at a gateway; all are closed after the test."""
    clients: list[openai.OpenAI] = []

    def make(gateway: RunningGateway, api_key: str = "unused") -> openai.OpenAI:
        client = openai.OpenAI(base_url=f"{gateway.base_url}/v1", api_key=api_key, max_retries=0, timeout=60)
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()


def plain_float_embeddings(http: httpx.Client, gateway: RunningGateway, texts: list[str]) -> dict[str, Any]:
    response = http.post(
        f"{gateway.base_url}/v1/embeddings", json={"model": "bge", "input": texts, "encoding_format": "float"}
    )
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def as_matrix(embeddings: list[list[float]]) -> npt.NDArray[np.float32]:
    return np.array(embeddings, dtype=np.float32)


def test_default_base64_encoding_is_decoded_by_the_client(
    fp32_gateway: RunningGateway, openai_client: ClientFactory, http: httpx.Client
) -> None:
    client = openai_client(fp32_gateway)
    raw = client.embeddings.with_raw_response.create(model="bge", input=TEXTS)
    sent = json.loads(raw.http_response.request.content)
    assert sent == {"model": "bge", "input": TEXTS, "encoding_format": "base64"}
    wire = raw.http_response.json()
    assert all(isinstance(item["embedding"], str) for item in wire["data"])

    response = raw.parse()
    expected = plain_float_embeddings(http, fp32_gateway, TEXTS)
    assert [item.index for item in response.data] == list(range(len(TEXTS)))
    assert all(item.object == "embedding" for item in response.data)
    served = as_matrix([item.embedding for item in response.data])
    assert served.shape == (len(TEXTS), 384)
    np.testing.assert_array_equal(served, as_matrix([item["embedding"] for item in expected["data"]]))
    assert response.usage.prompt_tokens > 0
    assert response.usage.prompt_tokens == response.usage.total_tokens == expected["usage"]["prompt_tokens"]
    assert response.model == expected["model"] and response.object == "list"


def test_float_encoding_equals_plain_http(
    fp32_gateway: RunningGateway, openai_client: ClientFactory, http: httpx.Client
) -> None:
    client = openai_client(fp32_gateway)
    response = client.embeddings.create(model="bge", input=TEXTS, encoding_format="float")
    expected = plain_float_embeddings(http, fp32_gateway, TEXTS)
    assert [item.index for item in response.data] == list(range(len(TEXTS)))
    np.testing.assert_array_equal(
        as_matrix([item.embedding for item in response.data]),
        as_matrix([item["embedding"] for item in expected["data"]]),
    )
    assert response.usage.prompt_tokens > 0
    assert response.usage.prompt_tokens == expected["usage"]["prompt_tokens"]


def test_base64_and_float_give_the_same_vectors_for_one_text(
    fp32_gateway: RunningGateway, openai_client: ClientFactory
) -> None:
    client = openai_client(fp32_gateway)
    decoded = client.embeddings.create(model="bge", input="hello world").data[0].embedding
    as_float = client.embeddings.create(model="bge", input="hello world", encoding_format="float").data[0].embedding
    np.testing.assert_array_equal(as_matrix([decoded]), as_matrix([as_float]))


@pytest.mark.parametrize("key", ["k1", "k2"])
def test_configured_api_keys_are_accepted(auth_gateway: RunningGateway, openai_client: ClientFactory, key: str) -> None:
    response = openai_client(auth_gateway, api_key=key).embeddings.create(model="bge", input=TEXTS[:2])
    assert len(response.data) == 2
    assert response.usage.prompt_tokens > 0


def test_wrong_api_key_raises_authentication_error(auth_gateway: RunningGateway, openai_client: ClientFactory) -> None:
    client = openai_client(auth_gateway, api_key="k3")
    with pytest.raises(openai.AuthenticationError) as caught:
        client.embeddings.create(model="bge", input=TEXTS[:1])
    error = caught.value
    assert error.status_code == 401
    assert error.type == "authentication_error" and error.code == "invalid_api_key"
    assert error.body == {
        "message": "invalid API key",
        "type": "authentication_error",
        "param": None,
        "code": "invalid_api_key",
    }
    assert "k3" not in error.message


@pytest.mark.parametrize(
    ("payload", "error_class", "status"),
    [
        ({"model": "bge", "input": []}, openai.BadRequestError, 400),
        ({"model": "bge", "input": ["fine", "   "]}, openai.BadRequestError, 400),
        ({"model": "text-embedding-3-large", "input": ["fine"]}, openai.NotFoundError, 404),
    ],
    ids=["empty-input", "blank-text", "unknown-model"],
)
def test_gateway_errors_arrive_with_the_gateways_message(
    payload: dict[str, Any],
    error_class: type[openai.APIStatusError],
    status: int,
    fp32_gateway: RunningGateway,
    openai_client: ClientFactory,
    http: httpx.Client,
) -> None:
    plain = http.post(f"{fp32_gateway.base_url}/v1/embeddings", json=payload)
    assert plain.status_code == status
    gateway_error = plain.json()["error"]

    client = openai_client(fp32_gateway)
    with pytest.raises(error_class) as caught:
        client.embeddings.create(model=payload["model"], input=payload["input"], encoding_format="float")
    error = caught.value
    assert error.status_code == status
    assert error.body == gateway_error
    assert error.message == f"Error code: {status} - {gateway_error['message']}"
    assert error.type == gateway_error["type"] and error.param == gateway_error["param"]
    assert error.request_id is not None
