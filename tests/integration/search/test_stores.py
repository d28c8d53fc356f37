"""Both vector stores against their real engines: Qdrant Edge in-process, Milvus standalone (2.3.5), and Milvus
Lite 2.5.1 for Milvus's full text search. The same behaviour is asked of each: CRUD, upsert replaces, every filter
operator, the injection case, durability across a reopen, lexical search where the engine has BM25."""

from __future__ import annotations

import asyncio
import dataclasses
import re
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import aclosing
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gateway.search import embedded as embedded_module
from gateway.search.analyzer import analyze
from gateway.search.documents import Chunking, Collection
from gateway.search.embedded import EmbeddedStore
from gateway.search.filters import parse_filter
from gateway.search.milvus import MilvusStore
from gateway.search.milvus_calls import MilvusCalls
from gateway.search.shard_index import ShardReaders, live_folder, load_indexed
from gateway.search.store import (
    CollectionExistsError,
    CollectionNotFoundError,
    DocumentWrite,
    IndexUpdate,
    LexicalSearchUnavailableError,
    SearchStoreUnavailableError,
    VectorStore,
)
from gateway.services.embeddings import EmbeddingService
from gateway.services.search import NewDocument
from gateway.services.search_chunks import ChunkedDocuments
from gateway.settings import LimitSettings
from gateway.upstreams.triton import ModelInfo, TritonEmbeddings
from localtriton.ports import free_port
from tests.helpers.milvus_fixtures import (  # noqa: F401 (fixtures)
    MilvusLite,
    MilvusStandalone,
    milvus_lite_server,
    milvus_server,
)

pytestmark = pytest.mark.slow

DIMENSIONS = 8
INJECTION = 'x" or 1==1 or "'
StoreFactory = Callable[[], VectorStore]


def unit(seed: int) -> np.ndarray[Any, np.dtype[np.float32]]:
    vector = np.random.default_rng(seed).standard_normal(DIMENSIONS).astype(np.float32)
    return vector / np.linalg.norm(vector)


DOCUMENTS = [
    DocumentWrite("a", "alpha", {"lang": "zh", "price": 5, "tags": ["x", "y"], "ok": True}, unit(1), analyze("alpha")),
    DocumentWrite("b", "beta", {"lang": "en", "price": 50.5, "ok": False}, unit(2), analyze("beta")),
    DocumentWrite("c", "gamma", {"lang": INJECTION, "price": 500}, unit(3), analyze("gamma")),
    DocumentWrite("d/1", "delta", {}, unit(4), analyze("delta")),
]


@pytest.fixture(params=["embedded", "milvus"])
def store_factory(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreFactory]:
    """Opens stores over the same data: a second one sees what the first wrote (a restart)."""
    yield from opened_stores(request, tmp_path)


@pytest.fixture(params=["embedded", "milvus", "milvus-2.5"])
def full_text_store_factory(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreFactory]:
    """The same, and a Milvus with full text search (Milvus Lite: its own expression parser, so the filter cases
    above stay with the standalone server)."""
    yield from opened_stores(request, tmp_path)


def opened_stores(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreFactory]:
    if request.param == "embedded":
        opened: list[VectorStore] = []

        def embedded() -> VectorStore:
            opened.append(EmbeddedStore(tmp_path / "search"))
            return opened[-1]

        yield embedded
        return
    if request.param == "milvus-2.5":
        lite: MilvusLite = request.getfixturevalue("milvus_lite_server")
        yield lambda: MilvusStore(lite.uri, None, timeout_seconds=30, index="AUTOINDEX")
        return
    server: MilvusStandalone = request.getfixturevalue("milvus_server")
    redis_url: str = request.getfixturevalue("redis_url")  # replicas (and a restart) share write timestamps there
    yield lambda: MilvusStore(server.uri, None, timeout_seconds=30, redis=redis_url)


def collection(name: str | None = None) -> Collection:
    return Collection(name or f"c-{uuid.uuid4().hex[:8]}", "model", "rev1", DIMENSIONS, 1_700_000_000, None, {"k": 1})


async def test_collections_are_created_listed_counted_and_deleted(full_text_store_factory: StoreFactory) -> None:
    created = collection()

    async with aclosing(full_text_store_factory()) as store:
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


async def test_lexical_search_where_the_engine_has_bm25(full_text_store_factory: StoreFactory) -> None:
    """BM25 over the terms, with filters and min_score, a survivor of a reopen; refused where the engine has none."""
    created = collection()
    async with aclosing(full_text_store_factory()) as store:
        await store.create_collection(created)
        await store.upsert(created.name, DOCUMENTS, now=100)
        if not await store.lexical():
            with pytest.raises(LexicalSearchUnavailableError):
                await store.lexical_search(created.name, "alpha", 5, None, None)
            return
        await store.upsert(created.name, [DocumentWrite("e", "alpha beta", {"lang": "zh"}, unit(5), "alpha beta")], 100)
        hits = await store.lexical_search(created.name, "alpha beta", 5, None, None)
        assert hits[0].id == "e" and {h.id for h in hits[1:]} == {"a", "b"}  # both terms, then one each (a tie)
        assert hits[0].score > hits[1].score == hits[2].score > 0
        chinese = await store.lexical_search(created.name, "alpha beta", 5, parse_filter({"lang": "zh"}), None)
        assert [h.id for h in chinese] == ["e", "a"]
        above = await store.lexical_search(created.name, "alpha beta", 5, None, hits[1].score + 1e-6)
        assert [h.id for h in above] == ["e"]
    async with aclosing(full_text_store_factory()) as store:  # reopened: the index is on disk; shorter document first
        assert [h.id for h in await store.lexical_search(created.name, "beta", 5, None, None)] == ["b", "e"]


async def test_both_stores_score_bm25_alike(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """One analyzer, the engines' own BM25 with the same k1 and b: a query ranks and scores the same documents the
    same in the embedded store and in a Milvus with full text search, Chinese and English alike."""
    texts = [
        "How do I reset the password of my account?",
        "Passwords are reset from the account page, under security.",
        "Stores open at nine and close at six.",
        "如何重置我的账户密码？",
        "在账户页面的安全设置中可以重置密码。",
        "商店早上九点开门。",
        "密码 password 重置 reset",
    ]
    writes = [DocumentWrite(f"t{n}", text, {}, unit(n), analyze(text)) for n, text in enumerate(texts)]
    created = collection()
    lite: MilvusLite = request.getfixturevalue("milvus_lite_server")
    stores = [EmbeddedStore(tmp_path / "search"), MilvusStore(lite.uri, None, index="AUTOINDEX")]
    found = []
    for store in stores:
        async with aclosing(store):
            await store.create_collection(created)
            await store.upsert(created.name, writes, now=1)
            found.append([await store.lexical_search(created.name, analyze(q), 7, None, None) for q in QUERIES])
    for embedded_hits, milvus_hits in zip(*found, strict=True):
        assert embedded_hits, "every query matches something"
        assert [h.id for h in embedded_hits] == [h.id for h in milvus_hits]
        assert [h.score for h in embedded_hits] == pytest.approx([h.score for h in milvus_hits], rel=1e-3)


QUERIES = ["reset my password", "账户密码", "密码重置", "stores open", "九点"]


async def test_a_milvus_collection_made_without_bm25_refuses_lexical_search(request: pytest.FixtureRequest) -> None:
    """A collection keeps the fields it was made with: one made before the gateway used Milvus's full text search
    (here: made without it on a Milvus that has it) answers lexical searches with 400, and dense ones as ever."""
    lite: MilvusLite = request.getfixturevalue("milvus_lite_server")
    created = collection()
    MilvusCalls(lite.uri, None, 30, "AUTOINDEX").create(created, lexical=False)
    async with aclosing(MilvusStore(lite.uri, None, timeout_seconds=30, index="AUTOINDEX")) as store:
        assert await store.lexical() and not await store.lexical(created.name)
        await store.upsert(created.name, DOCUMENTS, now=100)
        with pytest.raises(LexicalSearchUnavailableError):
            await store.lexical_search(created.name, "alpha", 5, None, None)
        assert [h.id for h in await store.search(created.name, unit(1), 1, None, None)] == ["a"]


async def test_upsert_replaces_and_keeps_created_at(store_factory: StoreFactory) -> None:
    created = collection()

    async with aclosing(store_factory()) as store:
        await store.create_collection(created)
        await store.upsert(created.name, DOCUMENTS, now=100)
        await store.upsert(
            created.name, [DocumentWrite("a", "alpha 2", {"v": 2}, unit(9), analyze("alpha 2"))], now=200
        )
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


async def test_a_reindex_walks_every_document_replaces_vectors_and_rewrites_the_record(
    full_text_store_factory: StoreFactory,
) -> None:
    created = collection()

    async with aclosing(full_text_store_factory()) as store:
        await store.create_collection(created)
        await store.upsert(created.name, DOCUMENTS, now=100)
        seen: list[str] = []
        cursor = None
        for _ in range(len(DOCUMENTS)):  # pages of 3: every document once, then no cursor
            page, cursor = await store.scroll(created.name, cursor, 3)
            seen += [d.id for d in page]
            if cursor is None:
                break
        assert sorted(seen) == sorted(d.id for d in DOCUMENTS) and cursor is None
        await store.set_index(created.name, {"a": IndexUpdate(unit(9), "omega"), "b": IndexUpdate(None, "beta")})
        hits = await store.search(created.name, unit(9), 1, None, None)
        assert (hits[0].id, round(hits[0].score, 4)) == ("a", 1.0)
        assert [h.id for h in (await store.search(created.name, unit(2), 1, None, None))] == ["b"]  # kept
        if await store.lexical(created.name):
            assert [h.id for h in await store.lexical_search(created.name, "omega", 5, None, None)] == ["a"]
            assert await store.lexical_search(created.name, "alpha", 5, None, None) == []
        (document,) = await store.get_documents(created.name, ["a"])
        assert (document.text, document.metadata, document.created_at, document.updated_at) == (
            "alpha", DOCUMENTS[0].metadata, 100, 100,
        )  # fmt: skip
        marked = dataclasses.replace(created, model_revision="rev2", reindex_task="reindex_1")
        await store.update_collection(marked)
        assert (await store.collection(created.name)).reindex_task == "reindex_1"
        with pytest.raises(CollectionNotFoundError):
            await store.update_collection(collection())

    async with aclosing(full_text_store_factory()) as store:
        record = await store.get_collection(created.name)
        assert (record.model_revision, record.reindex_task, record.documents) == ("rev2", "reindex_1", 4)


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


async def test_every_filter_operator_and_no_injection(store_factory: StoreFactory) -> None:
    created = collection()

    async with aclosing(store_factory()) as store:
        await store.create_collection(created)
        await store.upsert(created.name, DOCUMENTS, now=100)
        for raw, expected in FILTERS:
            hits = await store.search(created.name, unit(1), 10, parse_filter(raw), None)
            assert {hit.id for hit in hits} == expected, raw


async def test_min_score_and_delete_by_filter(store_factory: StoreFactory) -> None:
    created = collection()

    async with aclosing(store_factory()) as store:
        await store.create_collection(created)
        await store.upsert(created.name, DOCUMENTS, now=100)
        hits = await store.search(created.name, unit(1), 10, None, 0.999)
        assert [hit.id for hit in hits] == ["a"]
        assert await store.delete_matching(created.name, parse_filter({"lang": INJECTION + "q"})) == 0
        assert await store.delete_matching(created.name, parse_filter({"price": {"$gte": 50}})) == 2
        assert (await store.get_collection(created.name)).documents == 2


async def test_everything_written_is_there_after_a_reopen(store_factory: StoreFactory) -> None:
    created = collection()

    async with aclosing(store_factory()) as store:
        await store.create_collection(created)
        await store.upsert(created.name, DOCUMENTS, now=100)

    async with aclosing(store_factory()) as store:
        assert await store.get_collection(created.name) == created.counted(4)
        hits = await store.search(created.name, unit(2), 1, None, None)
        assert hits[0].id == "b" and hits[0].metadata == {"lang": "en", "price": 50.5, "ok": False}


async def test_a_milvus_that_does_not_answer_is_unavailable_not_fatal() -> None:
    store = MilvusStore(f"http://127.0.0.1:{free_port()}", None, timeout_seconds=1)
    assert await store.ready() is False
    with pytest.raises(SearchStoreUnavailableError) as error:
        await store.search("c", unit(1), 3, None, None)
    assert "milvus" in error.value.message and error.value.status_code == 503
    await store.aclose()


async def test_the_embedded_index_is_built_in_a_child_and_swapped_in_without_losing_writes(tmp_path: Path) -> None:
    created = collection()
    rng = np.random.default_rng(5)
    vectors = rng.standard_normal((3000, DIMENSIONS)).astype(np.float32)
    writes = [
        DocumentWrite(str(n), f"text {n}", {"n": n}, vectors[n] / np.linalg.norm(vectors[n]), analyze(f"text {n}"))
        for n in range(3000)
    ]

    def store() -> EmbeddedStore:
        return EmbeddedStore(tmp_path / "search", index_after_points=1000, indexing_threshold_kb=1)

    async with aclosing(store()) as embedded:
        assert isinstance(embedded, EmbeddedStore)
        await embedded.create_collection(created)
        await embedded.upsert(created.name, writes[:2000], now=1)  # starts a build of these 2,000
        await embedded.upsert(created.name, writes[2000:], now=2)  # written while the child indexes
        await embedded.delete_documents(created.name, ["0"])
        indexed = asyncio.create_task(embedded.wait_indexed())
        searches = 0
        while not indexed.done():  # reads go on through the build and the swap, and none fails
            await embedded.search(created.name, writes[1].vector, 1, None, None)
            searches += 1
        assert searches > 1
        folder = tmp_path / "search" / "collections" / created.name
        live = live_folder(folder)
        assert live.name.startswith("shard-")  # the indexed copy, named in `live`; the first shard is gone
        assert sorted(p.name for p in folder.iterdir()) == sorted(["collection.json", "live", live.name])
        assert embedded._shards[created.name].info().indexed_vectors_count >= 1999  # the swapped-in HNSW
        assert (await embedded.get_collection(created.name)).documents == 2999
        hits = await embedded.search(created.name, writes[2500].vector, 1, None, None)
        assert hits[0].id == "2500"
        assert await embedded.get_documents(created.name, ["0"]) == []

    async with aclosing(store()) as embedded:
        assert (await embedded.get_collection(created.name)).documents == 2999
        hits = await embedded.search(created.name, writes[7].vector, 1, parse_filter({"n": {"$lt": 10}}), None)
        assert hits[0].id == "7"


async def test_searches_never_wait_for_an_index_swap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The swap's load of the indexed copy is held on purpose: searches, gets and counts are answered meanwhile
    (from the old shard), and after it from the new one; the old one is closed only once no read uses it."""
    created = collection()
    rng = np.random.default_rng(6)
    vectors = rng.standard_normal((1500, DIMENSIONS)).astype(np.float32)
    writes = [
        DocumentWrite(str(n), f"text {n}", {}, vectors[n] / np.linalg.norm(vectors[n]), analyze(f"text {n}"))
        for n in range(1500)
    ]
    loading, release = threading.Event(), threading.Event()

    def held_load(copy: Path, kept: list[Any]) -> Any:
        loading.set()
        release.wait()
        return load_indexed(copy, kept)

    monkeypatch.setattr(embedded_module, "load_indexed", held_load)

    async with aclosing(
        EmbeddedStore(tmp_path / "search", index_after_points=1000, indexing_threshold_kb=1)
    ) as embedded:
        assert isinstance(embedded, EmbeddedStore)
        await embedded.create_collection(created)
        await embedded.upsert(created.name, writes, now=1)
        before = embedded._shards[created.name]
        indexed = asyncio.create_task(embedded.wait_indexed())
        assert await asyncio.to_thread(loading.wait, 120), "the index build never reached the swap"
        for n in range(20):  # all answered while the swap is stuck in its load
            hits = await embedded.search(created.name, writes[n].vector, 1, None, None)
            assert hits[0].id == str(n)
        assert (await embedded.get_collection(created.name)).documents == len(writes)
        assert [d.id for d in await embedded.get_documents(created.name, ["7"])] == ["7"]
        assert not release.is_set() and not indexed.done() and embedded._shards[created.name] is before
        release.set()
        await indexed
        after = embedded._shards[created.name]
        assert after is not before and after.info().indexed_vectors_count >= len(writes) - 1
        assert (await embedded.search(created.name, writes[9].vector, 1, None, None))[0].id == "9"


async def test_a_shard_in_use_is_closed_only_after_its_last_read(tmp_path: Path) -> None:
    readers = ShardReaders()
    shard, other = object(), object()
    async with readers.reading(shard):  # type: ignore[arg-type]
        waiting = asyncio.create_task(readers.finished(shard))  # type: ignore[arg-type]
        await readers.finished(other)  # type: ignore[arg-type]
        await asyncio.sleep(0)
        assert not waiting.done()
    await waiting


async def test_ids_and_values_with_quotes_and_backslashes_stay_data(store_factory: StoreFactory) -> None:
    created = collection()
    tricky = ['x" or id != "', "a\\", 'b\\" or 1==1 or \\"', "it's", "new\nline"]
    writes = [DocumentWrite(i, f"text {n}", {"v": i}, unit(n), analyze(f"text {n}")) for n, i in enumerate(tricky)]

    async with aclosing(store_factory()) as store:
        await store.create_collection(created)
        await store.upsert(created.name, [*DOCUMENTS, *writes], now=1)
        for document_id in tricky:
            (found,) = await store.get_documents(created.name, [document_id])
            assert found.id == document_id and found.metadata == {"v": document_id}
            hits = await store.search(created.name, unit(1), 10, parse_filter({"v": document_id}), None)
            assert [hit.id for hit in hits] == [document_id]
        assert await store.get_documents(created.name, ['nothing" or id != "']) == []
        assert await store.delete_documents(created.name, ['nothing" or id != "']) == 0
        assert await store.delete_documents(created.name, [tricky[0]]) == 1
        assert (await store.get_collection(created.name)).documents == len(DOCUMENTS) + len(tricky) - 1


async def test_a_field_with_values_of_two_types_filters_each(store_factory: StoreFactory) -> None:
    created = collection()
    writes = [
        DocumentWrite("n", "number", {"size": 3}, unit(1), analyze("number")),
        DocumentWrite("s", "string", {"size": "large"}, unit(2), analyze("string")),
    ]

    async with aclosing(store_factory()) as store:
        await store.create_collection(created)
        await store.upsert(created.name, writes[:1], now=1)
        await store.upsert(created.name, writes[1:], now=1)
        assert [h.id for h in await store.search(created.name, unit(1), 5, parse_filter({"size": 3}), None)] == ["n"]
        large = await store.search(created.name, unit(1), 5, parse_filter({"size": "large"}), None)
        assert [h.id for h in large] == ["s"]


class WordChunker:
    """Two words a chunk: the spans Triton's chunker draws are its business (tests/integration/triton); here the
    stores' part of a chunked collection is what is under test."""

    async def chunk(self, text: str, max_tokens: int, overlap: int) -> list[tuple[int, int]]:
        words = [(m.start(), m.end()) for m in re.finditer(r"\S+", text)]
        return [(words[i][0], words[min(i + 2, len(words)) - 1][1]) for i in range(0, len(words), 2)] or [(0, 0)]


class WordCountEmbedder:
    """A vector per text from its length: enough for the stores, which hold whatever they are given."""

    async def model_info(self, *, refresh: bool = False) -> ModelInfo:
        return ModelInfo("m", "rev1", max_batch_size=256, max_sequence_length=64, dimension=DIMENSIONS)

    async def embed(self, texts: list[str]) -> TritonEmbeddings:
        rows = np.stack([unit(len(text)) for text in texts])
        return TritonEmbeddings(rows, np.ones(len(texts), dtype=np.int32), np.zeros(len(texts), dtype=np.bool_))

    async def ready(self) -> bool:
        return True


async def test_a_chunked_collections_documents_are_counted_read_replaced_and_deleted_whole(
    store_factory: StoreFactory,
) -> None:
    created = dataclasses.replace(collection(), chunking=Chunking(16, 0))
    async with aclosing(store_factory()) as store:
        documents = ChunkedDocuments(
            store, EmbeddingService(WordCountEmbedder(), None, LimitSettings()), WordChunker(), "c"
        )
        await store.create_collection(created)
        written = [
            NewDocument("a", "one two  three four\nfive", {"k": "x"}),
            NewDocument("b", "six seven", {"k": "y"}),
        ]
        await documents.upsert(created.name, Chunking(16, 0), written, now=10)
        assert (await store.get_collection(created.name)).documents == 2  # documents, not their 4 chunks
        found = {d.id: d for d in await documents.get(created.name, ["a", "b", "missing"])}
        assert {i: (d.text, d.metadata, d.updated_at) for i, d in found.items()} == {
            "a": ("one two  three four\nfive", {"k": "x"}, 10),
            "b": ("six seven", {"k": "y"}, 10),
        }
        await documents.upsert(created.name, Chunking(16, 0), [NewDocument("a", "one", {"k": "x"})], now=20)
        assert [d.text for d in await documents.get(created.name, ["a"])] == ["one"]
        assert len(await store.search(created.name, unit(3), 10, None, None)) == 2  # a's stale chunks are gone
        assert await documents.delete_matching(created.name, parse_filter({"k": "x"})) == 1
        assert await documents.delete(created.name, ["b", "missing"]) == 1
        assert (await store.get_collection(created.name)).documents == 0
