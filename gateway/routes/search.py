"""Semantic search: /v1/collections (create, list, get, delete), its documents (upsert, get, delete, bulk
delete), POST /v1/collections/{name}/search and its re-index (202 + a task to GET and watch). Upserts and searches go on
the caller's usage record (documents, queries, embedding tokens) and answer `X-Request-Cost` when the embedding
model has a price."""

from __future__ import annotations

from typing import Any

import orjson
from fastapi import APIRouter, Depends, FastAPI, Path, Request, Response
from fastapi.responses import StreamingResponse

from gateway.protocol.openai import ErrorResponse
from gateway.protocol.search import (
    CollectionDeleted,
    CollectionList,
    CollectionObject,
    CollectionRequest,
    DeleteDocumentsRequest,
    DocumentDeleted,
    DocumentObject,
    DocumentsDeleted,
    ReindexProgress,
    ReindexTaskObject,
    SearchRequest,
    SearchResponse,
    SearchUsage,
    UpsertedDocument,
    UpsertRequest,
    UpsertResponse,
)
from gateway.protocol.video import TaskErrorObject
from gateway.routes import include
from gateway.routes.cache_control import cache_allowed
from gateway.routes.nesting import NestingLimitedRoute
from gateway.routes.task_events import EVENTS_RESPONSE, task_events
from gateway.services.search import (
    Chunking,
    Collection,
    Document,
    Fusion,
    Hit,
    NewDocument,
    SearchResult,
    SearchService,
    Task,
)
from gateway.services.search_reindex import public_progress


def search_service(request: Request) -> SearchService:
    service: SearchService = request.app.state.search
    return service


async def search_enabled(request: Request) -> None:
    """503 `search_disabled` before anything else, the request's body included, when search is off (async: a
    plain function would be run on a worker thread, a round trip per request)."""
    search_service(request).check_enabled()


# Bodies nested past the limit are refused by name before they are parsed (filters and metadata are free-form).
router = APIRouter(tags=["search"], dependencies=[Depends(search_enabled)], route_class=NestingLimitedRoute)

ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorResponse} for code in (400, 401, 403, 404, 409, 413, 429, 503, 504)
}
NAME = Path(description="The collection's name.", max_length=200)
DOCUMENT_ID = Path(description="The document's id.", max_length=1000)
TASK_ID = Path(description="The re-index task's id.", max_length=200)


@router.post("/v1/collections", status_code=201, response_model=CollectionObject, responses=ERRORS)
async def create_collection(body: CollectionRequest, request: Request) -> CollectionObject:
    chunking = None if body.chunking is None else Chunking(body.chunking.max_tokens, body.chunking.overlap)
    service = search_service(request)
    collection = await service.create_collection(body.name, body.query_instruction, body.metadata, chunking)
    return collection_object(collection)


@router.get("/v1/collections", response_model=CollectionList, responses=ERRORS)
async def list_collections(request: Request) -> CollectionList:
    return CollectionList(data=[collection_object(c) for c in await search_service(request).list_collections()])


@router.get("/v1/collections/{name}", response_model=CollectionObject, responses=ERRORS)
async def get_collection(request: Request, name: str = NAME) -> CollectionObject:
    return collection_object(await search_service(request).get_collection(name))


@router.delete("/v1/collections/{name}", response_model=CollectionDeleted, responses=ERRORS)
async def delete_collection(request: Request, name: str = NAME) -> CollectionDeleted:
    await search_service(request).delete_collection(name)
    return CollectionDeleted(name=name)


@router.post("/v1/collections/{name}/documents", response_model=UpsertResponse, responses=ERRORS)
async def upsert_documents(body: UpsertRequest, request: Request, name: str = NAME) -> UpsertResponse:
    documents = [NewDocument(d.id, d.text, dict(d.metadata)) for d in body.documents]
    result = await search_service(request).upsert(name, documents, use_cache=cache_allowed(request))
    truncated = set(result.truncated)
    return UpsertResponse(
        data=[UpsertedDocument(id=i, truncated=i in truncated) for i in result.ids],
        usage=SearchUsage(prompt_tokens=result.prompt_tokens, total_tokens=result.prompt_tokens),
    )


@router.post("/v1/collections/{name}/documents/delete", response_model=DocumentsDeleted, responses=ERRORS)
async def delete_documents(body: DeleteDocumentsRequest, request: Request, name: str = NAME) -> DocumentsDeleted:
    deleted = await search_service(request).delete_documents(name, body.ids, body.filter)
    return DocumentsDeleted(deleted=deleted)


@router.get("/v1/collections/{name}/documents/{document_id:path}", response_model=DocumentObject, responses=ERRORS)
async def get_document(request: Request, name: str = NAME, document_id: str = DOCUMENT_ID) -> DocumentObject:
    return document_object(await search_service(request).get_document(name, document_id))


@router.delete("/v1/collections/{name}/documents/{document_id:path}", response_model=DocumentDeleted, responses=ERRORS)
async def delete_document(request: Request, name: str = NAME, document_id: str = DOCUMENT_ID) -> DocumentDeleted:
    await search_service(request).delete_document(name, document_id)
    return DocumentDeleted(id=document_id)


@router.post("/v1/collections/{name}/search", response_model=SearchResponse, responses=ERRORS)
async def search(body: SearchRequest, request: Request, name: str = NAME) -> Response:
    fusion = body.fusion
    result = await search_service(request).search(
        name,
        body.query,
        top_k=body.top_k,
        where=body.filter,
        min_score=body.min_score,
        mode=body.mode,
        fusion=None if fusion is None else Fusion(fusion.method, fusion.k, fusion.weights, fusion.candidates),
        rerank_candidates=None if body.rerank is None else body.rerank.candidates,
        use_cache=cache_allowed(request),
    )
    return Response(search_response_json(body.query, result), media_type="application/json")


def search_response_json(query: str, result: SearchResult) -> bytes:
    """`SearchResponse` as JSON, written directly: the hot path's answer, not built as models and validated again
    by the framework (the route's `response_model` still documents it; a test holds the two to the same shape)."""
    return orjson.dumps(
        {
            "object": "search.result",
            "query": query,
            "data": [search_hit(h, result.score_type) for h in result.hits],
            "usage": {"prompt_tokens": result.prompt_tokens, "total_tokens": result.prompt_tokens},
        }
    )


def search_hit(hit: Hit, score_type: str) -> dict[str, object]:
    fields: dict[str, object] = {"id": hit.id, "score": hit.score, "score_type": score_type}
    if hit.scores is not None:
        fields["scores"] = hit.scores
    fields |= {"text": hit.text, "metadata": hit.metadata}
    if hit.chunk is not None:
        fields["chunk"] = {"text": hit.chunk.text, "start": hit.chunk.start, "end": hit.chunk.end}
    return fields


@router.post("/v1/collections/{name}/reindex", status_code=202, response_model=ReindexTaskObject, responses=ERRORS)
async def reindex_collection(request: Request, response: Response, name: str = NAME) -> ReindexTaskObject:
    """Re-embed every document with the served model, in the background; the task already under way, if any."""
    task, _ = await search_service(request).reindex(name)
    response.headers["Location"] = f"/v1/collections/{name}/reindex/{task.id}"
    return reindex_object(task)


@router.get("/v1/collections/{name}/reindex/{task_id}", response_model=ReindexTaskObject, responses=ERRORS)
async def get_reindex_task(request: Request, name: str = NAME, task_id: str = TASK_ID) -> ReindexTaskObject:
    return reindex_object(await search_service(request).reindex_task(name, task_id))


@router.get(
    "/v1/collections/{name}/reindex/{task_id}/events",
    response_class=StreamingResponse,
    responses={**EVENTS_RESPONSE, **ERRORS},
)
async def watch_reindex_task(request: Request, name: str = NAME, task_id: str = TASK_ID) -> StreamingResponse:
    """The job now, then at each change of its status or progress; the stream ends after its final state."""
    changes = await search_service(request).watch_reindex_task(name, task_id)
    return task_events(changes, lambda task: reindex_object(task).model_dump_json())


def reindex_object(task: Task) -> ReindexTaskObject:
    error = TaskErrorObject(code=task.error.code, message=task.error.message) if task.error else None
    return ReindexTaskObject(
        id=task.id,
        status=task.state.value,
        collection=task.arguments["collection"],
        model=task.arguments["model"],
        model_revision=task.arguments["model_revision"],
        progress=ReindexProgress(**public_progress(task)),
        created_at=int(task.created_at),
        updated_at=int(task.updated_at),
        completed_at=int(task.ended_at) if task.ended_at is not None else None,
        expires_at=int(task.expires_at) if task.expires_at is not None else None,
        error=error,
    )


def collection_object(collection: Collection) -> CollectionObject:
    return CollectionObject.model_validate(collection, from_attributes=True)


def document_object(document: Document) -> DocumentObject:
    return DocumentObject.model_validate(document, from_attributes=True)


def attach_router(app: FastAPI) -> None:
    include(app, router)
