"""The one interface every vector store implements, and the errors it raises.

Implementations: `embedded.py` (Qdrant Edge in this process, files under SEARCH_PATH) and `milvus.py`
(a Milvus server through pymilvus). Both are synchronous libraries: every call runs on the store's own
thread pool, so a slow disk or server never blocks the event loop.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from gateway.errors import ConflictError, InvalidRequestError, NotFoundError, UpstreamUnavailableError
from gateway.search.documents import Collection, Document, Hit, Metadata, Vector
from gateway.search.filters import Filter

HNSW_EF = 128  # SEARCH_HNSW_EF's default: a dense search's breadth in the graph, in both stores


class SearchStoreUnavailableError(UpstreamUnavailableError):
    """The vector store (Milvus, or the embedded store) failed a call: search is down, the rest of the gateway
    is not; the logged detail names the failure.

    Do: client: retry later; operator: Milvus reachable at `SEARCH_MILVUS_URI` (token, egress), or `SEARCH_PATH`
    mounted, writable and not full (`gateway_search_store_errors_total` by operation).
    """

    code = "search_store_unavailable"


class LexicalSearchUnavailableError(InvalidRequestError):
    """A lexical or hybrid search on a store whose engine has no BM25 (Milvus servers before 2.5), or on a Milvus
    collection made before the gateway used Milvus's full text search.

    Do: client: search with `"mode": "dense"`; operator: use the embedded store, or a Milvus with full text
    search (2.5 or later), and make the collection again there.
    """

    code = "lexical_search_unavailable"

    def __init__(self, store: str) -> None:
        super().__init__(
            f"lexical and hybrid search need a BM25 index, which this collection in the {store} store has not (a "
            f'Milvus before 2.5, or a collection made before the gateway used its full text search); use "mode": '
            f'"dense"',
            param="mode",
        )


class CollectionNotFoundError(NotFoundError):
    """The search collection the request names does not exist (never created, or deleted).

    Do: check the name (`GET /v1/collections` lists them), or create it with `POST /v1/collections`.
    """

    code = "collection_not_found"

    def __init__(self, name: str) -> None:
        super().__init__(f"collection {name!r} does not exist", param="name")


class CollectionExistsError(ConflictError):
    """`POST /v1/collections` names a collection that exists already.

    Do: use the existing collection, or choose another name (or delete the old one first).
    """

    code = "collection_exists"

    def __init__(self, name: str) -> None:
        super().__init__(f"collection {name!r} already exists", param="name")


@dataclass(frozen=True)
class DocumentWrite:
    """One document to upsert, with its vector (L2-normalised) and its terms (`analyzer.analyze`)."""

    id: str
    text: str
    metadata: Metadata
    vector: Vector
    terms: str


@dataclass(frozen=True)
class IndexUpdate:
    """What a re-index writes again for one document: its vector (None: kept) and its terms."""

    vector: Vector | None
    terms: str


class VectorStore(Protocol):
    """Collections of documents with their vectors, texts and metadata; cosine search with filters.

    Every write is durable when its call returns. Unknown collections raise CollectionNotFoundError; an
    unreachable or failing engine raises SearchStoreUnavailableError.
    """

    name: str  # "embedded" or "milvus", for errors and /readyz

    async def lexical(self, name: str | None = None) -> bool:
        """Whether the store holds a lexical index (BM25 over the documents' terms) for collection `name`, or, with
        no name, for a collection made now."""
        ...

    async def create_collection(self, collection: Collection) -> None: ...

    async def collection(self, name: str) -> Collection:
        """The collection's record, without counting its documents (what every upsert and search reads)."""
        ...

    async def get_collection(self, name: str) -> Collection:
        """The record with its document count."""
        ...

    async def list_collections(self) -> list[Collection]: ...

    async def update_collection(self, collection: Collection) -> None:
        """Replace the collection's record (durably), e.g. its revision after a re-index."""
        ...

    async def delete_collection(self, name: str) -> None: ...

    async def upsert(self, name: str, documents: Sequence[DocumentWrite], now: int) -> None:
        """Insert or replace; a replaced document keeps its `created_at`, `updated_at` becomes `now`."""
        ...

    async def get_documents(self, name: str, ids: Sequence[str]) -> list[Document]:
        """The documents that exist among `ids`, in no particular order."""
        ...

    async def delete_documents(self, name: str, ids: Sequence[str]) -> int:
        """Deletes those that exist; answers how many did."""
        ...

    async def delete_matching(self, name: str, where: Filter) -> int: ...

    async def scroll(self, name: str, after: str | None, limit: int) -> tuple[list[Document], str | None]:
        """Up to `limit` documents from the cursor `after` (None: the first), in a fixed order, and the cursor
        of the next page (None after the last): what a re-index walks through."""
        ...

    async def set_index(self, name: str, updates: dict[str, IndexUpdate]) -> None:
        """Replace the vectors and terms of existing documents (by id), keeping their text, metadata and
        timestamps."""
        ...

    async def search(
        self, name: str, vector: Vector, top_k: int, where: Filter | None, min_score: float | None
    ) -> list[Hit]:
        """Best first; `score` is the cosine similarity."""
        ...

    async def lexical_search(
        self, name: str, terms: str, top_k: int, where: Filter | None, min_score: float | None
    ) -> list[Hit]:
        """Best first by BM25 over the documents' terms (any of `terms`, split on spaces, matches); raises
        `LexicalSearchUnavailableError` where the engine has no BM25."""
        ...

    async def ready(self) -> bool: ...

    async def aclose(self) -> None: ...
