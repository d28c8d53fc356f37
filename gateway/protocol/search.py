"""Wire models of semantic search: collections, documents, search (the shapes Chroma, Qdrant and Pinecone users
expect, in the OpenAI style of the rest of the API). No logic."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt

from gateway.protocol.base import RequestModel
from gateway.protocol.video import TaskErrorObject

MetadataValue = str | StrictInt | StrictFloat | bool | list[str]


class ChunkingIn(RequestModel):
    model_config = ConfigDict(extra="forbid")

    max_tokens: StrictInt = Field(description="Tokens of the served model per chunk, 16 to its maximum length.")
    overlap: StrictInt = Field(0, description="Tokens each chunk shares with the one before, 0 to max_tokens / 2.")


class ChunkingObject(BaseModel):
    max_tokens: int
    overlap: int


class CollectionRequest(RequestModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="^[A-Za-z][A-Za-z0-9_-]{0,62}$, unique.")
    query_instruction: str | None = Field(
        None, description="Put in front of every search query; default: the served model's query instruction."
    )
    metadata: dict[str, Any] | None = Field(None, description="Any JSON object (at most 16 KB), kept as it is.")
    chunking: ChunkingIn | None = Field(
        None,
        description="Split each document into chunks of the served model's tokens, each embedded and indexed alone; "
        "a search answers each document once, by its best chunk. Default: one vector per document, its text cut at "
        "the model's maximum length.",
    )


class CollectionObject(BaseModel):
    object: Literal["collection"] = "collection"
    name: str
    model: str = Field(description="The checkpoint whose vectors the collection holds.")
    model_revision: str
    dimensions: int
    metric: Literal["cosine"] = "cosine"
    documents: int = Field(description="Documents in the collection now.")
    created_at: int = Field(description="Unix seconds.")
    query_instruction: str | None
    metadata: dict[str, Any]
    reindex_task: str | None = Field(
        None, description="The re-index task holding the collection: searches and writes answer 409 until it ends."
    )
    chunking: ChunkingObject | None = Field(None, description="How documents are split; null: they are not.")


class ReindexProgress(BaseModel):
    documents: int = Field(description="Documents re-indexed so far.")
    total: int = Field(description="Documents in the collection when the task was accepted.")


class ReindexTaskObject(BaseModel):
    id: str
    object: Literal["collection.reindex.task"] = "collection.reindex.task"
    status: Literal["pending", "processing", "completed", "failed", "cancelled"]
    collection: str
    model: str = Field(description="The model the collection is re-embedded with.")
    model_revision: str
    progress: ReindexProgress
    created_at: int = Field(description="Unix seconds.")
    updated_at: int = Field(description="Unix seconds.")
    completed_at: int | None = Field(None, description="Unix seconds at which the task ended.")
    expires_at: int | None = Field(None, description="After this (Unix seconds) the task is gone (404).")
    error: TaskErrorObject | None = Field(
        None, description="Why it failed: collection_deleted | dimensions_changed | superseded | internal_error"
    )


class CollectionList(BaseModel):
    object: Literal["list"] = "list"
    data: list[CollectionObject]


class CollectionDeleted(BaseModel):
    name: str
    object: Literal["collection.deleted"] = "collection.deleted"
    deleted: Literal[True] = True


class DocumentIn(RequestModel):
    model_config = ConfigDict(extra="forbid")

    id: str = Field(description="The client's id, 1 to 256 characters; the same id replaces the document.")
    text: str = Field(description="Embedded as a document (no query instruction).")
    metadata: dict[str, MetadataValue] = Field(
        default_factory=dict,
        description="Field names: letters, digits and _; values: strings, numbers, booleans or lists of strings.",
    )


class UpsertRequest(RequestModel):
    model_config = ConfigDict(extra="forbid")

    documents: list[DocumentIn] = Field(description="1 to 1,000 documents.")


class UpsertedDocument(BaseModel):
    id: str
    status: Literal["upserted"] = "upserted"
    truncated: bool = Field(False, description="The text was cut at the model's maximum tokens for its vector.")


class SearchUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class UpsertResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[UpsertedDocument]
    usage: SearchUsage


class DocumentObject(BaseModel):
    object: Literal["document"] = "document"
    id: str
    text: str
    metadata: dict[str, Any]
    created_at: int = Field(description="Unix seconds; kept when the document is replaced.")
    updated_at: int = Field(description="Unix seconds of the last upsert.")


class DocumentDeleted(BaseModel):
    id: str
    object: Literal["document.deleted"] = "document.deleted"
    deleted: Literal[True] = True


class DeleteDocumentsRequest(RequestModel):
    model_config = ConfigDict(extra="forbid")

    ids: list[str] | None = Field(None, description="Documents to delete (at most 1,000); unknown ids are skipped.")
    filter: dict[str, Any] | None = Field(None, description="Delete every document that matches (see search).")


class DocumentsDeleted(BaseModel):
    object: Literal["documents.deleted"] = "documents.deleted"
    deleted: int = Field(description="How many documents were deleted.")


class FusionIn(RequestModel):
    model_config = ConfigDict(extra="forbid")

    method: Literal["rrf", "weighted"] = Field(
        "weighted",
        description="weighted: each list's scores scaled to [0, 1] by its minimum and maximum, then summed with the "
        "weights; rrf: reciprocal rank fusion, sum of weight / (k + rank) over the lists.",
    )
    k: StrictInt = Field(60, description="rrf's constant, 1 to 10,000.")
    weights: dict[str, float] | None = Field(
        None, description='By list, 0 to 100: {"dense": 1, "lexical": 1}; a list left out weighs 1.'
    )
    candidates: StrictInt = Field(20, description="Taken from each list before fusing, 1 to 1,000 (at least top_k).")


class RerankIn(RequestModel):
    model_config = ConfigDict(extra="forbid")

    candidates: StrictInt = Field(
        50, description="The mode's best this many are scored by the reranker, 1 to 1,000 (at least top_k)."
    )


class SearchRequest(RequestModel):
    model_config = ConfigDict(extra="forbid")

    query: str = Field(
        description="Embedded with the collection's query instruction (dense, hybrid); analyzed into "
        "words (lexical, hybrid)."
    )
    top_k: StrictInt = Field(10, description="Results, 1 to 100.")
    filter: dict[str, Any] | None = Field(
        None,
        description="Metadata filter, Mongo style: {'lang': 'zh'}, {'price': {'$lt': 100}}; operators $eq $ne $gt "
        "$gte $lt $lte $in $nin $and $or.",
    )
    min_score: float | None = Field(
        None, description="Leave out results below this score (the mode's: see the hits' score_type)."
    )
    mode: Literal["dense", "lexical", "hybrid"] = Field(
        "dense",
        description="dense: by meaning (the query's vector, cosine); lexical: by words (BM25 over the analyzed "
        "text: English stemmed, Chinese segmented); hybrid: both, fused.",
    )
    fusion: FusionIn | None = Field(None, description="Hybrid only: how the two lists are fused (default: weighted).")
    rerank: RerankIn | None = Field(
        None,
        description="Order the mode's best candidates by the served reranker (a cross-encoder); the hits' score "
        "becomes its relevance (score_type relevance), their scores keep the retrieval's.",
    )


class ChunkObject(BaseModel):
    text: str
    start: int = Field(description="Where the chunk starts in the document's text, in Unicode code points.")
    end: int = Field(description="Where it ends (exclusive).")


class SearchHit(BaseModel):
    id: str
    score: float = Field(description="The mode's score, higher is better: see score_type.")
    score_type: Literal["cosine", "bm25", "rrf", "weighted", "relevance"] = Field(
        description="cosine: similarity of the query and the document (dense); bm25 (lexical); rrf or weighted: the "
        "fused score (hybrid); relevance: the reranker's, in [0, 1] (rerank)."
    )
    scores: dict[str, float] | None = Field(
        None,
        description="Hybrid: the hit's score in each list that found it (dense: cosine, lexical: BM25); reranked: "
        "those, or the mode's score as `retrieval`.",
    )
    text: str
    metadata: dict[str, Any]
    chunk: ChunkObject | None = Field(None, description="Chunked collections: the chunk the document was found by.")


class SearchResponse(BaseModel):
    object: Literal["search.result"] = "search.result"
    query: str
    data: list[SearchHit]
    usage: SearchUsage
