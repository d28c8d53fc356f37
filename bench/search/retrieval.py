"""Retrieval quality per search mode through the API, on public sets with graded judgements (`retrieval_sets.py`:
BEIR's SciFact and NFCorpus, a Chinese set built from LCQMC).

Every document goes in through the upsert route and every query through the search route, in each mode; nDCG@10
and Recall@100 follow trec_eval's definitions (`ndcg_cut.10`: gains as judged, log2 discounts, the ideal ranking
from the judgements; `recall.100`), which `pytrec_eval` checks on one run. The fusion is tuned on the sets'
training or development judgements (SciFact train, NFCorpus dev, LCQMC dev) by fusing the dense and lexical lists
the API answered, offline, with the gateway's own `fuse`; the test judgements only judge.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from bench.load import aiohttp_session
from bench.search.retrieval_sets import Qrels, RetrievalSet, Split, sets_in
from gateway.search.documents import Hit
from gateway.search.fusion import Fusion, fuse

Run = dict[str, dict[str, float]]  # query id -> document id -> score
MODES = ("dense", "lexical", "hybrid")
DEPTH = 100  # results asked per query: Recall@100
UPSERT_BATCH = 64


# -- the metrics (trec_eval's) --------------------------------------------------------------------------------


def ndcg_at(run: Run, qrels: Qrels, k: int = 10) -> float:
    """Mean nDCG@k over the judged queries; a query with no result scores 0."""
    return _mean(_ndcg(run.get(query, {}), judged, k) for query, judged in qrels.items())


def recall_at(run: Run, qrels: Qrels, k: int = 100) -> float:
    return _mean(_recall(run.get(query, {}), judged, k) for query, judged in qrels.items())


def ranked(scores: Mapping[str, float], k: int) -> list[str]:
    """trec_eval's order: score descending, ties by document id descending."""
    return sorted(scores, key=lambda document: (-scores[document], _reverse(document)))[:k]


def _ndcg(scores: Mapping[str, float], judged: Mapping[str, int], k: int) -> float:
    gains = [judged.get(document, 0) for document in ranked(scores, k)]
    dcg = sum(gain / math.log2(rank + 2) for rank, gain in enumerate(gains))
    ideal = sorted((grade for grade in judged.values() if grade > 0), reverse=True)[:k]
    best = sum(gain / math.log2(rank + 2) for rank, gain in enumerate(ideal))
    return dcg / best if best else 0.0


def _recall(scores: Mapping[str, float], judged: Mapping[str, int], k: int) -> float:
    relevant = {document for document, grade in judged.items() if grade > 0}
    return len(relevant & set(ranked(scores, k))) / len(relevant) if relevant else 0.0


def _reverse(document: str) -> tuple[int, ...]:
    return tuple(-ord(c) for c in document)


def _mean(values: Iterable[float]) -> float:
    listed = list(values)
    return sum(listed) / len(listed) if listed else 0.0


# -- through the API -----------------------------------------------------------------------------------------


async def ingest(
    base_url: str,
    collection: str,
    documents: Mapping[str, str],
    concurrency: int = 2,
    chunking: dict[str, int] | None = None,
) -> None:
    async with aiohttp_session(concurrency) as session:
        body: dict[str, object] = {"name": collection}
        if chunking is not None:
            body["chunking"] = chunking
        created = await session.post(f"{base_url}/v1/collections", json=body)
        if created.status != 201:
            raise RuntimeError(f"creating {collection} answered {created.status}: {await created.text()}")
        items = list(documents.items())
        batches = [items[at : at + UPSERT_BATCH] for at in range(0, len(items), UPSERT_BATCH)]
        semaphore = asyncio.Semaphore(concurrency)

        async def upsert(batch: list[tuple[str, str]]) -> None:
            body = {"documents": [{"id": document_id, "text": text} for document_id, text in batch]}
            async with semaphore, session.post(f"{base_url}/v1/collections/{collection}/documents", json=body) as r:
                if r.status != 200:
                    raise RuntimeError(f"upsert answered {r.status}: {await r.text()}")

        await asyncio.gather(*(upsert(batch) for batch in batches))


async def search_all(
    base_url: str,
    collection: str,
    queries: Mapping[str, str],
    mode: str,
    fusion: dict[str, object] | None = None,
    top_k: int = DEPTH,
    concurrency: int = 4,
    latencies: list[float] | None = None,
) -> dict[str, list[Hit]]:
    """Each query's hits in `mode`, `top_k` of them, best first; each request's seconds into `latencies`."""
    found: dict[str, list[Hit]] = {}
    semaphore = asyncio.Semaphore(concurrency)
    async with aiohttp_session(concurrency) as session:

        async def one(query_id: str, text: str) -> None:
            body: dict[str, object] = {"query": text, "top_k": top_k, "mode": mode}
            if fusion is not None:
                body["fusion"] = fusion
            async with semaphore:
                started = time.perf_counter()
                found[query_id] = await _search(session, f"{base_url}/v1/collections/{collection}/search", body)
                if latencies is not None:
                    latencies.append(time.perf_counter() - started)

        await asyncio.gather(*(one(query_id, text) for query_id, text in queries.items()))
    return found


async def _search(session: aiohttp.ClientSession, url: str, body: dict[str, object]) -> list[Hit]:
    async with session.post(url, json=body, headers={"Cache-Control": "no-cache"}) as response:
        if response.status != 200:
            raise RuntimeError(f"search answered {response.status}: {await response.text()}")
        data = (await response.json())["data"]
    return [Hit(hit["id"], hit["score"], "", {}) for hit in data]


def as_run(found: Mapping[str, Sequence[Hit]]) -> Run:
    """Scores by rank (DEPTH - rank), so that ties in the engine's scores keep the engine's order."""
    return {query: {hit.id: float(DEPTH - rank) for rank, hit in enumerate(hits)} for query, hits in found.items()}


def fused_run(
    dense: Mapping[str, Sequence[Hit]], lexical: Mapping[str, Sequence[Hit]], fusion: Fusion, top_k: int
) -> Run:
    """What hybrid search answers for `top_k` with `fusion`: each list's first max(top_k, candidates) fused."""
    depth = max(top_k, fusion.candidates)
    return as_run(
        {
            query: fuse({"dense": hits[:depth], "lexical": lexical.get(query, [])[:depth]}, fusion, top_k)
            for query, hits in dense.items()
        }
    )


def fusion_grid() -> list[Fusion]:
    """The fusions tried on the tuning judgements."""
    dense_weights = (0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0)
    grid = []
    for candidates in (20, 50, 100):
        grid += [
            Fusion("rrf", k=k, weights={"dense": w}, candidates=candidates)
            for k in (10, 30, 60, 100)
            for w in dense_weights
        ]
        grid += [Fusion("weighted", weights={"dense": w}, candidates=candidates) for w in dense_weights]
    return grid


# -- one set, every mode -----------------------------------------------------------------------------------


@dataclass
class SetResult:
    name: str
    documents: int
    queries: int
    scores: dict[str, dict[str, float]]  # mode (or "hybrid, tuned") -> {"ndcg@10", "recall@100"}
    tuned: Fusion | None  # the best fusion on the tuning judgements
    tuning: list[tuple[Fusion, float]]  # each fusion tried, with its nDCG@10 on the tuning judgements
    pytrec_eval: dict[str, float]  # one run's figures by pytrec_eval, beside ours
    latency_ms: dict[str, tuple[float, float]]  # mode -> p50, p99 of a search for 10 through the API, one at a time


async def evaluate(base_url: str, chosen: RetrievalSet, chunking: dict[str, int] | None = None) -> SetResult:
    """Ingest, search every test query in each mode (hybrid with the default fusion), tune the fusion on the
    tuning split, then search in hybrid with the tuned one; with `chunking`, the same documents in a chunked
    collection too, searched in each mode ("<mode>, chunked")."""
    await ingest(base_url, chosen.name, chosen.test.documents)
    test = chosen.test
    latency_ms = {mode: await latency(base_url, chosen.name, test.queries, mode) for mode in MODES}
    found = {mode: await search_all(base_url, chosen.name, test.queries, mode) for mode in MODES}
    scores = {mode: figures(as_run(hits), test.qrels) for mode, hits in found.items()}
    scores["hybrid"] = await hybrid_figures(base_url, chosen.name, test, None)
    tuned, tried = None, []
    if chosen.tuning is not None:
        collection = chosen.name
        if chosen.tuning.documents is not test.documents:
            collection = f"{chosen.name}-tuning"
            await ingest(base_url, collection, chosen.tuning.documents)
        dense = await search_all(base_url, collection, chosen.tuning.queries, "dense")
        lexical = await search_all(base_url, collection, chosen.tuning.queries, "lexical")
        tried = [(f, ndcg_at(fused_run(dense, lexical, f, 10), chosen.tuning.qrels)) for f in fusion_grid()]
        tuned = max(tried, key=lambda pair: pair[1])[0]
        scores["hybrid, tuned"] = await hybrid_figures(base_url, chosen.name, test, tuned)
    if chunking is not None:
        chunked = f"{chosen.name}-chunked"
        await ingest(base_url, chunked, test.documents, chunking=chunking)
        for mode in ("dense", "lexical"):
            scores[f"{mode}, chunked"] = figures(
                as_run(await search_all(base_url, chunked, test.queries, mode)), test.qrels
            )
        scores["hybrid, chunked"] = await hybrid_figures(base_url, chunked, test, None)
    check = trec_eval(as_run(found["dense"]), test.qrels)
    return SetResult(chosen.name, len(test.documents), len(test.qrels), scores, tuned, tried, check, latency_ms)


async def latency(base_url: str, collection: str, queries: Mapping[str, str], mode: str) -> tuple[float, float]:
    """p50 and p99 milliseconds of searches for 10, one at a time (the query's embedding included)."""
    seconds: list[float] = []
    await search_all(base_url, collection, queries, mode, top_k=10, concurrency=1, latencies=seconds)
    ordered = sorted(seconds)
    return 1000 * ordered[len(ordered) // 2], 1000 * ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


async def hybrid_figures(base_url: str, collection: str, split: Split, fusion: Fusion | None) -> dict[str, float]:
    """nDCG@10 of searches for 10 results and Recall@100 of searches for 100: what fuses depends on top_k."""
    body = None if fusion is None else wire(fusion)
    first = await search_all(base_url, collection, split.queries, "hybrid", body, top_k=10)
    deep = await search_all(base_url, collection, split.queries, "hybrid", body, top_k=DEPTH)
    return {"ndcg@10": ndcg_at(as_run(first), split.qrels, 10), "recall@100": recall_at(as_run(deep), split.qrels)}


def figures(run: Run, qrels: Qrels) -> dict[str, float]:
    return {"ndcg@10": ndcg_at(run, qrels, 10), "recall@100": recall_at(run, qrels, DEPTH)}


def wire(fusion: Fusion) -> dict[str, object]:
    """The fusion as a search asks for it."""
    return {
        "method": fusion.method,
        "k": fusion.k,
        "weights": dict(fusion.weights or {}),
        "candidates": fusion.candidates,
    }


def trec_eval(run: Run, qrels: Qrels) -> dict[str, float]:
    """The same figures by pytrec_eval (trec_eval's own code), to hold ours to."""
    import pytrec_eval  # the bench's, not the gateway's

    evaluator = pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut.10", "recall.100"})
    per_query = evaluator.evaluate(run)
    return {
        "ndcg@10": _mean(per_query.get(q, {}).get("ndcg_cut_10", 0.0) for q in qrels),
        "recall@100": _mean(per_query.get(q, {}).get("recall_100", 0.0) for q in qrels),
    }


@contextlib.contextmanager
def served_gateway(out: Path, name: str, repository: Path | None = None) -> Iterator[str]:
    """Triton (serving `repository`, default the checkout's) and a gateway on a fresh embedded store, the embedding
    cache off; yields the gateway's URL and stops both after."""
    import tempfile

    from bench.processes import ServerProcess, stopped_on_exit
    from bench.stack import REPOSITORY, start_gateway, start_triton

    with tempfile.TemporaryDirectory() as store, stopped_on_exit(servers := list[ServerProcess]()):
        triton_endpoint = start_triton(out, servers, repository or REPOSITORY)
        environment = {"EMBEDDING_CACHE_MB": "0", "SEARCH_PATH": store, "TRITON_URL": triton_endpoint.grpc_target}
        yield start_gateway(out, environment, name, servers).base_url


async def main(
    data: Path, names: Sequence[str], out: Path, repository: Path | None = None, chunking: dict[str, int] | None = None
) -> list[SetResult]:
    """Every set found under `data` through one Triton and gateway, a JSON report in `out`."""
    results = []
    out.mkdir(parents=True, exist_ok=True)
    with served_gateway(out, "gateway-retrieval", repository) as base_url:
        for chosen in sets_in(data, names):
            result = await evaluate(base_url, chosen, chunking)
            results.append(result)
            print(report_line(result), flush=True)
            (out / "retrieval.json").write_text(json.dumps([as_json(r) for r in results], indent=2))
    return results


def report_line(result: SetResult) -> str:
    modes = ", ".join(f"{mode} {s['ndcg@10']:.4f}/{s['recall@100']:.3f}" for mode, s in result.scores.items())
    counts = f"{result.documents} documents, {result.queries} queries"
    return f"{result.name} ({counts}) nDCG@10/R@100: {modes}; tuned {result.tuned}"


def as_json(result: SetResult) -> dict[str, object]:
    return {
        "set": result.name,
        "documents": result.documents,
        "queries": result.queries,
        "scores": result.scores,
        "tuned": None if result.tuned is None else wire(result.tuned),
        "tuning": [{"fusion": wire(f), "ndcg@10": score} for f, score in result.tuning],
        "pytrec_eval dense": result.pytrec_eval,
        "latency ms p50, p99": result.latency_ms,
    }


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(prog="python -m bench.search.retrieval", description=__doc__)
    parser.add_argument("--data", type=Path, required=True, help="folder with beir/<set>/ and zh/lcqmc_*.tsv")
    parser.add_argument("--sets", default="scifact,nfcorpus,lcqmc")
    parser.add_argument("--out", type=Path, default=Path("bench/results/retrieval"))
    parser.add_argument("--repository", type=Path, help="the model repository Triton serves (default: the checkout's)")
    parser.add_argument("--chunking", help="MAX_TOKENS:OVERLAP: also search the documents in a chunked collection")
    arguments = parser.parse_args()
    chunks = None
    if arguments.chunking:
        max_tokens, overlap = (int(part) for part in arguments.chunking.split(":"))
        chunks = {"max_tokens": max_tokens, "overlap": overlap}
    asyncio.run(main(arguments.data, arguments.sets.split(","), arguments.out, arguments.repository, chunks))
