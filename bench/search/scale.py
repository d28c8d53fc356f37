"""The scale step of the search part (`python -m bench search --scale 1000000`, `make bench-search-scale`): the
embedded store at the plan's size (100,000 documents) and at `--scale` documents, measured side by side in one run.

1. The collections (`scale_build.py`, cached under `.run/bench-search-scale/`): the real documents through the
   API once, then two copies of that store folder topped up to each size through the gateway's own
   `EmbeddedStore`, vectors around the real ones (`fill.py`) and texts of the real ones varied (`scale_texts.py`).
2. One Triton and a gateway on each folder. Each query the latency runs ask, through the API one at a time, dense
   and hybrid (the default fusion), without and with the filter, against exact search over what each store holds
   (`exact_search.py`: numpy cosine, BM25 over the stored terms, the two fused by the gateway's `fuse`); a sample
   in mode lexical against the exact BM25 says whether the engine's BM25 is exhaustive.
3. The latency at concurrency 1 and 8, dense and hybrid, with and without the filter, the two sizes alternating
   run by run on the same queries; then each gateway's resident memory.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from bench.load import aiohttp_session
from bench.memory import status_bytes, tree_memory
from bench.processes import ServerProcess, stopped_on_exit
from bench.results import PartResult, load_note
from bench.search import api
from bench.search.chroma import document_index
from bench.search.exact_search import (
    Bm25,
    Mask,
    Scores,
    best,
    dense_matches,
    exact_hybrid,
    hybrid_matches,
    lexical_matches,
)
from bench.search.fill import stored_vectors
from bench.search.plan import BUCKETS, COLLECTION, PART, TOP_K, Plan
from bench.search.quality import Vectors
from bench.search.report import Measured
from bench.search.scale_build import (
    REAL,
    Built,
    Stored,
    cache_folder,
    cached,
    mark_real,
    real_ready,
    stored_documents,
    top_up,
)
from bench.search.scale_report import LEXICAL_DEPTH, ScaleFigures, build_scale_result, system
from bench.search.sweep import sweep
from bench.stack import start_gateway, start_triton
from gateway.search.analyzer import analyze
from gateway.search.fusion import Fusion

log = logging.getLogger("bench.search")
SCALE_CONCURRENCIES = (1, 8)
LEXICAL_SAMPLE = 200  # queries searched in mode lexical against the exact BM25
QUERY_CHUNK = 64  # queries scored at once against every stored vector: 64 x 1,000,000 floats is 256 MB
Answers = dict[int, list[tuple[int, float]]]  # query position -> (document index, score), best first


async def run_scale(out_dir: Path, plan: Plan, size: int) -> PartResult:
    load_at_start = os.getloadavg()[0]
    sizes = (plan.total_documents, size)
    if size <= plan.total_documents:
        raise ValueError(f"--scale {size:,} is not above the plan's {plan.total_documents:,} documents")
    log_dir = out_dir / "logs" / PART
    measured, figures = Measured(), ScaleFigures(sizes)
    notes: list[str] = []

    def write() -> PartResult:
        result = build_scale_result(measured, figures, [*notes, load_note(load_at_start)])
        result.write(out_dir)
        return result

    environment = {"EMBEDDING_CACHE_MB": "0"}
    servers: list[ServerProcess] = []
    with stopped_on_exit(servers):
        triton_endpoint = start_triton(log_dir, servers)
        environment["TRITON_URL"] = triton_endpoint.grpc_target
        for built in await collections(plan, sizes, log_dir, environment, servers):
            figures.builds[built.documents] = built
        write()
        stored = {d: stored_documents(figures.builds[d].path, document_ids(plan, d)) for d in sizes}
        served = {}
        for documents in sizes:
            store = {"SEARCH_PATH": str(figures.builds[documents].path)}
            served[documents] = start_gateway(log_dir, {**environment, **store}, f"gateway-scale-{documents}", servers)
            figures.memory_at_start[documents] = tree_memory(served[documents].server.pid)
        await quality(figures, plan, {d: e.base_url for d, e in served.items()}, stored)
        write()
        notes.append(f"Load average (1 min) before the latency runs: {os.getloadavg()[0]:.1f}.")
        for number in range(plan.runs):  # the sizes alternate run by run: each run's ratio shares its moment
            for documents, endpoint in served.items():
                serving = {"triton": triton_endpoint.server, "gateway": endpoint.server}
                for mode in ("dense", "hybrid"):
                    await sweep(measured, endpoint.base_url, plan, system(documents, mode), SCALE_CONCURRENCIES,
                                number, serving=serving, mode=mode)  # fmt: skip
            write()
        for documents, endpoint in served.items():
            figures.memory[documents] = tree_memory(endpoint.server.pid)
            figures.memory_peak[documents] = status_bytes(endpoint.server.pid).get("VmHWM", 0)
    return write()


async def collections(
    plan: Plan, sizes: Sequence[int], log_dir: Path, environment: dict[str, str], servers: list[ServerProcess]
) -> list[Built]:
    """Each size's store folder, from the cache or built now (the real documents' folder first, if need be)."""
    folder = cache_folder(plan)
    base = folder / REAL
    corpus = plan.corpus
    log.info("scale: collections under %s", folder)
    if not real_ready(base):
        endpoint = start_gateway(log_dir, {**environment, "SEARCH_PATH": str(base)}, "gateway-scale-real", servers)
        await api.create_collection(endpoint.base_url)
        await api.ingest(endpoint.base_url, plan)
        endpoint.server.stop()
        mark_real(base, len(corpus.documents))
    real = stored_vectors(base, [corpus.document_id(i) for i in range(len(corpus.documents))])
    built = []
    for documents in sizes:
        found = cached(folder / str(documents))
        if found is None:
            log.info("scale: building %d documents (the top-up, then its HNSW index)", documents)
            found = await top_up(base, folder / str(documents), plan, documents, real)
        log.info("scale: %d documents: write %.0f s, index %.0f s%s", documents, found.write_s, found.index_s,
                 " (cached)" if found.reused else "")  # fmt: skip
        built.append(found)
    return built


async def quality(figures: ScaleFigures, plan: Plan, base_urls: dict[int, str], stored: dict[int, Stored]) -> None:
    """The queries the latency runs ask, through each gateway, against exact search over its store."""
    queries = plan.corpus.queries[: plan.runs * plan.queries_per_point]
    figures.languages = [plan.corpus.languages[answer] for answer in plan.corpus.answers[: len(queries)]]
    first = next(iter(base_urls.values()))
    vectors, _ = await api.embed(first, queries, "query", batch=1, concurrency=1)
    for documents, base_url in base_urls.items():
        found = await search_all(base_url, queries, len(plan.corpus.documents))
        compare(figures, documents, found, stored.pop(documents), queries, vectors)
        log.info("scale: %d documents: %s", documents, figures.recall_line(documents))


async def search_all(base_url: str, queries: Sequence[str], real: int) -> dict[tuple[str, bool], Answers]:
    """Every query through the API, dense and hybrid, without and with the filter; a sample spread over all of them
    (both languages) in mode lexical."""
    found: dict[tuple[str, bool], Answers] = {}
    every = range(len(queries))
    for mode in ("dense", "hybrid"):
        for filtered in (False, True):
            found[(mode, filtered)] = await answers(base_url, queries, every, mode, filtered, TOP_K, real)
    sample = range(0, len(queries), max(1, len(queries) // LEXICAL_SAMPLE))
    for filtered in (False, True):
        found[("lexical", filtered)] = await answers(base_url, queries, sample, "lexical", filtered, LEXICAL_DEPTH,
                                                     real)  # fmt: skip
    return found


def compare(
    figures: ScaleFigures,
    documents: int,
    found: dict[tuple[str, bool], Answers],
    stored: Stored,
    queries: Sequence[str],
    vectors: Vectors,
) -> None:
    """The API's answers against exact search over what the store holds: dense (cosine), hybrid (the default
    fusion of exact dense and exact BM25 candidates), and the lexical sample against the exact BM25."""
    if not np.array_equal(stored.buckets, np.arange(documents) % BUCKETS):
        raise RuntimeError("the stored buckets are not the plan's (document index mod 10)")
    lexical = Bm25(stored.terms)
    fusion = Fusion()  # the default, as the searches ask for none
    for start in range(0, len(queries), QUERY_CHUNK):
        dense_chunk = vectors[start : start + QUERY_CHUNK] @ stored.vectors.T
        for offset, dense in enumerate(dense_chunk.astype(np.float64)):
            at = start + offset
            scores = lexical.scores(analyze(queries[at]))
            figures.count_ties(documents, scores)
            for filtered in (False, True):
                allowed = stored.buckets == at % BUCKETS if filtered else None
                exact = best(dense, TOP_K, allowed)
                matched = dense_matches(indices(found, "dense", filtered, at), dense, exact)
                figures.add("dense", documents, filtered, matched, len(exact), at)
                hybrid = exact_hybrid(dense, scores, TOP_K, fusion, allowed)
                matched = hybrid_matches(indices(found, "hybrid", filtered, at), hybrid)
                figures.add("hybrid", documents, filtered, matched, len(hybrid.hits), at)
                if at in found[("lexical", filtered)]:
                    check_lexical(figures, documents, filtered, found[("lexical", filtered)][at], scores, allowed, at)


def document_ids(plan: Plan, documents: int) -> list[str]:
    """The ids of a collection of `documents`, in document order: the real ones, then the top-up."""
    real = len(plan.corpus.documents)
    return [plan.corpus.document_id(i) for i in range(real)] + [f"f{j}" for j in range(documents - real)]


def check_lexical(
    figures: ScaleFigures,
    documents: int,
    filtered: bool,
    answered: list[tuple[int, float]],
    scores: Scores,
    allowed: Mask | None,
    at: int,
) -> None:
    """The engine's lexical answer against the exact BM25: its top LEXICAL_DEPTH and each hit's score."""
    exact = best(scores, LEXICAL_DEPTH, allowed, matched_only=True)
    found = [index for index, _ in answered]
    figures.add("lexical", documents, filtered, lexical_matches(found, scores, exact), len(exact), at)
    for index, score in answered:
        figures.lexical_score_error = max(figures.lexical_score_error,
                                          abs(score - scores[index]) / max(abs(scores[index]), 1e-9))  # fmt: skip


def indices(found: dict[tuple[str, bool], Answers], mode: str, filtered: bool, at: int) -> list[int]:
    return [index for index, _ in found[(mode, filtered)][at]]


async def answers(
    base_url: str, queries: Sequence[str], asked: Iterable[int], mode: str, filtered: bool, top_k: int, real: int
) -> Answers:
    """The hits of each query `asked` (by position) through the API, one at a time (each query embedded alone, as
    its reference vector was); query i filtered to bucket i mod 10 where `filtered`."""
    found: Answers = {}
    url = f"{base_url}/v1/collections/{COLLECTION}/search"
    async with aiohttp_session(1) as session:
        for at in asked:
            body: dict[str, object] = {"query": queries[at], "top_k": top_k, "mode": mode}
            if filtered:
                body["filter"] = {"bucket": at % BUCKETS}
            async with session.post(url, json=body, headers=api.NO_CACHE) as response:
                response.raise_for_status()
                hits = (await response.json())["data"]
            found[at] = [(document_index(hit["id"], real), float(hit["score"])) for hit in hits]
    return found
