"""The paid operations, each written once for REST and gRPC: reserve what the caller's key allows, call the
service, meter what the answer used and put it on the caller's usage record. The transports only translate.

The caller is the key the transport found for this request (`gateway.keys.context.CURRENT_KEY`: set by the key
middleware for REST and by the interceptor for gRPC); what its records cost is added to the request's
`CallCost` (`gateway.usage.call_cost`), which REST answers as `X-Request-Cost` and gRPC as the trailer
`x-request-cost`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any

from gateway.keys.context import CURRENT_KEY, current_key
from gateway.keys.gatekeeper import Gatekeeper
from gateway.keys.model import ApiKey
from gateway.keys.watch_tokens import WatchToken, WatchTokens
from gateway.protocol.video import ImageGenerationRequest
from gateway.search.store import VectorStore
from gateway.services.chat import CacheResult, ChatService, estimate_tokens, usage_requested
from gateway.services.embeddings import EmbeddingResult, EmbeddingService, InputType
from gateway.services.rerank import RerankResult, RerankService
from gateway.services.search import NewDocument, SearchResult, SearchService, UpsertResult
from gateway.services.search_chunks import ChunkedDocuments
from gateway.services.search_reindex import ReindexJobs
from gateway.services.video import VideoService
from gateway.settings import LimitSettings
from gateway.tasks.model import Task
from gateway.usage.call_cost import CURRENT_COST, CallCost, charge
from gateway.usage.metering import metered_stream
from gateway.usage.record import Usage, chat_usage, video_usage
from gateway.usage.recorder import UsageRecorder


def bill_to(key: ApiKey) -> CallCost:
    """Start billing the request being served (in its own task) to `key`; returns what its records will cost,
    which the transport answers (REST's header, gRPC's trailer)."""
    CURRENT_KEY.set(key)
    cost = CallCost()
    CURRENT_COST.set(cost)
    return cost


class BilledEmbeddings:
    def __init__(self, service: EmbeddingService, usage: UsageRecorder) -> None:
        self.service = service  # what costs nothing: readiness
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
        result = await self.service.embed(
            texts, model=model, truncate=truncate, use_cache=use_cache, input_type=input_type
        )
        usage = Usage(embedding_texts=len(texts), embedding_tokens=result.prompt_tokens)
        charge(*self._usage.record(current_key(), result.model, usage))
        return result

    async def ready(self) -> bool:
        return await self.service.ready()


@dataclass
class ChatStream:
    """An opened chat stream: its batches of chunks, how the cache answered, and `release`, which frees the key's
    reservation however the stream ends, also if it is never read (idempotent)."""

    batches: AsyncGenerator[list[str], None]
    result: CacheResult
    release: Callable[[], Awaitable[object]]


class BilledChat:
    """Chat with the key's token budget and stream slots held for the call, and the usage the upstream reports
    (settled against the estimate reserved) on the key's record, before the answer's end goes out."""

    def __init__(self, service: ChatService, gatekeeper: Gatekeeper, usage: UsageRecorder) -> None:
        self._service = service
        self._gatekeeper = gatekeeper
        self._usage = usage

    async def complete(self, body: dict[str, Any], *, use_cache: bool = True) -> tuple[dict[str, Any], CacheResult]:
        key = current_key()
        async with self._gatekeeper.chat(key, estimate_tokens(body)) as reservation:
            completion, result = await self._service.complete(body, use_cache=use_cache)
            usage = chat_usage(completion.get("usage"), cached=result.outcome != "miss")
            if completion.get("usage") or result.outcome != "miss":  # without usage the estimate stays charged
                reservation.settle(usage.prompt_tokens + usage.completion_tokens)
            await self._record(key, str(body.get("model", "")), usage)
        return completion, result

    async def stream(self, body: dict[str, Any], *, use_cache: bool = True) -> ChatStream:
        key, model = current_key(), str(body.get("model", ""))
        async with AsyncExitStack() as stack:
            reservation = await stack.enter_async_context(self._gatekeeper.chat(key, estimate_tokens(body)))
            batches, result = await self._service.stream(body, use_cache=use_cache)
            held = stack.pop_all()  # from here on the stream, or `release`, frees them
        metered = metered_stream(
            batches,
            cached=result.outcome != "miss",
            usage_requested=usage_requested(body),
            reservation=reservation,
            held=held,
            record=lambda usage: self._record(key, model, usage),
        )
        return ChatStream(metered, result, held.aclose)

    async def _record(self, key: ApiKey, model: str, usage: Usage) -> None:
        charge(*await self._usage.record_durably(key, model, usage))


class BilledVideo:
    """Video submits counted against the key's videos per day, each task recorded once (its id is the record's,
    however often an idempotent submit is replayed). Reading, watching and cancelling tasks, and watch tokens, cost
    nothing."""

    def __init__(
        self,
        service: VideoService,
        gatekeeper: Gatekeeper,
        usage: UsageRecorder,
        model: str,
        tokens: WatchTokens | None = None,
    ) -> None:
        self.service = service  # what costs nothing: readiness, the webhooks
        self._gatekeeper = gatekeeper
        self._usage = usage
        self._model = model
        self.tokens = tokens if tokens is not None else WatchTokens(None, 1.0)  # none: every token refused (503)

    async def submit(
        self, request: ImageGenerationRequest, *, idempotency_key: str | None = None, caller: str = ""
    ) -> tuple[Task, bool]:
        key = current_key()
        await self._gatekeeper.count_video(key)
        task, created = await self.service.submit(request, idempotency_key=idempotency_key, caller=caller)
        usage = video_usage(request.model_extra)
        charge(*await self._usage.record_durably(key, self._model, usage, request_id=f"video:{task.id}"))
        return task, created

    async def get(self, task_id: str) -> Task:
        return await self.service.get(task_id)

    async def cancel(self, task_id: str) -> Task:
        return await self.service.cancel(task_id)

    async def watch(self, task_id: str, after: int | None = None) -> AsyncGenerator[Task, None]:
        return await self.service.watch(task_id, after)

    async def watch_token(self, task_id: str) -> WatchToken:
        """A token that opens WebSockets on this task (404 for an unknown one) in the caller's key's name."""
        task = await self.service.get(task_id)
        return self.tokens.mint(task.id, current_key())


class BilledSearch(SearchService):
    """The search service whose upserts and searches go on the caller's usage record."""

    def __init__(
        self,
        store: VectorStore | None,
        embeddings: EmbeddingService,
        limits: LimitSettings,
        usage: UsageRecorder,
        jobs: ReindexJobs | None = None,
        reranker: RerankService | None = None,
        chunks: ChunkedDocuments | None = None,
    ) -> None:
        super().__init__(store, embeddings, limits, jobs, reranker, chunks)
        self._usage = usage

    async def upsert(self, name: str, documents: Sequence[NewDocument], *, use_cache: bool = True) -> UpsertResult:
        result = await super().upsert(name, documents, use_cache=use_cache)
        charge(*self._usage.record(current_key(), result.model, result.usage))
        return result

    async def search(self, name: str, query: str, **options: Any) -> SearchResult:
        result = await super().search(name, query, **options)
        charge(*self._usage.record(current_key(), result.model, result.usage))
        if result.reranked is not None:  # the reranker's share, under its own model (and price): no request more
            usage = dataclasses.replace(result.reranked.usage, requests=0)
            charge(*self._usage.record(current_key(), result.reranked.model, usage))
        return result


class BilledRerank:
    """Reranks on the caller's usage record: documents scored and the pairs' tokens, under the reranker's model."""

    def __init__(self, service: RerankService, usage: UsageRecorder) -> None:
        self.service = service
        self._usage = usage

    async def rerank(
        self, query: str, documents: Sequence[str], *, top_n: int | None = None, model: str | None = None
    ) -> RerankResult:
        result = await self.service.rerank(query, documents, top_n=top_n, model=model)
        charge(*self._usage.record(current_key(), result.model, result.usage))
        return result
