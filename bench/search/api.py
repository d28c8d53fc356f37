"""The gateway's side of the search part, over HTTP: embed (the reference), ingest (through the ingest CLI's own
code), answer the labelled queries, and the latency sweep with where each search's time went."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import orjson

from bench.gateway_metrics import metric, scrape
from bench.load import aiohttp_session, closed_loop
from bench.run_stats import RunStats
from bench.search.chroma import document_index
from bench.search.plan import BUCKETS, COLLECTION, EMBED_BATCH, INGEST_BATCH, INGEST_CONCURRENCY, TOP_K, Plan
from bench.search.quality import Vectors

NO_CACHE = {"Cache-Control": "no-cache"}  # every query and text embedded by the model, never a cached vector
SEARCH_ROUTE = "/v1/collections/{name}/search"
STORE_SEARCH = "query"  # the operation label of a search in the embedded store: the shard call it times


@dataclass
class Breakdown:
    """Mean milliseconds per search, from the gateway's own histograms over one point."""

    http_ms: float  # the gateway's whole handling of the request
    embedding_ms: float  # the Triton call that embeds the query (tokeniser and model)
    store_ms: float  # the vector store's search

    @property
    def rest_ms(self) -> float:
        """Validation, the event loop's queue and serialising the answer."""
        return self.http_ms - self.embedding_ms - self.store_ms


async def create_collection(base_url: str) -> None:
    async with (
        aiohttp_session(1) as session,
        session.post(f"{base_url}/v1/collections", json={"name": COLLECTION}) as response,
    ):
        if response.status != 201:
            raise RuntimeError(f"creating the collection answered {response.status}: {await response.text()}")


async def delete_collection(base_url: str) -> None:
    async with (
        aiohttp_session(1) as session,
        session.delete(f"{base_url}/v1/collections/{COLLECTION}") as response,
    ):
        if response.status >= 300:
            raise RuntimeError(f"deleting the collection answered {response.status}: {await response.text()}")


async def embed(
    base_url: str,
    texts: Sequence[str],
    input_type: str = "document",
    *,
    batch: int = EMBED_BATCH,
    concurrency: int = INGEST_CONCURRENCY,
) -> tuple[Vectors, RunStats]:
    """Every text through /v1/embeddings, `batch` a request, `concurrency` requests in flight: the vectors and
    the run. The served graph is INT8 with activations quantised per batch, so a text's vector moves slightly
    with its batch-mates: one text a request at concurrency 1 gives exactly the vector a lone search query gets."""
    rows: list[Any] = [None] * len(texts)
    async with aiohttp_session(concurrency) as session:

        async def request(index: int) -> int:
            chunk = texts[index * batch : (index + 1) * batch]
            body = {"input": list(chunk), "input_type": input_type}
            async with session.post(f"{base_url}/v1/embeddings", json=body, headers=NO_CACHE) as response:
                response.raise_for_status()
                answer = orjson.loads(await response.read())
            for item in answer["data"]:
                rows[index * batch + item["index"]] = item["embedding"]
            return len(chunk)

        stats = await closed_loop(request, total=-(-len(texts) // batch), concurrency=concurrency)
    if stats.errors:
        raise RuntimeError(f"{stats.errors} /v1/embeddings requests failed; see the gateway's log")
    return np.asarray(rows, dtype=np.float32), stats


async def ingest(base_url: str, plan: Plan) -> float:
    """The real documents through `gateway.search.ingest` (the CLI's code: 64-document batches, 4 in flight);
    answers documents per second. Re-running upserts the same ids (replaced, not added)."""
    from gateway.search.ingest import ingest as ingest_file

    corpus = plan.corpus
    with tempfile.TemporaryDirectory(prefix="bench-search-ingest-") as folder:
        path = Path(folder) / "documents.jsonl"
        lines = (
            orjson.dumps({"id": corpus.document_id(i), "text": text, "metadata": corpus.metadata(i)})
            for i, text in enumerate(corpus.documents)
        )
        path.write_bytes(b"\n".join(lines) + b"\n")
        started = time.perf_counter()
        sent = await ingest_file(
            path, COLLECTION, url=base_url, key=None, batch=INGEST_BATCH, concurrency=INGEST_CONCURRENCY, quiet=True
        )
        return sent / (time.perf_counter() - started)


async def answer_queries(base_url: str, queries: Sequence[str], real: int, concurrency: int = 1) -> list[list[int]]:
    """Each query's top 10 through the API, as document indices (the real documents, then the top-up); one at a
    time by default, so that each query is embedded alone, as `embed(..., batch=1, concurrency=1)` embeds it."""
    ranked: list[list[int]] = [[] for _ in queries]
    async with aiohttp_session(concurrency) as session:

        async def request(index: int) -> int:
            ranked[index] = [document_index(hit["id"], real) for hit in await search(session, base_url, queries[index])]
            return 1

        stats = await closed_loop(request, total=len(queries), concurrency=concurrency)
    if stats.errors:
        raise RuntimeError(f"{stats.errors} searches failed; see the gateway's log")
    return ranked


async def search(
    session: aiohttp.ClientSession,
    base_url: str,
    query: str,
    where: dict[str, Any] | None = None,
    mode: str = "dense",
) -> list[dict[str, Any]]:
    body: dict[str, Any] = {"query": query, "top_k": TOP_K, "mode": mode}
    if where is not None:
        body["filter"] = where
    async with session.post(f"{base_url}/v1/collections/{COLLECTION}/search", json=body, headers=NO_CACHE) as response:
        response.raise_for_status()
        hits: list[dict[str, Any]] = orjson.loads(await response.read())["data"]
        return hits


async def latency_point(
    base_url: str,
    plan: Plan,
    concurrency: int,
    filtered: bool,
    run: int,
    *,
    store_operation: str = STORE_SEARCH,
    mode: str = "dense",
) -> tuple[RunStats, Breakdown]:
    """`plan.queries_per_point` searches in `mode` at `concurrency` (each with the filter `{"bucket": n}` if
    `filtered`), and the gateway's own means over them (`store_operation`: the store's search in its histogram).
    Run r asks queries r*count.. so the runs differ, the systems do not."""
    queries, count = plan.corpus.queries, plan.queries_per_point
    offset = run * count
    async with aiohttp_session(concurrency) as session:
        before = await scrape(session, base_url)

        async def request(index: int) -> int:
            at = offset + index
            where = {"bucket": at % BUCKETS} if filtered else None
            await search(session, base_url, queries[at % len(queries)], where, mode)
            return 1

        stats = await closed_loop(request, total=count, concurrency=concurrency)
        after = await scrape(session, base_url)
    return stats, breakdown(before, after, store_operation)


def breakdown(before: str, after: str, store_operation: str = STORE_SEARCH) -> Breakdown:
    def mean_ms(name: str, **labels: str) -> float:
        total = metric(after, f"{name}_sum", **labels) - metric(before, f"{name}_sum", **labels)
        count = metric(after, f"{name}_count", **labels) - metric(before, f"{name}_count", **labels)
        return 1000 * total / count if count else float("nan")

    return Breakdown(
        http_ms=mean_ms("gateway_http_request_duration_seconds", route=SEARCH_ROUTE, status="200"),
        embedding_ms=mean_ms("gateway_triton_request_duration_seconds"),
        store_ms=mean_ms("gateway_search_store_duration_seconds", operation=store_operation),
    )
