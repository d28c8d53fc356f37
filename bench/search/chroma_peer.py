"""The peer of the search part, run in its own virtual environment (chromadb is not one of the stack's packages):
chromadb's embedded `PersistentClient` with an embedding function that runs the same INT8 ONNX graph and tokenizer
Triton serves, in this process.

    .run/bench-venvs/chromadb/bin/python bench/search/chroma_peer.py INPUT_DIR OUTPUT.json

INPUT_DIR (written by `bench.search.chroma`) holds `input.json` (the documents, queries, metadata, the top-up's
texts and the sweep) and `filler.npy` (the top-up's vectors). The steps mirror the gateway's: ingest the real
documents in 64-document batches, 4 at a time (the embedding function embeds them); answer every query (quality);
add the top-up with its vectors given; then the latency sweep, each query embedded by the embedding function.
Only the standard library, numpy, onnxruntime, tokenizers and chromadb, plus the bench's numpy-only
`bench.search.quality`: nothing else of the stack's environment.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # bench.search.quality: numpy only, as this environment has it
from bench.search.quality import exact_ranked  # noqa: E402 (after the path it is found on)

REPOSITORY = ROOT / "model_repository"
ADD_BATCH = 5_000  # under chromadb's maximum batch size


class Int8Embedder:
    """The served graph (`bge_onnx/1/model_int8.onnx`) behind the served tokenizer (`bge_tokenizer`)."""

    def __init__(self, max_length: int) -> None:
        import onnxruntime as ort

        sys.path.insert(0, str(REPOSITORY / "bge_tokenizer" / "1"))
        tokenization = importlib.import_module("tokenization")
        self._tokenizer = tokenization.TextTokenizer(str(REPOSITORY / "bge_tokenizer/1/tokenizer.json"), max_length)
        options = ort.SessionOptions()
        options.intra_op_num_threads = len(os.sched_getaffinity(0))
        self._session = ort.InferenceSession(str(REPOSITORY / "bge_onnx/1/model_int8.onnx"), options)

    def __call__(self, texts: Sequence[str]) -> list[Any]:
        batch = self._tokenizer.pack(self._tokenizer.encode(list(texts)))
        inputs = {"INPUT_IDS": batch.input_ids, "ATTENTION_MASK": batch.attention_mask}
        (vectors,) = self._session.run(["EMBEDDING"], inputs)
        vectors = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
        return [row.astype(np.float32) for row in vectors]


def embedding_function(embedder: Int8Embedder) -> Any:
    """A chromadb EmbeddingFunction (chromadb checks the class, its name and its config) around `embedder`."""
    functions = importlib.import_module("chromadb.utils.embedding_functions")

    class ServedInt8(functions.EmbeddingFunction):  # type: ignore[misc,name-defined]
        def __init__(self) -> None:
            pass

        def __call__(self, input: Sequence[str]) -> list[Any]:  # chromadb calls it with input=
            return embedder(input)

        @staticmethod
        def name() -> str:
            return "served-int8-onnx"

        def get_config(self) -> dict[str, Any]:
            return {}

        @staticmethod
        def build_from_config(config: dict[str, Any]) -> Any:
            return ServedInt8()

    return ServedInt8()


def timed(
    call: Callable[[int], Any], count: int, concurrency: int, seconds: float | None = None
) -> tuple[float, list[float], list[Any]]:
    """call(i) for i < count, `concurrency` threads, none started after `seconds`: (elapsed s, the latencies (s)
    of the calls made, answers in order)."""
    latencies: list[float | None] = [None] * count
    answers: list[Any] = [None] * count
    started = time.perf_counter()
    deadline = started + seconds if seconds is not None else float("inf")
    ended = started

    def one(index: int) -> None:
        nonlocal ended
        began = time.perf_counter()
        if began > deadline:
            return
        answers[index] = call(index)
        ended = time.perf_counter()
        latencies[index] = ended - began

    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(one, range(count)))
    return ended - started, [latency for latency in latencies if latency is not None], answers


def say(line: str) -> None:
    print(time.strftime("%H:%M:%S"), line, flush=True)


def sweep_point(
    ask: Callable[[int, dict[str, Any] | None], list[str]],
    given: dict[str, Any],
    run: int,
    concurrency: int,
    filtered: bool,
) -> dict[str, Any]:
    """One latency point, the same searches as the gateway's: run r asks queries r*count.., filter bucket i % 10."""
    count, offset, buckets = given["queries_per_point"], run * given["queries_per_point"], given["buckets"]

    def search(index: int) -> list[str]:
        at = offset + index
        return ask(at, {"bucket": at % buckets} if filtered else None)

    elapsed, latencies, _ = timed(search, count, concurrency, given["point_seconds"])
    say(f"run {run}, concurrency {concurrency}{' filter' if filtered else ''}: {len(latencies)} searches, "
        f"{len(latencies) / elapsed:.0f}/s")  # fmt: skip
    return {"run": run, "concurrency": concurrency, "filtered": filtered, "elapsed": elapsed, "latencies": latencies}


def main() -> None:
    source, output = Path(sys.argv[1]), Path(sys.argv[2])
    given = json.loads((source / "input.json").read_text())
    filler = np.load(source / "filler.npy")
    chromadb = importlib.import_module("chromadb")
    embedder = Int8Embedder(given["max_length"])
    result: dict[str, Any] = {"chromadb": chromadb.__version__}
    with tempfile.TemporaryDirectory(prefix="bench-chroma-", dir=given["scratch"]) as folder:
        client = chromadb.PersistentClient(path=folder)
        collection = client.create_collection(
            "bench", embedding_function=embedding_function(embedder), configuration={"hnsw": {"space": "cosine"}}
        )
        ids, texts, metadatas = given["ids"], given["documents"], given["metadatas"]
        batch = given["ingest_batch"]
        starts = list(range(0, len(texts), batch))

        def add(index: int) -> None:
            at = starts[index]
            collection.add(
                ids=ids[at : at + batch], documents=texts[at : at + batch], metadatas=metadatas[at : at + batch]
            )

        elapsed, _, _ = timed(add, len(starts), given["ingest_concurrency"])
        result["ingest_documents_per_second"] = len(texts) / elapsed
        say(f"ingested {len(texts)} documents: {len(texts) / elapsed:.0f} documents/s")
        queries, top_k = given["queries"], given["top_k"]

        def ask(index: int, where: dict[str, Any] | None = None) -> list[str]:
            found = collection.query(query_texts=[queries[index % len(queries)]], n_results=top_k, where=where)
            return list(found["ids"][0])

        _, _, answers = timed(ask, len(queries), 1)  # one at a time: each query embedded alone, as below
        result["quality_small"] = answers
        stored = collection.get(ids=ids, include=["embeddings"])
        by_id = dict(zip(stored["ids"], stored["embeddings"], strict=True))
        documents = np.asarray([by_id[i] for i in ids], dtype=np.float32)
        asked = np.stack([embedder([query])[0] for query in queries])
        result["exact_small"] = exact_ranked(documents, asked, top_k)
        say(f"answered {len(queries)} queries")
        for at in range(0, len(filler), ADD_BATCH):
            collection.add(
                ids=given["filler_ids"][at : at + ADD_BATCH],
                embeddings=filler[at : at + ADD_BATCH],
                documents=given["filler_texts"][at : at + ADD_BATCH],
                metadatas=given["filler_metadatas"][at : at + ADD_BATCH],
            )
        say(f"added the top-up of {len(filler)} vectors")
        _, _, answers = timed(ask, len(queries), 1)
        result["quality_full"] = answers
        result["exact_full"] = exact_ranked(np.concatenate([documents, filler]), asked, top_k)
        points = [
            sweep_point(ask, given, run, concurrency, filtered)
            for run in range(given["runs"])
            for concurrency in given["concurrencies"]
            for filtered in (False, True)
        ]
        result["points"] = points
    output.write_text(json.dumps(result))


if __name__ == "__main__":
    main()
