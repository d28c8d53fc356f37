"""ModelsService: what GET /v1/models lists, with fakes of Triton's model info and of the chat upstream's list."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from gateway.errors import UpstreamError
from gateway.services.models import CHAT_LIST_TTL_SECONDS, ListedModel, ModelsService
from gateway.settings import ChatSettings
from gateway.upstreams.chat import ChatNotConfiguredError, ChatUnavailableError
from gateway.upstreams.triton import ModelInfo, TritonUnavailableError

CHECKPOINT = "BAAI/bge-large-zh-v1.5"
VIDEO = "fal-ai/pika/v2.2/text-to-video"
UPSTREAM = [
    {"id": "hy3-preview", "object": "model", "created": 1767225600, "owned_by": "tencent"},
    {"id": "deepseek-v4-flash", "object": "model", "created": 1767225601, "owned_by": "deepseek"},
    {"id": "hy-mt2-pro", "object": "model"},  # no owner, no date: tencent, 0
]


@dataclass
class FakeTriton:
    down: bool = False

    async def model_info(self, *, refresh: bool = False) -> ModelInfo:
        if self.down:
            raise TritonUnavailableError("triton at 127.0.0.1:8001 is not reachable")
        return ModelInfo(CHECKPOINT, "r1", max_batch_size=64, max_sequence_length=512, dimension=1024)


@dataclass
class FakeChat:
    models: list[dict[str, Any]] = field(default_factory=lambda: list(UPSTREAM))
    error: UpstreamError | None = None
    calls: int = 0

    async def upstream_models(self) -> list[dict[str, Any]]:
        self.calls += 1
        if self.error is not None:
            raise self.error
        return self.models


@dataclass
class Clock:
    now: float = 1000.0

    def __call__(self) -> float:
        return self.now


def service(
    chat: FakeChat | None = None, triton: FakeTriton | None = None, clock: Clock | None = None
) -> ModelsService:
    return ModelsService(
        triton or FakeTriton(),
        chat if chat is not None else FakeChat(),
        configured_chat_models=["hy3-preview", "hy-fallback"],
        video_model=VIDEO,
        clock=clock or Clock(),
    )


async def test_lists_the_embedding_model_the_upstreams_chat_models_and_the_video_model() -> None:
    assert await service().list_models() == [
        ListedModel("bge", "ai-gateway"),
        ListedModel(CHECKPOINT, "BAAI"),
        ListedModel("hy3-preview", "tencent", 1767225600),
        ListedModel("deepseek-v4-flash", "deepseek", 1767225601),
        ListedModel("hy-mt2-pro", "tencent"),
        ListedModel(VIDEO, "fal-ai"),
    ]


@pytest.mark.parametrize(
    "chat",
    [
        FakeChat(error=ChatUnavailableError("chat upstream unreachable: ClientConnectorError")),
        FakeChat(error=ChatNotConfiguredError("chat is not configured: set CHAT_API_KEY")),
        FakeChat(models=[]),
    ],
    ids=["failing", "no-key", "empty"],
)
async def test_an_upstream_that_cannot_list_gives_the_configured_chat_models(chat: FakeChat) -> None:
    ids = [model.id for model in await service(chat).list_models()]
    assert ids == ["bge", CHECKPOINT, "hy3-preview", "hy-fallback", VIDEO]


async def test_without_a_chat_upstream_the_configured_models_are_listed() -> None:
    models = ModelsService(FakeTriton(), None, configured_chat_models=["hy3-preview"], video_model=None)
    assert [model.id for model in await models.list_models()] == ["bge", CHECKPOINT, "hy3-preview"]


async def test_the_chat_list_is_kept_for_60_seconds() -> None:
    chat, clock = FakeChat(), Clock()
    models = service(chat, clock=clock)
    first = [m.id for m in await models.chat_models()]
    chat.models = [{"id": "hy4"}]
    clock.now += CHAT_LIST_TTL_SECONDS - 0.5
    cached = [m.id for m in await models.chat_models()]
    clock.now += 1.0
    refreshed = [m.id for m in await models.chat_models()]
    assert first == ["hy3-preview", "deepseek-v4-flash", "hy-mt2-pro"]
    assert cached == first
    assert refreshed == ["hy4"]
    assert chat.calls == 2
    assert CHAT_LIST_TTL_SECONDS == 60.0


async def test_a_failed_listing_is_also_kept_then_the_upstream_is_asked_again() -> None:
    chat, clock = FakeChat(error=ChatUnavailableError("chat upstream unreachable")), Clock()
    models = service(chat, clock=clock)
    degraded = [m.id for m in await models.chat_models()]
    await models.chat_models()
    chat.error = None
    clock.now += CHAT_LIST_TTL_SECONDS
    recovered = [m.id for m in await models.chat_models()]
    assert degraded == ["hy3-preview", "hy-fallback"]
    assert recovered == ["hy3-preview", "deepseek-v4-flash", "hy-mt2-pro"]
    assert chat.calls == 2


async def test_triton_down_lists_the_alias_then_the_last_checkpoint_seen() -> None:
    triton = FakeTriton(down=True)
    models = service(triton=triton)
    seen = [[m.id for m in await models.embedding_models()]]
    triton.down = False
    seen.append([m.id for m in await models.embedding_models()])
    triton.down = True
    seen.append([m.id for m in await models.embedding_models()])
    assert seen == [["bge"], ["bge", CHECKPOINT], ["bge", CHECKPOINT]]


def test_configured_models_are_hunyuan_models_then_the_fallbacks_named() -> None:
    settings = ChatSettings(models="hy3-preview, hy-mt2-pro", fallback_models="hy3-preview=deepseek-v4-flash,x=y")
    assert settings.configured_models() == ["hy3-preview", "hy-mt2-pro", "deepseek-v4-flash", "x", "y"]
    assert ChatSettings(fallback_models="").configured_models() == ["hy3-preview"]
