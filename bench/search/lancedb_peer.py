"""LanceDB's own hybrid search as the peer of the gateway's search modes, on the sets and judgements of
`bench.search.retrieval` (BEIR SciFact, LCQMC), with the vectors of the same served model.

For each set:
1. every document is embedded through the gateway's /v1/embeddings (`input_type` "document", 32 texts a request,
   4 in flight, `Cache-Control: no-cache`) and every test query alone (`input_type` "query", one request at a
   time): the served graph is INT8 with activations quantised per batch, so a lone query gets exactly the vector
   the gateway's own search gets for it, and its request's time is the query's embedding latency;
2. the documents go into a local LanceDB table (id, text, vector) with LanceDB's native full-text index on the
   text (`create_index(column, config=FTS(...))`; Tantivy's FTS is gone from 0.40). Its tokenizer is chosen on
   the set's tuning judgements, by lexical nDCG@10, among the ones LanceDB offers without a download (below); no
   vector index under `VECTOR_INDEX_ROWS` rows, where LanceDB's docs find brute force fast enough: the searches
   are exact;
3. every test query in each mode, asking for 10 (nDCG@10) and for 100 (Recall@100), as `hybrid_figures` does:
   dense (cosine), lexical (BM25 over the FTS index) and hybrid (`query_type="hybrid"`: both lists of `limit`
   rows each, fused by LanceDB's default reranker, RRF with k = 60). Each search is timed in this process, one
   at a time, with the query's vector already at hand: the embedding is not in these latencies, it is reported
   beside them.

    python -m bench.search.lancedb_peer --data DIR --sets scifact,lcqmc
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import shutil
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bench.run_stats import RunStats
from bench.search.api import embed
from bench.search.quality import Vectors
from bench.search.retrieval import (
    DEPTH,
    MODES,
    as_run,
    ndcg_at,
    recall_at,
    served_gateway,
)
from bench.search.retrieval_sets import RetrievalSet, Split, sets_in
from gateway.search.documents import Hit

TOP_KS = (10, DEPTH)  # nDCG@10 of the searches for 10, Recall@100 of those for 100
VECTOR_INDEX_ROWS = 100_000  # LanceDB's docs: brute force is fast enough "for datasets around 100K rows or fewer"
WARM_UP = 10  # searches per mode before the timed ones (the first one opens the index files)
Search = Callable[[str, int], list[Hit]]  # (query id, top_k) -> hits, best first


@dataclass(frozen=True)
class Tokenizer:
    """One configuration of LanceDB's FTS index: `FTS(**options)`."""

    name: str
    options: Mapping[str, Any] = field(default_factory=dict)

    def config(self) -> Any:
        from lancedb.index import FTS

        return FTS(**self.options)


DEFAULT = Tokenizer("simple (LanceDB's default: English stemmed, stop words)")
JIEBA = Tokenizer("jieba/default (jieba's dictionary)", {"base_tokenizer": "jieba/default"})
# `simple` splits on whitespace and punctuation: a Chinese sentence is one token. `ngram` cuts every word into
# its character n-grams; `icu` segments words by ICU's dictionaries (Chinese included); `jieba/*` needs a model
# folder (`LANCE_LANGUAGE_MODEL_HOME`), filled from jieba's package where it is installed.
TOKENIZERS = (
    DEFAULT,
    Tokenizer("ngram 1-1 (characters)", {"base_tokenizer": "ngram", "ngram_min_length": 1, "ngram_max_length": 1}),
    Tokenizer("ngram 1-2", {"base_tokenizer": "ngram", "ngram_min_length": 1, "ngram_max_length": 2}),
    Tokenizer("ngram 2-2", {"base_tokenizer": "ngram", "ngram_min_length": 2, "ngram_max_length": 2}),
    Tokenizer("icu (ICU word segmentation)", {"base_tokenizer": "icu"}),
)


class PeerTable:
    """One set's documents in a LanceDB table, searched the three ways."""

    def __init__(self, table: Any) -> None:
        self._table = table

    @classmethod
    def create(
        cls, db: Any, name: str, documents: Mapping[str, str], vectors: Vectors | None, tokenizer: Tokenizer
    ) -> PeerTable:
        """The table (vectors in a `vector` column unless None), its FTS index and, past `VECTOR_INDEX_ROWS`
        rows, its vector index."""
        import pyarrow as pa

        columns = {
            "id": pa.array(list(documents), pa.string()),
            "text": pa.array(list(documents.values()), pa.string()),
        }
        if vectors is not None:
            flat = pa.array(vectors.astype(np.float32).reshape(-1), pa.float32())
            columns["vector"] = pa.FixedSizeListArray.from_arrays(flat, vectors.shape[1])
        table = db.create_table(name, data=pa.table(columns), mode="overwrite")
        table.create_index("text", config=tokenizer.config())
        if vectors is not None and len(vectors) >= VECTOR_INDEX_ROWS:
            table.create_index(metric="cosine", vector_column_name="vector", index_type="IVF_HNSW_SQ")
        return cls(table)

    def dense(self, vector: Vectors, top_k: int) -> list[Hit]:
        query = self._table.search(vector, vector_column_name="vector", query_type="vector").distance_type("cosine")
        rows = query.select(["id", "_distance"]).limit(top_k).to_arrow()
        return _hits(rows["id"].to_pylist(), [1.0 - d for d in rows["_distance"].to_pylist()])

    def lexical(self, text: str, top_k: int) -> list[Hit]:
        rows = self._table.search(text, query_type="fts").select(["id", "_score"]).limit(top_k).to_arrow()
        return _hits(rows["id"].to_pylist(), rows["_score"].to_pylist())

    def hybrid(self, text: str, vector: Vectors, top_k: int) -> list[Hit]:
        """Each list's `top_k` rows fused by the default reranker (RRF, k 60): the order depends on `top_k`."""
        query = self._table.search(query_type="hybrid", vector_column_name="vector").vector(vector).text(text)
        rows = query.distance_type("cosine").select(["id"]).limit(top_k).to_arrow()
        return _hits(rows["id"].to_pylist(), rows["_relevance_score"].to_pylist())


def _hits(ids: Sequence[str], scores: Sequence[float]) -> list[Hit]:
    return [Hit(document, float(score), "", {}) for document, score in zip(ids, scores, strict=True)]


# -- the figures ---------------------------------------------------------------------------------------------


@dataclass
class ModeResult:
    figures: dict[str, float]  # "ndcg@10" (of the searches for 10), "recall@100" (of those for 100)
    latency: dict[int, RunStats]  # top_k -> each search's seconds, one at a time, the query's vector at hand


@dataclass
class PeerResult:
    """What a side-by-side with `retrieval.SetResult` needs: the same figures per mode, and the latencies."""

    name: str
    documents: int
    queries: int
    tokenizer: str
    tokenizers_tried: dict[str, float]  # tokenizer -> lexical nDCG@10 on the tuning judgements
    vector_index: str
    modes: dict[str, ModeResult]
    query_embedding: RunStats  # each test query's /v1/embeddings request, alone: not in the search latencies
    document_embedding_s: float
    build_s: float  # the table and its indexes


def measure(table: PeerTable, split: Split, vectors: Mapping[str, Vectors]) -> dict[str, ModeResult]:
    """Every query of `split` in each mode, for each of `TOP_KS`, timed one at a time."""
    searches: dict[str, Search] = {
        "dense": lambda query, k: table.dense(vectors[query], k),
        "lexical": lambda query, k: table.lexical(split.queries[query], k),
        "hybrid": lambda query, k: table.hybrid(split.queries[query], vectors[query], k),
    }
    results = {}
    for mode in MODES:
        search = searches[mode]
        for query in list(split.queries)[:WARM_UP]:
            search(query, DEPTH)
        runs = {k: timed(search, split.queries, k) for k in TOP_KS}
        figures = {
            "ndcg@10": ndcg_at(as_run(runs[10][0]), split.qrels, 10),
            "recall@100": recall_at(as_run(runs[DEPTH][0]), split.qrels, DEPTH),
        }
        results[mode] = ModeResult(figures, {k: stats for k, (_, stats) in runs.items()})
    return results


def timed(search: Search, queries: Iterable[str], top_k: int) -> tuple[dict[str, list[Hit]], RunStats]:
    found, latencies = {}, []
    started = time.perf_counter()
    for query in queries:
        before = time.perf_counter()
        found[query] = search(query, top_k)
        latencies.append(time.perf_counter() - before)
    return found, RunStats(time.perf_counter() - started, latencies)


def choose_tokenizer(
    split: Split | None, folder: Path, tokenizers: Sequence[Tokenizer] = TOKENIZERS
) -> tuple[Tokenizer, dict[str, float]]:
    """The tokenizer whose lexical search scores the best nDCG@10 on `split` (the tuning judgements; the first
    on a tie, LanceDB's default first), with each one's score; the default when there is no tuning split."""
    if split is None:
        return tokenizers[0], {}
    import lancedb

    db = lancedb.connect(str(folder))
    tried = {}
    for number, tokenizer in enumerate(tokenizers):
        table = PeerTable.create(db, f"tuning-{number}", split.documents, None, tokenizer)
        found = {query: table.lexical(text, 10) for query, text in split.queries.items()}
        tried[tokenizer.name] = ndcg_at(as_run(found), split.qrels, 10)
    return max(tokenizers, key=lambda tokenizer: tried[tokenizer.name]), tried


def tokenizers_at_hand(work: Path) -> tuple[Tokenizer, ...]:
    """`TOKENIZERS`, and jieba's when its package is installed (it is no dependency of the stack): Lance reads
    the dictionary from `$LANCE_LANGUAGE_MODEL_HOME/jieba/default/dict.txt`: jieba's own, which rjieba (the
    gateway's analyzer) builds on too."""
    spec = importlib.util.find_spec("jieba")
    if spec is None or spec.origin is None:
        return TOKENIZERS
    home = work / "language_models"
    (home / "jieba" / "default").mkdir(parents=True, exist_ok=True)
    shutil.copyfile(Path(spec.origin).parent / "dict.txt", home / "jieba" / "default" / "dict.txt")
    os.environ["LANCE_LANGUAGE_MODEL_HOME"] = str(home)  # what Lance reads, when it builds a jieba tokenizer
    return (*TOKENIZERS, JIEBA)


async def run_lancedb(base_url: str, chosen: RetrievalSet, work: Path) -> PeerResult:
    """The set's documents and test queries embedded through the gateway at `base_url`, LanceDB's table under
    `work` (replaced), every mode's figures and latencies. LanceDB's calls block this event loop: nothing else
    runs on it meanwhile."""
    import lancedb

    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    test = chosen.test
    started = time.perf_counter()
    documents, _ = await embed(base_url, list(test.documents.values()), "document")
    document_embedding_s = time.perf_counter() - started
    queries, query_embedding = await embed(base_url, list(test.queries.values()), "query", batch=1, concurrency=1)
    tokenizer, tried = choose_tokenizer(chosen.tuning, work / "tuning", tokenizers_at_hand(work))
    started = time.perf_counter()
    table = PeerTable.create(lancedb.connect(str(work / "test")), chosen.name, test.documents, documents, tokenizer)
    build_s = time.perf_counter() - started
    modes = measure(table, test, dict(zip(test.queries, queries, strict=True)))
    index = "none: exact search" if len(documents) < VECTOR_INDEX_ROWS else "IVF_HNSW_SQ"
    return PeerResult(
        chosen.name, len(test.documents), len(test.qrels), tokenizer.name, tried, index, modes,
        query_embedding, document_embedding_s, build_s,
    )  # fmt: skip


# -- the command line ----------------------------------------------------------------------------------------


async def main(data: Path, names: Sequence[str], out: Path) -> list[PeerResult]:
    """Every set found under `data` through one Triton and gateway; the table printed, a JSON report in `out`."""
    out.mkdir(parents=True, exist_ok=True)
    results = []
    with served_gateway(out, "gateway-lancedb-peer") as base_url:
        for chosen in sets_in(data, names):
            started = time.perf_counter()
            results.append(await run_lancedb(base_url, chosen, out / "lancedb" / chosen.name))
            print(f"{chosen.name}: {time.perf_counter() - started:.0f} s", flush=True)
            (out / "lancedb_peer.json").write_text(json.dumps([as_json(r) for r in results], indent=2))
    print("\n".join(table_lines(results)))
    return results


def table_lines(results: Sequence[PeerResult]) -> list[str]:
    lines = [f"{'set':<8} {'mode':<8} {'nDCG@10':>8} {'R@100':>7} {'ms p50/p99 @10':>16} {'ms p50/p99 @100':>16}"]
    for result in results:
        for mode, measured in result.modes.items():
            at = [f"{s.p(50):.2f}/{s.p(99):.2f}" for s in (measured.latency[10], measured.latency[DEPTH])]
            scores = f"{measured.figures['ndcg@10']:>8.4f} {measured.figures['recall@100']:>7.4f}"
            lines.append(f"{result.name:<8} {mode:<8} {scores} {at[0]:>16} {at[1]:>16}")
    for result in results:
        embedding = f"{result.query_embedding.p(50):.1f}/{result.query_embedding.p(99):.1f}"
        lines.append(
            f"{result.name}: {result.documents} documents, {result.queries} queries; FTS tokenizer "
            f"{result.tokenizer}; vector index {result.vector_index}; query embedding p50/p99 {embedding} ms "
            f"(not in the searches' ms); documents embedded in {result.document_embedding_s:.0f} s"
        )
    return lines


def as_json(result: PeerResult) -> dict[str, object]:
    def latency(stats: RunStats) -> dict[str, float]:
        return {"p50_ms": stats.p(50), "p99_ms": stats.p(99), "mean_ms": 1000 * float(np.mean(stats.latencies))}

    return {
        "set": result.name,
        "documents": result.documents,
        "queries": result.queries,
        "tokenizer": result.tokenizer,
        "tokenizers_tried (lexical nDCG@10 on the tuning judgements)": result.tokenizers_tried,
        "vector_index": result.vector_index,
        "scores": {mode: measured.figures for mode, measured in result.modes.items()},
        "latency (in process, one at a time, the query's vector at hand)": {
            mode: {f"top {k}": latency(stats) for k, stats in measured.latency.items()}
            for mode, measured in result.modes.items()
        },
        "query embedding (/v1/embeddings, one query a request, one at a time)": latency(result.query_embedding),
        "document embedding s": result.document_embedding_s,
        "build s": result.build_s,
    }


if __name__ == "__main__":
    import argparse

    os.environ.setdefault("LANCEDB_LOG", "error")  # else Lance warns twice per hybrid search (the legs' columns)
    parser = argparse.ArgumentParser(prog="python -m bench.search.lancedb_peer", description=__doc__)
    parser.add_argument("--data", type=Path, required=True, help="folder with beir/<set>/ and zh/lcqmc_*.tsv")
    parser.add_argument("--sets", default="scifact,lcqmc")
    parser.add_argument("--out", type=Path, default=Path("bench/results/lancedb-peer"))
    arguments = parser.parse_args()
    asyncio.run(main(arguments.data, arguments.sets.split(","), arguments.out))
