"""The served models, framework-free: what `GET /v1/models` and `gateway.v1.Models/List` answer.

The embedding model (its ensemble alias and the checkpoint Triton serves), the chat models the upstream
lists (or, when it cannot be asked, the configured ones) and the video model. A listing never fails because
an upstream does: each part degrades to what the gateway knows without asking.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from gateway.errors import UpstreamError
from gateway.services.embeddings import ENSEMBLE_ALIAS
from gateway.upstreams.triton import ModelInfo

GATEWAY_OWNER = "ai-gateway"  # owner of what the gateway itself names (the ensemble alias)
CHAT_OWNER = "tencent"  # owner of a configured chat model, or of an upstream entry that names none
VIDEO_OWNER = "fal-ai"
CHAT_LIST_TTL_SECONDS = 60.0  # the upstream's list changes with its releases, not between requests
CHAT_LIST_TIMEOUT_SECONDS = 5.0  # a slow upstream delays a listing this long at most, then it degrades


@dataclass(frozen=True)
class ListedModel:
    id: str
    owned_by: str
    created: int = 0  # Unix seconds; 0 where the gateway does not know when the model was published


class ModelInfoSource(Protocol):
    """Where the served embedding checkpoint is read (`gateway.services.embeddings.Embedder`)."""

    async def model_info(self, *, refresh: bool = False) -> ModelInfo: ...


class ChatModelSource(Protocol):
    """The chat upstream's own list (`gateway.services.chat.ChatService.upstream_models`)."""

    async def upstream_models(self) -> list[dict[str, Any]]: ...


class ModelsService:
    """Lists the served models; the chat part is kept `CHAT_LIST_TTL_SECONDS` (on `clock`)."""

    def __init__(
        self,
        embedder: ModelInfoSource,
        chat: ChatModelSource | None,
        *,
        configured_chat_models: Sequence[str],
        video_model: str | None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._embedder = embedder
        self._chat = chat
        self._configured = [ListedModel(model, CHAT_OWNER) for model in configured_chat_models]
        self._video_model = video_model
        self._clock = clock
        self._checkpoint: str | None = None  # the last checkpoint name Triton reported
        self._chat_models: list[ListedModel] = []
        self._chat_expires_at = float("-inf")
        self._chat_lock = asyncio.Lock()  # concurrent listings past the expiry ask the upstream once

    async def list_models(self) -> list[ListedModel]:
        """Embedding, chat, then video models; an id listed twice keeps its first entry."""
        models = [*await self.embedding_models(), *await self.chat_models()]
        if self._video_model:
            models.append(ListedModel(self._video_model, owner_of(self._video_model, VIDEO_OWNER)))
        by_id: dict[str, ListedModel] = {}
        for model in models:
            by_id.setdefault(model.id, model)
        return list(by_id.values())

    async def embedding_models(self) -> list[ListedModel]:
        """The alias and the checkpoint; with Triton down, the last checkpoint seen (if any)."""
        with contextlib.suppress(UpstreamError):
            self._checkpoint = (await self._embedder.model_info()).name
        models = [ListedModel(ENSEMBLE_ALIAS, GATEWAY_OWNER)]
        if self._checkpoint and self._checkpoint != ENSEMBLE_ALIAS:
            models.append(ListedModel(self._checkpoint, owner_of(self._checkpoint, GATEWAY_OWNER)))
        return models

    async def chat_models(self) -> list[ListedModel]:
        """The upstream's list, asked at most once per `CHAT_LIST_TTL_SECONDS`; the configured models when it
        lists none, fails or cannot be asked (kept as long, so that a failing upstream is not asked on every
        listing)."""
        async with self._chat_lock:
            if self._clock() >= self._chat_expires_at:
                self._chat_models = await self._ask_upstream() or self._configured
                self._chat_expires_at = self._clock() + CHAT_LIST_TTL_SECONDS
            return self._chat_models

    async def _ask_upstream(self) -> list[ListedModel]:
        if self._chat is None:
            return []
        try:
            async with asyncio.timeout(CHAT_LIST_TIMEOUT_SECONDS):
                entries = await self._chat.upstream_models()
        except (UpstreamError, TimeoutError):
            return []
        return [
            ListedModel(str(entry["id"]), str(entry.get("owned_by") or CHAT_OWNER), published(entry))
            for entry in entries
            if isinstance(entry.get("id"), str) and entry["id"]
        ]


def published(entry: dict[str, Any]) -> int:
    created = entry.get("created")
    return created if isinstance(created, int) and not isinstance(created, bool) and created >= 0 else 0


def owner_of(model: str, default: str) -> str:
    """The organisation part of `org/name` (e.g. BAAI, fal-ai), else `default`."""
    org, slash, _ = model.partition("/")
    return org if slash and org else default
