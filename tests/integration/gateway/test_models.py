"""GET /v1/models through the official `openai` client: real Triton, the Hunyuan simulator as the chat upstream."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import openai
import pytest
from pydantic import SecretStr

from gateway.settings import ChatSettings, VideoSettings
from localtriton.server import TritonProcess
from tests.helpers.hunyuan_fixtures import RunningHunyuanSimulator
from tests.helpers.running_gateway import RunningGateway

pytestmark = pytest.mark.slow

KEY = "sim-key-secret"
VIDEO = "fal-ai/pika/v2.2/text-to-video"


@pytest.fixture
def client() -> Iterator[Callable[[RunningGateway], openai.OpenAI]]:
    clients: list[openai.OpenAI] = []

    def make(gateway: RunningGateway) -> openai.OpenAI:
        clients.append(openai.OpenAI(base_url=f"{gateway.base_url}/v1", api_key="unused", max_retries=0, timeout=60))
        return clients[-1]

    yield make
    for made in clients:
        made.close()


def served_checkpoint(client: openai.OpenAI) -> str:
    return client.embeddings.create(model="bge", input=["which checkpoint?"]).model


def test_lists_the_embedding_the_upstreams_chat_and_the_video_models(
    triton: TritonProcess,
    hunyuan_simulator: RunningHunyuanSimulator,
    gateway_factory: Callable[..., RunningGateway],
    client: Callable[[RunningGateway], openai.OpenAI],
) -> None:
    hunyuan_simulator.config.api_key = KEY
    llm = ChatSettings(base_url=hunyuan_simulator.base_url, api_key=SecretStr(KEY), models="not-listed")
    gateway = gateway_factory(triton.grpc_url, chat=llm, video=VideoSettings(model_path=VIDEO))
    openai_client = client(gateway)

    models = openai_client.models.list()

    owners = {model.id: model.owned_by for model in models.data}
    chat = [model.id for model in models.data if model.id in hunyuan_simulator.config.models]
    assert list(owners)[:2] == ["bge", served_checkpoint(openai_client)]
    assert chat == list(hunyuan_simulator.config.models)  # the upstream's list, in its order
    assert "not-listed" not in owners  # the configured list is only what the upstream cannot tell
    assert owners["bge"] == "ai-gateway" and owners[VIDEO] == "fal-ai"
    assert all(owners[model] == "tencent" for model in chat)
    assert all(model.object == "model" and model.created >= 0 for model in models.data)


def test_without_a_chat_key_the_configured_chat_models_are_listed(
    triton: TritonProcess,
    hunyuan_simulator: RunningHunyuanSimulator,
    gateway_factory: Callable[..., RunningGateway],
    client: Callable[[RunningGateway], openai.OpenAI],
) -> None:
    llm = ChatSettings(
        base_url=hunyuan_simulator.base_url,
        api_key=None,
        models="hy3-preview",
        fallback_models="hy3-preview=deepseek-v4-flash",
    )
    gateway = gateway_factory(triton.grpc_url, chat=llm, video=VideoSettings(model_path=VIDEO))

    ids = [model.id for model in client(gateway).models.list().data]

    assert ids[0] == "bge" and ids[2:] == ["hy3-preview", "deepseek-v4-flash", VIDEO]
