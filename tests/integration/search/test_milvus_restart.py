"""Milvus standalone stopped and started again on its data, as a pod is replaced: the gateway's store, with the
client it held through the restart, serves every document again (flushed and still growing ones, the last update
and delete included) and takes new writes, within seconds of the restart."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pymilvus import MilvusClient

from gateway.search.analyzer import analyze
from gateway.search.documents import Collection, Hit
from gateway.search.milvus import MilvusStore
from gateway.search.milvus_rows import milvus_name
from gateway.search.store import DocumentWrite, SearchStoreUnavailableError
from tests.helpers.milvus_fixtures import MilvusStandalone, session_binaries

pytestmark = pytest.mark.slow

DIMENSIONS = 384  # the embedding model's, as the gateway's collections have
ROWS = 200
SERVES_AGAIN_WITHIN = 60.0  # seconds after the start returns: the old sessions' lease (10 s) and loading


def unit(seed: int) -> np.ndarray[Any, np.dtype[np.float32]]:
    vector = np.random.default_rng(seed).standard_normal(DIMENSIONS).astype(np.float32)
    return vector / np.linalg.norm(vector)


def write(n: int, text: str | None = None) -> DocumentWrite:
    return DocumentWrite(f"d{n}", text or f"text {n}", {"n": n}, unit(n), analyze(text or f"text {n}"))


@pytest.fixture
def own_milvus(
    tmp_path: Path, pytestconfig: pytest.Config, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[MilvusStandalone]:
    """A server of this test's own: the session's one stays up for the others."""
    server = MilvusStandalone(tmp_path / "milvus", session_binaries(pytestconfig, tmp_path_factory))
    yield server.start()
    server.stop()


async def search_once_serving(store: MilvusStore, name: str, vector: np.ndarray[Any, Any]) -> list[Hit]:
    deadline = time.monotonic() + SERVES_AGAIN_WITHIN
    while True:
        try:
            return await store.search(name, vector, 1, None, None)
        except SearchStoreUnavailableError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)


async def test_a_restarted_milvus_serves_every_document_it_held(own_milvus: MilvusStandalone) -> None:
    name = f"c-{uuid.uuid4().hex[:8]}"
    store = MilvusStore(own_milvus.uri, None, timeout_seconds=5)

    async def scenario() -> None:
        await store.create_collection(Collection(name, "model", "rev1", DIMENSIONS, 1_700_000_000, None, {}))
        await store.upsert(name, [write(n) for n in range(ROWS // 2)], now=1)
        client = MilvusClient(uri=own_milvus.uri)
        try:
            client.flush(milvus_name(name))  # the first half in a sealed segment, the rest growing
        finally:
            client.close()
        await store.upsert(name, [write(n) for n in range(ROWS // 2, ROWS)], now=2)
        await store.upsert(name, [write(0, "updated")], now=3)
        assert await store.delete_documents(name, ["d1"]) == 1
        # The store's connection stays open across the restart: the stopped server's end of it waits in TIME_WAIT
        # on the proxy port, which the restarted server must listen on all the same.
        assert [hit.id for hit in await store.search(name, unit(7), 1, None, None)] == ["d7"]

        started = time.monotonic()
        await asyncio.to_thread(own_milvus.restart)
        hits = await search_once_serving(store, name, unit(7))
        took = time.monotonic() - started

        assert [hit.id for hit in hits] == ["d7"], took
        documents = await store.get_documents(name, [f"d{n}" for n in range(ROWS)])
        assert sorted(int(d.id[1:]) for d in documents) == list(range(ROWS))[:1] + list(range(2, ROWS))
        assert {d.id: d.text for d in documents}["d0"] == "updated"
        assert (await store.get_collection(name)).documents == ROWS - 1
        for n in (0, ROWS // 2 + 3, ROWS - 1):  # flushed and growing rows are searched alike
            assert [hit.id for hit in await store.search(name, unit(n), 1, None, None)] == [f"d{n}"]
        await store.upsert(name, [write(ROWS)], now=4)
        assert [hit.id for hit in await store.search(name, unit(ROWS), 1, None, None)] == [f"d{ROWS}"]

    try:
        await scenario()
    finally:
        await store.aclose()
