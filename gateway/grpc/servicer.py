"""gateway.v1 servicers: protobuf in, one service call, protobuf out. Errors are mapped by the interceptor."""

from __future__ import annotations

from typing import Protocol

import grpc

from gateway.grpc.pb.gateway.v1 import gateway_pb2 as pb
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
