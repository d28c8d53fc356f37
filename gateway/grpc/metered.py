"""The backends the gRPC servicers are given, with the caller's key around each call, as the REST routes do:
chat tokens and stream slots, videos per day, and the usage record (search upserts and queries included), whose
cost the call's trailing metadata carries (`call_cost`). The key is the one the interceptor found for this call
(`gateway.keys.context.CURRENT_KEY`)."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Sequence
from contextlib import AsyncExitStack
from typing import Any

from gateway.grpc.call_cost import charge
from gateway.grpc.servicer import ChatBackend, EmbeddingBackend, VideoBackend
from gateway.keys.context import CURRENT_KEY
from gateway.keys.gatekeeper import Gatekeeper
from gateway.keys.model import ApiKey
from gateway.keys.resolver import ANONYMOUS
from gateway.protocol.video import ImageGenerationRequest
from gateway.search.store import VectorStore
from gateway.services.chat import CacheResult, estimate_tokens, usage_requested
from gateway.services.embeddings import EmbeddingResult, EmbeddingService, InputType
from gateway.services.search import NewDocument, SearchResult, SearchService, UpsertResult
from gateway.services.search_reindex import ReindexJobs
from gateway.settings import LimitSettings
from gateway.tasks.model import Task
from gateway.usage.metering import metered_stream
from gateway.usage.record import Usage, video_usage
from gateway.usage.recorder import UsageRecorder


def current_key() -> ApiKey:
    return CURRENT_KEY.get() or ANONYMOUS


class MeteredEmbeddings:
    def __init__(self, backend: EmbeddingBackend, usage: UsageRecorder) -> None:
        self._backend = backend
        self._usage = usage

    async def embed(
        self,
        texts: list[str],
        *,
        model: str | None = None,
        truncate: bool = True,
        use_cache: bool = True,
        input_type: InputType = "document",
    ) -> EmbeddingResult:
        result = await self._backend.embed(
            texts, model=model, truncate=truncate, use_cache=use_cache, input_type=input_type
        )
        usage = Usage(embedding_texts=len(texts), embedding_tokens=result.prompt_tokens)
        charge(*self._usage.record(current_key(), result.model, usage))
        return result

    async def ready(self) -> bool:
        return await self._backend.ready()


class MeteredChat:
    def __init__(self, backend: ChatBackend, gatekeeper: Gatekeeper, usage: UsageRecorder) -> None:
        self._backend = backend
        self._gatekeeper = gatekeeper
        self._usage = usage

    async def stream(
        self, body: dict[str, Any], *, use_cache: bool = True
    ) -> tuple[AsyncGenerator[list[str], None], CacheResult]:
        key, model = current_key(), str(body.get("model", ""))
        async with AsyncExitStack() as stack:
            reservation = await stack.enter_async_context(self._gatekeeper.chat(key, estimate_tokens(body)))
            events, result = await self._backend.stream(body, use_cache=use_cache)
            metered = metered_stream(
                events,
                cached=result.outcome != "miss",
                usage_requested=usage_requested(body),
                reservation=reservation,
                held=stack.pop_all(),
                record=lambda usage: self._record(key, model, usage),
            )
            return metered, result

    async def _record(self, key: ApiKey, model: str, usage: Usage) -> None:
        charge(*await self._usage.record_durably(key, model, usage))


class MeteredVideo:
    def __init__(self, backend: VideoBackend, gatekeeper: Gatekeeper, usage: UsageRecorder, model: str) -> None:
        self._backend = backend
        self._gatekeeper = gatekeeper
        self._usage = usage
        self._model = model

    async def submit(
        self, request: ImageGenerationRequest, *, idempotency_key: str | None = None, caller: str = ""
    ) -> tuple[Task, bool]:
        key = current_key()
        await self._gatekeeper.count_video(key)
        task, created = await self._backend.submit(request, idempotency_key=idempotency_key, caller=caller)
        usage = video_usage(request.model_extra)
        charge(*await self._usage.record_durably(key, self._model, usage, request_id=f"video:{task.id}"))
        return task, created

    async def get(self, task_id: str) -> Task:
        return await self._backend.get(task_id)

    async def cancel(self, task_id: str) -> Task:
        return await self._backend.cancel(task_id)

    async def watch(self, task_id: str) -> AsyncGenerator[Task, None]:
        return await self._backend.watch(task_id)


class MeteredSearch(SearchService):
    """The search service whose upserts and searches go on the caller's usage record, as the REST routes'."""

    def __init__(
        self,
        store: VectorStore | None,
        embeddings: EmbeddingService,
        limits: LimitSettings,
        usage: UsageRecorder,
        jobs: ReindexJobs | None = None,
    ) -> None:
        super().__init__(store, embeddings, limits, jobs)
        self._usage = usage

    async def upsert(self, name: str, documents: Sequence[NewDocument], *, use_cache: bool = True) -> UpsertResult:
        result = await super().upsert(name, documents, use_cache=use_cache)
        charge(*self._usage.record(current_key(), result.model, result.usage))
        return result

    async def search(self, name: str, query: str, **options: Any) -> SearchResult:
        result = await super().search(name, query, **options)
        charge(*self._usage.record(current_key(), result.model, result.usage))
        return result
