"""gateway.v1.Models/List over a real grpc.aio server, with a real ModelsService over fakes of its upstreams."""

from __future__ import annotations

from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gateway.grpc.pb.gateway.v1 import gateway_pb2 as pb
from gateway.limits import InFlightLimit
from gateway.services.models import ModelsService
from gateway.upstreams.chat import ChatUnavailableError
from gateway.upstreams.triton import ModelInfo
from tests.helpers.grpc_harness import AUTH, HarnessFactory

CHECKPOINT = "BAAI/bge-large-zh-v1.5"
VIDEO = "fal-ai/pika/v2.2/text-to-video"


class FakeTriton:
    async def model_info(self, *, refresh: bool = False) -> ModelInfo:
        return ModelInfo(CHECKPOINT, "r1", max_batch_size=64, max_sequence_length=512, dimension=1024)


class FakeChat:
    def __init__(self, fail: bool = False) -> None:
        self.fail = fail

    async def upstream_models(self) -> list[dict[str, Any]]:
        if self.fail:
            raise ChatUnavailableError("chat upstream unreachable: ClientConnectorError")
        return [{"id": "hy3-preview", "object": "model", "created": 1767225600, "owned_by": "tencent"}]


def listing(fail: bool = False) -> ModelsService:
    return ModelsService(FakeTriton(), FakeChat(fail), configured_chat_models=["hy-configured"], video_model=VIDEO)


def entries(models: pb.ModelList) -> list[tuple[str, int, str]]:
    return [(model.id, model.created, model.owned_by) for model in models.data]


def test_list_answers_every_served_model(harness_factory: HarnessFactory) -> None:
    harness = harness_factory(models=listing())

    models = harness.models.List(pb.ListModelsRequest(), metadata=AUTH)

    assert entries(models) == [
        ("bge", 0, "ai-gateway"),
        (CHECKPOINT, 0, "BAAI"),
        ("hy3-preview", 1767225600, "tencent"),
        (VIDEO, 0, "fal-ai"),
    ]


def test_a_failing_chat_upstream_lists_the_configured_models(harness_factory: HarnessFactory) -> None:
    harness = harness_factory(models=listing(fail=True))

    models = harness.models.List(pb.ListModelsRequest(), metadata=AUTH)

    assert [model.id for model in models.data] == ["bge", CHECKPOINT, "hy-configured", VIDEO]


@pytest.mark.parametrize("metadata", [(), (("authorization", "Bearer wrong-key"),)], ids=["missing", "wrong"])
def test_list_needs_the_api_key(harness_factory: HarnessFactory, metadata: Any) -> None:
    harness = harness_factory(models=listing())

    with pytest.raises(grpc.RpcError) as info:
        harness.models.List(pb.ListModelsRequest(), metadata=metadata)

    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_list_counts_against_the_in_flight_limit(harness_factory: HarnessFactory) -> None:
    limit = InFlightLimit(1)
    harness = harness_factory(models=listing(), in_flight=limit)
    assert limit.acquire()  # a REST request holds the only permit

    with pytest.raises(grpc.RpcError) as info:
        harness.models.List(pb.ListModelsRequest(), metadata=AUTH)

    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    limit.release()
    assert len(harness.models.List(pb.ListModelsRequest(), metadata=AUTH).data) == 4


def test_health_reports_the_models_service_only_when_served(harness_factory: HarnessFactory) -> None:
    served = health_pb2_grpc.HealthStub(harness_factory(models=listing()).channel)
    plain = harness_factory()

    status = served.Check(health_pb2.HealthCheckRequest(service="gateway.v1.Models")).status
    assert status == health_pb2.HealthCheckResponse.SERVING
    with pytest.raises(grpc.RpcError) as info:
        plain.models.List(pb.ListModelsRequest(), metadata=AUTH)
    assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED
