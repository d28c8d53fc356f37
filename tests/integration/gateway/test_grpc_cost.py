"""The cost of a gRPC call in its trailing metadata `x-request-cost` (REST's `X-Request-Cost`), with a real grpc.aio
client against a real gateway (real Triton, the Hunyuan and Pika simulators): embeddings, chat streams, video
submissions, search upserts and queries carry it when their model has a price; calls without a price, and failed
calls, carry none."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import grpc
import pytest
from pydantic import SecretStr

from gateway.grpc.pb.gateway.v1 import gateway_pb2 as pb
from gateway.grpc.pb.gateway.v1 import gateway_pb2_grpc as pb_grpc
from gateway.settings import AuthSettings, ChatSettings, ModelPrice, UsageSettings, VideoSettings
from localtriton.server import TritonProcess
from tests.helpers.hunyuan_fixtures import RunningHunyuanSimulator
from tests.helpers.pika_fixtures import RunningPikaSimulator
from tests.helpers.running_gateway import RunningGateway

pytestmark = pytest.mark.slow

SECRET = "sk-grpc-cost-key-0001"
AUTH = (("authorization", f"Bearer {SECRET}"),)
EMBEDDING_MODEL = "sentence-transformers/all-MiniLM-L6-v2"  # what the test Triton serves
VIDEO_MODEL = "fal-ai/pika/v2.2/text-to-video"
PRICES = {
    EMBEDDING_MODEL: ModelPrice(embedding=2.0),  # per 1,000 tokens
    "hy3-preview": ModelPrice(input=1000, output=3000),  # per 1,000,000 tokens
    VIDEO_MODEL: ModelPrice(video_second=0.05),
}


@pytest.fixture
def gateway(
    triton: TritonProcess,
    gateway_factory: Callable[..., RunningGateway],
    hunyuan_simulator: RunningHunyuanSimulator,
    pika_simulator: RunningPikaSimulator,
) -> RunningGateway:
    pika_simulator.config.api_key = "fal-key"
    return gateway_factory(
        triton.grpc_url,
        auth=AuthSettings(api_keys=SecretStr(SECRET)),
        chat=ChatSettings(base_url=hunyuan_simulator.base_url, api_key=SecretStr("upstream-key")),
        video=VideoSettings(
            base_url=pika_simulator.base_url,
            api_key=SecretStr("fal-key"),
            webhook_jwks_url=pika_simulator.jwks_url,
            platform_url=pika_simulator.base_url,
        ),
        usage=UsageSettings(prices=PRICES),
    )


def cost_of(trailers: Any) -> str | None:
    """The `x-request-cost` trailer, or None."""
    value = dict(trailers or ()).get("x-request-cost")
    return None if value is None else str(value)


async def test_priced_grpc_calls_carry_their_cost_in_the_trailing_metadata(
    gateway: RunningGateway, hunyuan_simulator: RunningHunyuanSimulator
) -> None:
    async with grpc.aio.insecure_channel(gateway.grpc_target) as channel:
        embed = pb_grpc.EmbeddingsStub(channel).Embed(pb.EmbedRequest(input=["hello there", "bonjour"]), metadata=AUTH)
        embedded = await embed
        assert cost_of(await embed.trailing_metadata()) == f"{embedded.usage.prompt_tokens * 2.0 / 1000:.6f}"
        trailers = dict(await embed.trailing_metadata())
        assert trailers["x-cache"] == "miss"  # the servicer's own trailer is kept beside the cost

        for options in ({}, {"stream_options": {"include_usage": True}}):
            body = {"model": "hy3-preview", "messages": [{"role": "user", "content": f"price {options}"}], **options}
            chat = pb_grpc.ChatStub(channel).Complete(pb.ChatRequest(body_json=json.dumps(body)), metadata=AUTH)
            chunks = [chunk async for chunk in chat]
            usage = json.loads(chunks[-1].chunk_json).get("usage")
            assert (usage is not None) == bool(options)  # the usage chunk only for the client that asked
            if usage is None:  # what the upstream counted for the answer
                usage = hunyuan_simulator.stats.usage_by_answer[json.loads(chunks[0].chunk_json)["id"]]
            expected = (usage["prompt_tokens"] * 1000 + usage["completion_tokens"] * 3000) / 1e6
            assert cost_of(await chat.trailing_metadata()) == f"{expected:.6f}"
        replayed = pb_grpc.ChatStub(channel).Complete(pb.ChatRequest(body_json=json.dumps(body)), metadata=AUTH)
        assert [chunk async for chunk in replayed] and (await replayed.initial_metadata())["x-cache"] == "hit"
        assert cost_of(await replayed.trailing_metadata()) == "0.000000"  # the cache's answer costs nothing

        submit = pb_grpc.ImagesStub(channel).Submit(pb.ImageRequest(prompt="a cat on a windowsill"), metadata=AUTH)
        await submit
        assert cost_of(await submit.trailing_metadata()) == f"{5 * 0.05:.6f}"  # Pika's default 5 s

        search = pb_grpc.SearchStub(channel)
        created = search.CreateCollection(pb.CreateCollectionRequest(name="priced"), metadata=AUTH)
        await created
        assert cost_of(await created.trailing_metadata()) is None  # nothing embedded, nothing recorded
        document = pb.DocumentInput(id="cat", text="The cat slept on the warm windowsill.")
        upsert = search.UpsertDocuments(
            pb.UpsertDocumentsRequest(collection="priced", documents=[document]), metadata=AUTH
        )
        upserted = await upsert
        assert cost_of(await upsert.trailing_metadata()) == f"{upserted.usage.prompt_tokens * 2.0 / 1000:.6f}"
        query = search.Search(pb.SearchRequest(collection="priced", query="a sleeping cat", top_k=1), metadata=AUTH)
        found = await query
        assert cost_of(await query.trailing_metadata()) == f"{found.usage.prompt_tokens * 2.0 / 1000:.6f}"

        listed = pb_grpc.ModelsStub(channel).List(pb.ListModelsRequest(), metadata=AUTH)
        await listed
        assert cost_of(await listed.trailing_metadata()) is None  # no price applies
        refused = pb_grpc.EmbeddingsStub(channel).Embed(pb.EmbedRequest(input=[]), metadata=AUTH)
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await refused
        assert failed.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert cost_of(failed.value.trailing_metadata()) is None
