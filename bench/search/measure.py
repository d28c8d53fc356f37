"""Embedded vector engines at 100,000 documents: search latency (p50, p99) and recall@10 against exact search.

    python -m bench.search.measure --data DIR [--real 20000] [--total 100000] [--queries 300]

The documents are real sentences of labelled paraphrase pairs (`--data`: a folder holding en/mrpc_test.tsv and
zh/lcqmc_test.tsv, as for `make eval-cache`) embedded by the INT8 ONNX graph Triton serves (run
in-process here), topped up to `--total` with random unit vectors when fewer real ones are asked for (random
vectors are the hard case for an ANN index). Each document gets a `bucket` 0-9; the filtered search asks for one
bucket (a tenth of the documents). Queries are other real sentences. Recall@10 compares each engine's ten ids
with exact cosine search over the same vectors (and the same filter), computed here with numpy.
"""

from __future__ import annotations

import argparse
import os
import random
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import numpy.typing as npt

os.environ.setdefault("LANCE_LOG", "error")  # lance warns on every search that selects columns without `_distance`

from bench.paths import ROOT
from bench.search.engines import Engine, GatewayEmbeddedEngine, LanceEngine, QdrantEdgeEngine, Vectors

TOP_K = 10


def sentences(data: Path) -> Iterator[tuple[str, str]]:
    """(first, second) sentence of every pair in the labelled sets under `data`, in a fixed order."""
    for path in sorted(data.glob("*/*.tsv")):
        for line in path.read_text(encoding="utf-8").splitlines()[1:]:
            fields = line.split("\t")
            if len(fields) >= 2:
                yield fields[0], fields[1]


def corpus_and_queries(data: Path, real: int, queries: int) -> tuple[list[str], list[str]]:
    """Queries: the first sentence of `queries` shuffled pairs; documents: every other distinct sentence."""
    pairs = list(sentences(data))
    random.Random(7).shuffle(pairs)
    asked = list(dict.fromkeys(first for first, _ in pairs))[:queries]
    held_out = set(asked)
    documents = [text for text in dict.fromkeys(t for pair in pairs for t in pair) if text not in held_out]
    return documents[:real], asked


def embed(texts: list[str]) -> Vectors:
    import onnxruntime as ort
    from tokenizers import Tokenizer

    from bench.padding import padded_inputs

    repository = ROOT / "model_repository"
    options = ort.SessionOptions()
    options.intra_op_num_threads = len(os.sched_getaffinity(0))
    session = ort.InferenceSession(str(repository / "bge_onnx/1/model_int8.onnx"), options)
    tokenizer = Tokenizer.from_file(str(repository / "bge_tokenizer/1/tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.enable_truncation(128)
    encodings = tokenizer.encode_batch(texts)
    order = sorted(range(len(texts)), key=lambda i: len(encodings[i].ids))
    out = np.zeros((len(texts), 384), dtype=np.float32)
    for start in range(0, len(order), 64):
        rows = order[start : start + 64]
        (embedding,) = session.run(["EMBEDDING"], padded_inputs([encodings[i].ids for i in rows], 0))
        out[rows] = embedding
    return unit(out)


def cached_embeddings(texts: list[str], path: Path | None) -> Vectors:
    """The texts' vectors, read from `path` when an earlier run saved them for the same texts."""
    if path is not None and path.is_file():
        saved: Vectors = np.load(path).astype(np.float32)
        if saved.shape[0] == len(texts):
            return saved
    started = time.perf_counter()
    vectors = embed(texts)
    print(f"embedded {len(texts)} real texts in {time.perf_counter() - started:.1f} s", flush=True)
    if path is not None:
        np.save(path, vectors)
    return vectors


def unit(vectors: Vectors) -> Vectors:
    normalised: Vectors = (vectors / np.linalg.norm(vectors, axis=1, keepdims=True)).astype(np.float32)
    return normalised


Buckets = npt.NDArray[np.int64]


def exact_hits(vectors: Vectors, buckets: Buckets, query: Vectors, bucket: int | None, found: list[int]) -> int:
    """How many found ids belong to the exact top k; a tie with the k-th exact score counts (equal texts)."""
    scores = vectors @ query
    if bucket is not None:
        scores = np.where(buckets == bucket, scores, -np.inf)
    kth = np.partition(-scores, TOP_K - 1)[TOP_K - 1]
    return sum(1 for row in found[:TOP_K] if -scores[row] <= kth + 1e-5)


def measure(engine: Engine, vectors: Vectors, buckets: Buckets, queries: Vectors) -> dict[str, float]:
    started = time.perf_counter()
    engine.load(vectors, buckets.tolist())
    result: dict[str, float] = {"build_s": time.perf_counter() - started}
    for label, bucket_of in (("unfiltered", lambda i: None), ("filtered", lambda i: i % 10)):
        for i in range(min(20, len(queries))):  # warm caches and lazily loaded indexes
            engine.search(queries[i], TOP_K, bucket_of(i))
        latencies, hits = [], 0
        for i, query in enumerate(queries):
            began = time.perf_counter()
            found = engine.search(query, TOP_K, bucket_of(i))
            latencies.append(time.perf_counter() - began)
            hits += exact_hits(vectors, buckets, query, bucket_of(i), found)
        result[f"{label}_p50_ms"] = float(np.percentile(latencies, 50) * 1000)
        result[f"{label}_p99_ms"] = float(np.percentile(latencies, 99) * 1000)
        result[f"{label}_recall@10"] = hits / (TOP_K * len(queries))
    engine.close()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--real",
        type=int,
        default=100_000,
        help="real sentences embedded through the model (at most what the data holds)",
    )
    parser.add_argument("--data", type=Path, required=True, help="folder holding en/mrpc_test.tsv, zh/lcqmc_test.tsv")
    parser.add_argument("--total", type=int, default=100_000, help="documents, topped up with random unit vectors")
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--engines", default="lancedb,qdrant-edge,gateway-embedded")
    parser.add_argument("--vectors", type=Path, help="save the real texts' vectors here, and reuse them next time")
    parser.add_argument("--lance-nprobes", type=int, default=40)
    parser.add_argument("--lance-refine", type=int, default=10)
    parser.add_argument("--qdrant-ef", type=int, default=128)
    args = parser.parse_args()
    texts, asked = corpus_and_queries(args.data, args.real, args.queries)
    vectors = cached_embeddings(texts + asked, args.vectors)
    documents, queries = vectors[: len(texts)], vectors[len(texts) :]
    filler = unit(np.random.default_rng(7).standard_normal((args.total - len(texts), 384)).astype(np.float32))
    documents = np.concatenate([documents, filler])
    buckets = np.random.default_rng(8).integers(0, 10, len(documents))
    print(f"{len(texts)} real + {len(filler)} random unit vectors, {len(queries)} real queries, top {TOP_K}")
    with tempfile.TemporaryDirectory(prefix="bench-search-") as folder:
        engines: dict[str, Callable[[], Engine]] = {
            "lancedb": lambda: LanceEngine(Path(folder) / "lance", args.lance_nprobes, args.lance_refine),
            "qdrant-edge": lambda: QdrantEdgeEngine(Path(folder) / "qdrant", args.qdrant_ef),
            "qdrant-edge-exact": lambda: QdrantEdgeEngine(Path(folder) / "exact", indexed=False),
            "gateway-embedded": lambda: GatewayEmbeddedEngine(Path(folder) / "gateway"),
        }
        for key in args.engines.split(","):
            engine = engines[key]()
            numbers = measure(engine, documents, buckets, queries)
            if isinstance(engine, GatewayEmbeddedEngine):
                numbers.update(ingest_s=engine.ingest_s, index_s=engine.index_s, loop_stall_s=engine.max_loop_stall_s)
            print(engine.name, " ".join(f"{name}={value:.3f}" for name, value in numbers.items()), flush=True)


if __name__ == "__main__":
    main()
