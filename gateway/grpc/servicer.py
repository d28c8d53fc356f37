"""gateway.v1 servicers: protobuf in, one service call, protobuf out. Errors are mapped by the interceptor."""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from typing import Any, Protocol

import grpc
from pydantic import ValidationError

from gateway.errors import InvalidRequestError
from gateway.grpc.pb.gateway.v1 import gateway_pb2 as pb
from gateway.protocol.chat import ChatCompletionRequest
from gateway.services.chat import CacheResult
from gateway.services.embeddings import EmbeddingResult


class EmbeddingBackend(Protocol):
    """What the gRPC front end needs from the embedding service (`gateway.services.embeddings`)."""

    async def embed(
        self, texts: list[str], *, model: str | None = None, truncate: bool = True, use_cache: bool = True
    ) -> EmbeddingResult: ...

    async def ready(self) -> bool: ...


class EmbeddingsServicer:
    """`gateway.v1.Embeddings`. Sets trailing metadata `x-cache` (hit | miss | partial) on success."""

    def __init__(self, backend: EmbeddingBackend) -> None:
        self._backend = backend

    async def Embed(self, request: pb.EmbedRequest, context: grpc.aio.ServicerContext) -> pb.EmbedResponse:
        result = await self._backend.embed(
            list(request.input),
            model=request.model or None,
            truncate=request.truncate if request.HasField("truncate") else True,
            use_cache=not request.no_cache,
        )
        context.set_trailing_metadata((("x-cache", result.cache),))
        return embed_response(result)


def embed_response(result: EmbeddingResult) -> pb.EmbedResponse:
    usage = pb.Usage(
        prompt_tokens=result.prompt_tokens, total_tokens=result.prompt_tokens, truncated_texts=result.truncated_texts
    )
    data = [pb.Embedding(index=i, embedding=vector.tolist()) for i, vector in enumerate(result.vectors)]
    return pb.EmbedResponse(model=result.model, data=data, usage=usage, cache=result.cache)


class ChatBackend(Protocol):
    """What the gRPC front end needs from the chat service (`gateway.services.chat`)."""

    async def stream(
        self, body: dict[str, Any], *, use_cache: bool = True
    ) -> tuple[AsyncGenerator[str, None], CacheResult]: ...


class ChatServicer:
    """`gateway.v1.Chat`: the REST stream's chunks, one message each. Initial metadata `x-cache`."""

    def __init__(self, backend: ChatBackend) -> None:
        self._backend = backend

    async def Complete(self, request: pb.ChatRequest, context: grpc.aio.ServicerContext) -> AsyncIterator[pb.ChatChunk]:
        body = parse_chat_body(request.body_json)
        chunks, result = await self._backend.stream({**body, "stream": True}, use_cache=not request.no_cache)
        await context.send_initial_metadata((("x-cache", result.outcome),))
        async with aclosing(chunks):  # a cancelled call closes the upstream stream
            async for chunk in chunks:
                yield chat_chunk(chunk)


def parse_chat_body(body_json: str) -> dict[str, Any]:
    """The request body, validated like the REST API's."""
    try:
        request = ChatCompletionRequest.model_validate_json(body_json)
    except ValidationError as exc:
        first = exc.errors()[0]
        location = ".".join(str(part) for part in first.get("loc", ()))
        raise InvalidRequestError(f"body_json: {location}: {first['msg']}" if location else first["msg"]) from None
    return request.model_dump(exclude_unset=True)


def chat_chunk(chunk_json: str) -> pb.ChatChunk:
    chunk = json.loads(chunk_json)
    choice = (chunk.get("choices") or [{}])[0]
    return pb.ChatChunk(
        chunk_json=chunk_json,
        content=(choice.get("delta") or {}).get("content") or "",
        finish_reason=choice.get("finish_reason") or "",
    )
