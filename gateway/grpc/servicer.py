"""gateway.v1 servicers: protobuf in, one service call, protobuf out. Errors are mapped by the interceptor."""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from typing import Any, Protocol

import grpc
from pydantic import ValidationError

from gateway.auth import caller_identity
from gateway.billing import BilledRerank, ChatStream
from gateway.errors import InvalidRequestError
from gateway.grpc.pb.gateway.v1 import gateway_pb2 as pb
from gateway.keys.watch_tokens import WatchToken
from gateway.protocol.base import MAX_NESTING_DEPTH
from gateway.protocol.chat import ChatCompletionRequest
from gateway.protocol.video import MAX_IDEMPOTENCY_KEY_CHARS, ImageGenerationRequest
from gateway.services.embeddings import EmbeddingResult, InputType
from gateway.services.models import ListedModel
from gateway.services.video import Task, public_task


class EmbeddingBackend(Protocol):
    """What the gRPC front end needs from the embedding service (`gateway.services.embeddings`)."""

    async def embed(
        self,
        texts: list[str],
        *,
        model: str | None = None,
        truncate: bool = True,
        use_cache: bool = True,
        input_type: InputType = "document",
    ) -> EmbeddingResult: ...

    async def ready(self) -> bool: ...


class EmbeddingsServicer:
    """`gateway.v1.Embeddings`. Sets trailing metadata `x-cache` (hit | miss) on success."""

    def __init__(self, backend: EmbeddingBackend) -> None:
        self._backend = backend

    async def Embed(self, request: pb.EmbedRequest, context: grpc.aio.ServicerContext) -> pb.EmbedResponse:
        result = await self._backend.embed(
            list(request.input),
            model=request.model or None,
            truncate=request.truncate if request.HasField("truncate") else True,
            use_cache=not request.no_cache,
            input_type=input_type(request.input_type),
        )
        context.set_trailing_metadata((("x-cache", result.cache),))
        return embed_response(result)


def input_type(value: str) -> InputType:
    if value in ("", "document"):
        return "document"
    if value == "query":
        return "query"
    raise InvalidRequestError(f"input_type is 'query' or 'document', got {value[:80]!r}", param="input_type")


def embed_response(result: EmbeddingResult) -> pb.EmbedResponse:
    usage = pb.Usage(
        prompt_tokens=result.prompt_tokens, total_tokens=result.prompt_tokens, truncated_texts=result.truncated_texts
    )
    data = [pb.Embedding(index=i, embedding=vector.tolist()) for i, vector in enumerate(result.vectors)]
    return pb.EmbedResponse(
        model=result.model, data=data, usage=usage, cache=result.cache, cached_texts=result.cached_texts
    )


class ChatBackend(Protocol):
    """What the gRPC front end needs from the billed chat service (`gateway.billing.BilledChat`)."""

    async def stream(self, body: dict[str, Any], *, use_cache: bool = True) -> ChatStream: ...


class ChatServicer:
    """`gateway.v1.Chat`: the REST stream's chunks, one message each. Initial metadata `x-cache`."""

    def __init__(self, backend: ChatBackend) -> None:
        self._backend = backend

    async def Complete(self, request: pb.ChatRequest, context: grpc.aio.ServicerContext) -> AsyncIterator[pb.ChatChunk]:
        body = parse_chat_body(request.body_json)
        opened = await self._backend.stream({**body, "stream": True}, use_cache=not request.no_cache)
        try:
            await context.send_initial_metadata((("x-cache", opened.result.outcome),))
            async with aclosing(opened.batches):  # a cancelled call closes the upstream stream
                async for batch in opened.batches:
                    for chunk in batch:
                        yield chat_chunk(chunk)
        finally:
            await opened.release()


def parse_chat_body(body_json: str) -> dict[str, Any]:
    """The request body, validated like the REST API's."""
    try:
        request = ChatCompletionRequest.model_validate_json(body_json)
    except ValidationError as exc:
        location, message = first_error(exc)
        raise InvalidRequestError(f"body_json: {location}: {message}" if location else message) from None
    except InvalidRequestError as exc:  # the body's own checks (nesting, lone surrogates), named within body_json
        raise InvalidRequestError(f"body_json: {exc.message}", param=exc.param) from None
    return request.model_dump(exclude_unset=True)


def first_error(exc: ValidationError) -> tuple[str, str]:
    """(dotted location, message) of the first error pydantic found; the location may be empty."""
    first = exc.errors()[0]
    return ".".join(str(part) for part in first.get("loc", ())), first["msg"]


def chat_chunk(chunk_json: str) -> pb.ChatChunk:
    chunk = json.loads(chunk_json)
    choice = (chunk.get("choices") or [{}])[0]
    delta = choice.get("delta") or {}
    return pb.ChatChunk(
        chunk_json=chunk_json,
        content=delta.get("content") or "",
        finish_reason=choice.get("finish_reason") or "",
        reasoning_content=delta.get("reasoning_content") or "",
    )


class VideoBackend(Protocol):
    """What the gRPC front end needs from the video task service (`gateway.services.video`)."""

    async def submit(
        self, request: ImageGenerationRequest, *, idempotency_key: str | None = None, caller: str = ""
    ) -> tuple[Task, bool]: ...

    async def get(self, task_id: str) -> Task: ...

    async def cancel(self, task_id: str) -> Task: ...

    async def watch(self, task_id: str) -> AsyncGenerator[Task, None]: ...

    async def watch_token(self, task_id: str) -> WatchToken: ...


class ImagesServicer:
    """`gateway.v1.Images`: the REST task API over the same service. Submit sets trailing metadata
    `idempotent-replayed: true` when the idempotency key named an earlier task."""

    def __init__(self, backend: VideoBackend) -> None:
        self._backend = backend

    async def Submit(self, request: pb.ImageRequest, context: grpc.aio.ServicerContext) -> pb.Task:
        body = video_request(request)
        key = idempotency_key(request.idempotency_key)
        task, created = await self._backend.submit(body, idempotency_key=key, caller=caller(context))
        if not created:
            context.set_trailing_metadata((("idempotent-replayed", "true"),))
        return task_message(task)

    async def GetTask(self, request: pb.TaskRequest, context: grpc.aio.ServicerContext) -> pb.Task:
        return task_message(await self._backend.get(request.task_id))

    async def CancelTask(self, request: pb.TaskRequest, context: grpc.aio.ServicerContext) -> pb.Task:
        return task_message(await self._backend.cancel(request.task_id))

    async def CreateWatchToken(self, request: pb.TaskRequest, context: grpc.aio.ServicerContext) -> pb.WatchToken:
        token = await self._backend.watch_token(request.task_id)
        return pb.WatchToken(token=token.token, task_id=token.task_id, expires_at=token.expires_at)

    async def WatchTask(self, request: pb.TaskRequest, context: grpc.aio.ServicerContext) -> AsyncIterator[pb.Task]:
        changes = await self._backend.watch(request.task_id)
        async with aclosing(changes):  # a cancelled call stops the watch (and its store subscription)
            async for task in changes:
                yield task_message(task)


def video_request(request: pb.ImageRequest) -> ImageGenerationRequest:
    """The generation request, validated like the REST body; options_json supplies the pass-through fields."""
    fields: dict[str, Any] = {"prompt": request.prompt}
    for name in ("negative_prompt", "width", "height", "size"):
        if request.HasField(name):
            fields[name] = getattr(request, name)
    try:
        return ImageGenerationRequest.model_validate({**video_options(request.options_json), **fields})
    except ValidationError as exc:
        location, message = first_error(exc)
        raise InvalidRequestError(f"{location}: {message}" if location else message, param=location or None) from None


def video_options(options_json: str) -> dict[str, Any]:
    if not options_json:
        return {}
    try:
        options = json.loads(options_json)
    except ValueError as exc:
        message = f"options_json: expected a JSON object, got invalid JSON ({exc})"
        raise InvalidRequestError(message, param="options_json") from None
    except RecursionError:  # the parser's own stack: far past the limit the request model names
        message = f"options_json: nested deeper than the maximum of {MAX_NESTING_DEPTH} levels"
        raise InvalidRequestError(message, param="options_json") from None
    if not isinstance(options, dict):
        message = f"options_json: expected a JSON object, got {json_type(options)}"
        raise InvalidRequestError(message, param="options_json")
    named = sorted(options.keys() & ImageGenerationRequest.model_fields.keys())
    if named:
        message = f"options_json: {', '.join(named)} must be given as ImageRequest fields, not options"
        raise InvalidRequestError(message, param="options_json")
    return options


def json_type(value: Any) -> str:
    names = {dict: "object", list: "array", str: "string", bool: "boolean", int: "number", float: "number"}
    return names.get(type(value), "null")


def idempotency_key(key: str) -> str | None:
    if len(key) > MAX_IDEMPOTENCY_KEY_CHARS:
        raise InvalidRequestError(
            f"idempotency_key has {len(key)} characters; at most {MAX_IDEMPOTENCY_KEY_CHARS} are accepted",
            param="idempotency_key",
        )
    return key or None


def caller(context: grpc.aio.ServicerContext) -> str:
    """Who calls (`caller_identity` of the `authorization` metadata, as REST reads its header): idempotency
    keys are scoped to it."""
    return caller_identity(
        next((str(value) for key, value in context.invocation_metadata() or () if key == "authorization"), None)
    )


def task_message(task: Task) -> pb.Task:
    """The task as REST shows it (`public_task`), field for field."""
    public = public_task(task)
    return pb.Task(
        id=public.id,
        status=public.status,
        created_at=public.created_at,
        updated_at=public.updated_at,
        completed_at=public.completed_at,
        expires_at=public.expires_at,
        urls=public.urls,
        result_json=compact_json(public.result) if public.result is not None else "",
        error_code=public.error.code if public.error else "",
        error_message=public.error.message if public.error else "",
    )


def compact_json(value: Any) -> str:
    """JSON as the REST body writes it (pydantic: no spaces, non-ASCII kept)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


class ModelsBackend(Protocol):
    """What the gRPC front end needs from the model listing (`gateway.services.models`)."""

    async def list_models(self) -> list[ListedModel]: ...


class ModelsServicer:
    """`gateway.v1.Models`: REST's GET /v1/models."""

    def __init__(self, backend: ModelsBackend) -> None:
        self._backend = backend

    async def List(self, request: pb.ListModelsRequest, context: grpc.aio.ServicerContext) -> pb.ModelList:
        listed = await self._backend.list_models()
        return pb.ModelList(data=[pb.Model(id=m.id, created=m.created, owned_by=m.owned_by) for m in listed])


class RerankServicer:
    """`gateway.v1.Rerank`: REST's POST /v1/rerank."""

    def __init__(self, backend: BilledRerank) -> None:
        self._backend = backend

    async def Rerank(self, request: pb.RerankRequest, context: grpc.aio.ServicerContext) -> pb.RerankResponse:
        documents = list(request.documents)
        result = await self._backend.rerank(
            request.query,
            documents,
            top_n=request.top_n if request.HasField("top_n") else None,
            model=request.model or None,
        )
        results = [
            pb.RerankResult(
                index=r.index,
                relevance_score=r.relevance_score,
                document=documents[r.index] if request.return_documents else "",
            )
            for r in result.results
        ]
        usage = pb.Usage(prompt_tokens=result.tokens, total_tokens=result.tokens)
        return pb.RerankResponse(model=result.model, results=results, usage=usage)
