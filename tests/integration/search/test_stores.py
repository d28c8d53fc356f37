"""Both vector stores against their real engines: Qdrant Edge in-process, and Milvus through Milvus Lite's gRPC
server. The same behaviour is asked of each: CRUD, upsert replaces, every filter operator, the injection case,
durability across a reopen."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gateway.search.documents import Collection
from gateway.search.embedded import EmbeddedStore
from gateway.search.filters import parse_filter
from gateway.search.milvus import MilvusStore
from gateway.search.store import (
    CollectionExistsError,
    CollectionNotFoundError,
    DocumentWrite,
    SearchStoreUnavailableError,
    VectorStore,
)
from localtriton.ports import free_port
from tests.helpers.milvus_fixtures import MilvusLiteServer, milvus_server  # noqa: F401 (a fixture)

pytestmark = pytest.mark.slow

DIMENSIONS = 8
INJECTION = 'x" or 1==1 or "'
StoreFactory = Callable[[], VectorStore]


def unit(seed: int) -> np.ndarray[Any, np.dtype[np.float32]]:
    vector = np.random.default_rng(seed).standard_normal(DIMENSIONS).astype(np.float32)
    return vector / np.linalg.norm(vector)


DOCUMENTS = [
    DocumentWrite("a", "alpha", {"lang": "zh", "price": 5, "tags": ["x", "y"], "ok": True}, unit(1)),
    DocumentWrite("b", "beta", {"lang": "en", "price": 50.5, "ok": False}, unit(2)),
    DocumentWrite("c", "gamma", {"lang": INJECTION, "price": 500}, unit(3)),
    DocumentWrite("d/1", "delta", {}, unit(4)),
]


@pytest.fixture(params=["embedded", "milvus"])
def store_factory(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreFactory]:
    """Opens stores over the same data: a second one sees what the first wrote (a restart)."""
    if request.param == "embedded":
        opened: list[VectorStore] = []

        def embedded() -> VectorStore:
            opened.append(EmbeddedStore(tmp_path / "search"))
            return opened[-1]

        yield embedded
        return
    server: MilvusLiteServer = request.getfixturevalue("milvus_server")
    yield lambda: MilvusStore(server.uri, None, timeout_seconds=30)


def collection(name: str | None = None) -> Collection:
    return Collection(name or f"c-{uuid.uuid4().hex[:8]}", "model", "rev1", DIMENSIONS, 1_700_000_000, None, {"k": 1})


def run(store: VectorStore, scenario: Callable[[VectorStore], Awaitable[None]]) -> None:
    async def main() -> None:
        try:
            await scenario(store)
        finally:
            await store.aclose()

    asyncio.run(main())


def test_collections_are_created_listed_counted_and_deleted(store_factory: StoreFactory) -> None:
    created = collection()

    async def scenario(store: VectorStore) -> None:
        await store.create_collection(created)
        with pytest.raises(CollectionExistsError):
            await store.create_collection(created)
        await store.upsert(created.name, DOCUMENTS, now=100)
        assert await store.get_collection(created.name) == created.counted(4)
        assert created.counted(4) in await store.list_collections()
        await store.delete_collection(created.name)
        with pytest.raises(CollectionNotFoundError):
            await store.get_collection(created.name)
        with pytest.raises(CollectionNotFoundError):
            await store.search(created.name, unit(1), 3, None, None)
        assert created.name not in [c.name for c in await store.list_collections()]

    run(store_factory(), scenario)


def test_upsert_replaces_and_keeps_created_at(store_factory: StoreFactory) -> None:
    created = collection()

    async def scenario(store: VectorStore) -> None:
        await store.create_collection(created)
        await store.upsert(created.name, DOCUMENTS, now=100)
        await store.upsert(created.name, [DocumentWrite("a", "alpha 2", {"v": 2}, unit(9))], now=200)
        (document,) = await store.get_documents(created.name, ["a", "missing"])
        assert (document.text, document.metadata, document.created_at, document.updated_at) == (
            "alpha 2",
            {"v": 2},
            100,
            200,
        )
        assert (await store.get_collection(created.name)).documents == 4
        hits = await store.search(created.name, unit(9), 1, None, None)
        assert (hits[0].id, round(hits[0].score, 4)) == ("a", 1.0)
        assert await store.delete_documents(created.name, ["a", "d/1", "missing"]) == 2
        assert await store.get_documents(created.name, ["a", "d/1"]) == []

    run(store_factory(), scenario)


FILTERS: list[tuple[dict[str, Any], set[str]]] = [
    ({"lang": "zh"}, {"a"}),
    ({"lang": {"$eq": "en"}}, {"b"}),
    ({"lang": {"$ne": "zh"}}, {"b", "c", "d/1"}),
    ({"price": {"$gt": 5}}, {"b", "c"}),
    ({"price": {"$gte": 50.5}}, {"b", "c"}),
    ({"price": {"$lt": 50.5}}, {"a"}),
    ({"price": {"$lte": 50.5, "$gt": 0}}, {"a", "b"}),
    ({"price": 5}, {"a"}),
    ({"price": "5"}, set()),
    ({"ok": True}, {"a"}),
    ({"ok": False}, {"b"}),
    ({"tags": "x"}, {"a"}),
    ({"tags": {"$in": ["y", "q"]}}, {"a"}),
    ({"lang": {"$in": ["en", "zh"]}}, {"a", "b"}),
    ({"tags": {"$nin": ["y"]}}, {"b", "c", "d/1"}),
    ({"$and": [{"lang": "en"}, {"price": {"$gt": 10}}]}, {"b"}),
    ({"$or": [{"lang": "en"}, {"price": 500}]}, {"b", "c"}),
    ({"missing": {"$ne": 1}}, {"a", "b", "c", "d/1"}),
    ({"lang": INJECTION}, {"c"}),
    ({"lang": INJECTION + "q"}, set()),
    ({"lang": 'zh" or metadata["lang"] == "en'}, set()),
    ({"lang": "\\"}, set()),
]


def test_every_filter_operator_and_no_injection(store_factory: StoreFactory) -> None:
    created = collection()

    async def scenario(store: VectorStore) -> None:
        await store.create_collection(created)
        await store.upsert(created.name, DOCUMENTS, now=100)
        for raw, expected in FILTERS:
            hits = await store.search(created.name, unit(1), 10, parse_filter(raw), None)
            assert {hit.id for hit in hits} == expected, raw

    run(store_factory(), scenario)


def test_min_score_and_delete_by_filter(store_factory: StoreFactory) -> None:
    created = collection()

    async def scenario(store: VectorStore) -> None:
        await store.create_collection(created)
        await store.upsert(created.name, DOCUMENTS, now=100)
        hits = await store.search(created.name, unit(1), 10, None, 0.999)
        assert [hit.id for hit in hits] == ["a"]
        assert await store.delete_matching(created.name, parse_filter({"lang": INJECTION + "q"})) == 0
        assert await store.delete_matching(created.name, parse_filter({"price": {"$gte": 50}})) == 2
        assert (await store.get_collection(created.name)).documents == 2

    run(store_factory(), scenario)


def test_everything_written_is_there_after_a_reopen(store_factory: StoreFactory) -> None:
    created = collection()

    async def write(store: VectorStore) -> None:
        await store.create_collection(created)
        await store.upsert(created.name, DOCUMENTS, now=100)

    async def read(store: VectorStore) -> None:
        assert await store.get_collection(created.name) == created.counted(4)
        hits = await store.search(created.name, unit(2), 1, None, None)
        assert hits[0].id == "b" and hits[0].metadata == {"lang": "en", "price": 50.5, "ok": False}

    run(store_factory(), write)
    run(store_factory(), read)


def test_a_milvus_that_does_not_answer_is_unavailable_not_fatal() -> None:
    async def scenario() -> None:
        store = MilvusStore(f"http://127.0.0.1:{free_port()}", None, timeout_seconds=1)
        assert await store.ready() is False
        with pytest.raises(SearchStoreUnavailableError) as error:
            await store.search("c", unit(1), 3, None, None)
        assert "milvus" in error.value.message and error.value.status_code == 503
        await store.aclose()

    asyncio.run(scenario())
