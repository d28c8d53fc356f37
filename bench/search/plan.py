"""What the search part measures: the labelled pairs it indexes and asks, the sizes, the settings swept."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from bench.eval_cache import DATA_FILES, load_pairs
from bench.paths import ROOT

if TYPE_CHECKING:
    from gateway.search.documents import Metadata

PART = "search"
DEFAULT_DATA = ROOT / ".run" / "eval-data"  # as the caches part: put (or link) the labelled pairs here
COLLECTION = "bench"
TOP_K = 10
INGEST_BATCH = 64  # documents per upsert, the ingest CLI's default
EMBED_BATCH = 32  # texts per /v1/embeddings request of the reference
INGEST_CONCURRENCY = 4  # requests in flight for both, the ingest CLI's default
CONCURRENCIES = (1, 8, 32)
P99_CONCURRENCY = 8  # where the latency goal is judged
P99_GOAL_MS = 50.0
INGEST_GOAL = 0.8  # ingest documents/s over embeddings texts/s
RECALL_GOAL = 0.99  # the engine's recall@10 over exact search's
HYBRID_RATIO_GOAL = 1.3  # hybrid's p99 over dense's, same queries and run
PEERS = frozenset({"milvus", "chromadb"})
BUCKETS = 10  # every document has a `bucket` 0-9; the filtered search asks for one (a tenth of the collection)
FILLER_COSINE = 0.8  # a top-up vector's cosine to the real vector it was drawn around

GATEWAY = "gateway REST (Qdrant Edge, embedded)"
GATEWAY_HYBRID = f"{GATEWAY}, hybrid"  # the same searches in mode hybrid, each run beside the dense ones
HYBRID_CONCURRENCIES = (1, 8)
GATEWAY_REAL = f"{GATEWAY}, real documents"  # the latency on the real documents alone, beside Milvus's
MILVUS = "gateway REST (Milvus 2.3.5 standalone), real documents"
MILVUS_NO_FLUSH = f"{MILVUS}, no flush"
# "As fast as the embedded store", on a machine whose cores Milvus shares with the gateway, Triton and the load: at
# concurrency 8 the cores are saturated, so a search's p99 follows the CPU every process spends on it, and Milvus, a
# server a gRPC hop away, spends more than an in-process index. What the gateway controls is that nothing else is
# added: Milvus's p99 over the embedded store's is within this factor of their CPU per search (a search waiting on
# Milvus's time tick, as every one did before the read levels, or queued for a store thread would break it).
MILVUS_WAIT_RATIO = 1.1
CHROMA = "chromadb 1.5.9 PersistentClient, INT8 ONNX in-process"


@dataclass(frozen=True)
class Corpus:
    """The positive labelled pairs: each second sentence is a document, each first sentence a query whose right
    answer is its pair's document. Equal sentences are one document (and one query)."""

    documents: list[str]  # distinct second sentences
    languages: list[str]  # "en" / "zh", per document
    queries: list[str]  # distinct first sentences that are not also documents
    answers: list[int]  # per query: the index of its pair's document

    def document_id(self, index: int) -> str:
        return f"d{index}"

    def metadata(self, index: int) -> Metadata:
        return {"lang": self.languages[index], "bucket": index % BUCKETS}


def load_corpus(data: Path, limit: int | None = None) -> Corpus:
    """The positive pairs of MRPC and LCQMC test under `data` (at most `limit` per language)."""
    missing = [str(data / file) for file in DATA_FILES.values() if not (data / file).is_file()]
    if missing:
        raise FileNotFoundError(
            f"labelled pairs not found: {', '.join(missing)}; pass --data DIR (see docs/benchmarks.md)"
        )
    documents: dict[str, int] = {}
    languages: list[str] = []
    queries: dict[str, int] = {}
    for language, file in DATA_FILES.items():
        positives = [pair for pair in load_pairs(data / file) if pair.label == 1][:limit]
        for pair in positives:
            if pair.sentence2 not in documents:
                documents[pair.sentence2] = len(documents)
                languages.append(language)
        for pair in positives:
            if pair.sentence1 not in documents and pair.sentence1 not in queries:
                queries[pair.sentence1] = documents[pair.sentence2]
    return Corpus(list(documents), languages, list(queries), list(queries.values()))


@dataclass(frozen=True)
class Plan:
    corpus: Corpus
    total_documents: int  # the collection the latency is measured on, topped up to this
    queries_per_point: int  # searches per (concurrency, filter) point and run
    runs: int
    peers: frozenset[str]  # of PEERS, run after the embedded store

    @classmethod
    def make(cls, data: Path, *, runs: int, quick: bool, peers: frozenset[str] = PEERS) -> Plan:
        if quick:
            return cls(load_corpus(data, 200), 5_000, 100, 1, peers)
        return cls(load_corpus(data), 100_000, 1_000, runs, peers)

    @property
    def filler_count(self) -> int:
        return max(self.total_documents - len(self.corpus.documents), 0)

    def filler_metadata(self, index: int) -> Metadata:
        """A top-up document's metadata: its source document's language, and the bucket its place gives it."""
        real = len(self.corpus.documents)
        return {"lang": self.corpus.languages[index % real], "bucket": (real + index) % BUCKETS}

    def filler_text(self, index: int) -> str:
        """A top-up document's text: its source document's, so that hits serialise as much text as real ones."""
        return self.corpus.documents[index % len(self.corpus.documents)]
