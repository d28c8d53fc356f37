"""`gateway.v1.Search`: the REST API's /v1/collections over gRPC, calling the same `SearchService` methods.

Metadata and filters arrive as JSON text, read as REST reads a body (NaN, infinities and lone surrogates
included, to be refused by name), and are validated with the REST wire models and checks, at the place they have
in the REST body: both front ends refuse the same input with the same message. Errors are mapped by the interceptor.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any, TypeVar

import grpc
import orjson
from pydantic import BaseModel, ValidationError

from gateway.errors import InvalidRequestError
from gateway.grpc.pb.gateway.v1 import gateway_pb2 as pb
from gateway.grpc.servicer import first_error
from gateway.protocol.base import MAX_NESTING_DEPTH, check_json
from gateway.protocol.search import DocumentIn
from gateway.protocol.unicode import dotted, printable
from gateway.services.search import (
    RERANK_CANDIDATES,
    Chunking,
    Collection,
    Document,
    Fusion,
    NewDocument,
    SearchService,
    Task,
)
from gateway.services.search_reindex import public_progress

M = TypeVar("M", bound=BaseModel)


class SearchServicer:
    def __init__(self, service: SearchService) -> None:
        self._service = service

    async def CreateCollection(
        self, request: pb.CreateCollectionRequest, context: grpc.aio.ServicerContext
    ) -> pb.SearchCollection:
        instruction = request.query_instruction if request.HasField("query_instruction") else None
        metadata = json_object(request.metadata_json, "metadata_json")
        check_body({"metadata": metadata})
        chunking = None
        if request.HasField("chunking"):
            chunking = Chunking(request.chunking.max_tokens, request.chunking.overlap)
        return collection_message(await self._service.create_collection(request.name, instruction, metadata, chunking))

    async def ListCollections(
        self, request: pb.ListCollectionsRequest, context: grpc.aio.ServicerContext
    ) -> pb.SearchCollectionList:
        collections = await self._service.list_collections()
        return pb.SearchCollectionList(data=[collection_message(c) for c in collections])

    async def GetCollection(
        self, request: pb.CollectionRequest, context: grpc.aio.ServicerContext
    ) -> pb.SearchCollection:
        return collection_message(await self._service.get_collection(request.name))

    async def DeleteCollection(
        self, request: pb.CollectionRequest, context: grpc.aio.ServicerContext
    ) -> pb.CollectionDeleted:
        await self._service.delete_collection(request.name)
        return pb.CollectionDeleted(name=request.name, deleted=True)

    async def UpsertDocuments(
        self, request: pb.UpsertDocumentsRequest, context: grpc.aio.ServicerContext
    ) -> pb.UpsertDocumentsResponse:
        raw = [document_fields(d) for d in request.documents]
        check_body({"documents": raw})
        documents = [new_document(index, fields) for index, fields in enumerate(raw)]
        result = await self._service.upsert(request.collection, documents, use_cache=not request.no_cache)
        truncated = set(result.truncated)
        return pb.UpsertDocumentsResponse(
            data=[pb.UpsertedDocument(id=i, status="upserted", truncated=i in truncated) for i in result.ids],
            usage=pb.Usage(
                prompt_tokens=result.prompt_tokens, total_tokens=result.prompt_tokens, truncated_texts=len(truncated)
            ),
        )

    async def GetDocument(self, request: pb.DocumentRequest, context: grpc.aio.ServicerContext) -> pb.SearchDocument:
        return document_message(await self._service.get_document(request.collection, request.id))

    async def DeleteDocument(
        self, request: pb.DocumentRequest, context: grpc.aio.ServicerContext
    ) -> pb.DocumentDeleted:
        await self._service.delete_document(request.collection, request.id)
        return pb.DocumentDeleted(id=request.id, deleted=True)

    async def DeleteDocuments(
        self, request: pb.DeleteDocumentsRequest, context: grpc.aio.ServicerContext
    ) -> pb.DocumentsDeleted:
        where = json_object(request.filter_json, "filter_json")
        check_body({"filter": where})
        ids = list(request.ids) if request.ids or where is None else None
        return pb.DocumentsDeleted(deleted=await self._service.delete_documents(request.collection, ids, where))

    async def Search(self, request: pb.SearchRequest, context: grpc.aio.ServicerContext) -> pb.SearchResponse:
        where = json_object(request.filter_json, "filter_json")
        min_score = request.min_score if request.HasField("min_score") else None
        check_body({"filter": where, "min_score": min_score})
        result = await self._service.search(
            request.collection,
            request.query,
            top_k=request.top_k or 10,
            where=where,
            min_score=min_score,
            mode=request.mode or "dense",
            fusion=fusion(request.fusion) if request.HasField("fusion") else None,
            rerank_candidates=rerank_candidates(request),
            use_cache=not request.no_cache,
        )
        context.set_trailing_metadata((("x-cache", "hit" if result.cached else "miss"),))
        hits = [
            pb.SearchHit(
                id=h.id,
                score=h.score,
                text=h.text,
                metadata_json=orjson.dumps(h.metadata).decode(),
                score_type=result.score_type,
                scores=h.scores,
                chunk=None if h.chunk is None else pb.SearchChunk(**dataclasses.asdict(h.chunk)),
            )
            for h in result.hits
        ]
        usage = pb.Usage(prompt_tokens=result.prompt_tokens, total_tokens=result.prompt_tokens)
        return pb.SearchResponse(query=request.query, data=hits, usage=usage)

    async def ReindexCollection(
        self, request: pb.CollectionRequest, context: grpc.aio.ServicerContext
    ) -> pb.ReindexTask:
        task, _ = await self._service.reindex(request.name)
        return reindex_message(task)

    async def GetReindexTask(self, request: pb.ReindexTaskRequest, context: grpc.aio.ServicerContext) -> pb.ReindexTask:
        return reindex_message(await self._service.reindex_task(request.collection, request.id))

    async def WatchReindexTask(
        self, request: pb.ReindexTaskRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.ReindexTask]:
        changes = await self._service.watch_reindex_task(request.collection, request.id)
        async with aclosing(changes):  # a cancelled call stops the watch (and its store subscription)
            async for task in changes:
                yield reindex_message(task)


def rerank_candidates(request: pb.SearchRequest) -> int | None:
    if not request.HasField("rerank"):
        return None
    return request.rerank.candidates if request.rerank.HasField("candidates") else RERANK_CANDIDATES


def fusion(message: pb.SearchFusion) -> Fusion:
    defaults = Fusion()
    return Fusion(
        message.method or defaults.method,  # type: ignore[arg-type]  # Fusion checks it
        message.k if message.HasField("k") else defaults.k,
        dict(message.weights) or None,
        message.candidates if message.HasField("candidates") else defaults.candidates,
    )


def reindex_message(task: Task) -> pb.ReindexTask:
    progress = public_progress(task)
    return pb.ReindexTask(
        id=task.id,
        status=task.state.value,
        collection=task.arguments["collection"],
        model=task.arguments["model"],
        model_revision=task.arguments["model_revision"],
        documents=progress["documents"],
        total=progress["total"],
        created_at=int(task.created_at),
        updated_at=int(task.updated_at),
        completed_at=int(task.ended_at) if task.ended_at is not None else None,
        expires_at=int(task.expires_at) if task.expires_at is not None else None,
        error_code=task.error.code if task.error else "",
        error_message=task.error.message if task.error else "",
    )


def json_object(text: str, field: str) -> dict[str, Any] | None:
    """The JSON object in `text`; None when it is empty. Read as FastAPI reads a REST body (the standard
    library's parser), so `check_body` names the field holding a NaN or a lone surrogate, as REST does."""
    if not text:
        return None
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise InvalidRequestError(f"{field} is not valid JSON: {exc}", param=field) from None
    except RecursionError:  # the parser's own stack: far past the limit the checks below name
        raise InvalidRequestError(
            f"{field}: nested deeper than the maximum of {MAX_NESTING_DEPTH} levels", param=field
        ) from None
    if not isinstance(value, dict):
        raise InvalidRequestError(f"{field} must be a JSON object", param=field)
    return value


def check_body(body: dict[str, Any]) -> None:
    """The REST body's checks (`RequestModel`: nesting depth, lone surrogates, NaN and infinities) on the fields
    as the REST body would hold them, so the messages name the same place."""
    path = check_json(body)
    if path is not None:
        raise InvalidRequestError(f"{printable(dotted(path))}: Input should be a finite number", param=str(path[0]))


def document_fields(message: pb.DocumentInput) -> dict[str, Any]:
    raw = {"id": message.id, "text": message.text, "metadata": json_object(message.metadata_json, "metadata_json")}
    return {k: v for k, v in raw.items() if v is not None}


def new_document(index: int, fields: dict[str, Any]) -> NewDocument:
    parsed = validated(DocumentIn, fields, f"documents[{index}]")
    return NewDocument(parsed.id, parsed.text, dict(parsed.metadata))


def validated(model: type[M], raw: dict[str, Any], where: str) -> M:
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        location, message = first_error(exc)
        raise InvalidRequestError(f"{where}.{location}: {message}", param="documents") from None


def collection_message(collection: Collection) -> pb.SearchCollection:
    return pb.SearchCollection(
        name=collection.name,
        model=collection.model,
        model_revision=collection.model_revision,
        dimensions=collection.dimensions,
        metric="cosine",
        documents=collection.documents,
        created_at=collection.created_at,
        query_instruction=collection.query_instruction,
        metadata_json=orjson.dumps(collection.metadata).decode(),
        chunking=None if collection.chunking is None else pb.Chunking(**dataclasses.asdict(collection.chunking)),
    )


def document_message(document: Document) -> pb.SearchDocument:
    return pb.SearchDocument(
        id=document.id,
        text=document.text,
        metadata_json=orjson.dumps(document.metadata).decode(),
        created_at=document.created_at,
        updated_at=document.updated_at,
    )
