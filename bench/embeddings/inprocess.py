"""The in-process systems: the naive loop, sentence-transformers batched, and the ONNX Runtime INT8 ceiling.

Each is timed on the calling thread with nothing else in flight; the INT8 one runs the graph Triton serves
with every core on one session, as Triton's `bge_onnx` does, so it is the most these cores give.
"""

from __future__ import annotations

import math
import os
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench.cpu import process_cpu_seconds, settle_heap
from bench.embeddings.plan import BATCH
from bench.embeddings.repository import max_sequence_length
from bench.padding import padded_inputs
from bench.run_stats import RunStats


class InProcess:
    """The three in-process systems, each timed on the calling thread with nothing else in flight."""

    def __init__(self, repository: Path, checkpoint_path: Path) -> None:
        import onnxruntime as ort
        from sentence_transformers import SentenceTransformer
        from tokenizers import Tokenizer

        cores = len(os.sched_getaffinity(0))
        options = ort.SessionOptions()
        options.intra_op_num_threads = cores  # as Triton's bge_onnx: every core to one session
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        model = repository / "bge_onnx" / "1" / "model_int8.onnx"
        self._session = ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
        self._tokenizer = Tokenizer.from_file(str(repository / "bge_tokenizer" / "1" / "tokenizer.json"))
        self._tokenizer.no_padding()
        self._tokenizer.enable_truncation(max_sequence_length(repository))
        self._pad_id = self._tokenizer.token_to_id("[PAD]") or 0
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self._model = SentenceTransformer(str(checkpoint_path), device="cpu")

    def naive(self, texts: Sequence[str]) -> RunStats:
        """`encode(text)` once per text: what a service does before it batches anything."""
        return self._timed(texts, [[text] for text in texts], lambda chunk: self._model.encode(chunk[0]))

    def st_batched(self, texts: Sequence[str]) -> RunStats:
        """`encode(texts, batch_size=32)`: sentence-transformers sorts by length and batches itself."""
        stats = self._timed(texts, [list(texts)], lambda chunk: self._model.encode(chunk, batch_size=BATCH))
        # One call: each batch's latency is taken as its share of the total.
        stats.latencies = [stats.elapsed * BATCH / max(len(texts), 1)] * math.ceil(len(texts) / BATCH)
        return stats

    def ort_int8(self, texts: Sequence[str]) -> RunStats:
        """Tokenise all, sort by token length, run the INT8 graph 32 rows at a time: the ceiling."""
        settle_heap()
        cpu = process_cpu_seconds()
        started = time.perf_counter()
        encodings = self._tokenizer.encode_batch(list(texts))
        order = sorted(range(len(texts)), key=lambda i: len(encodings[i].ids))
        latencies = []
        for start in range(0, len(order), BATCH):
            began = time.perf_counter()
            rows = [encodings[i].ids for i in order[start : start + BATCH]]
            self._session.run(["EMBEDDING"], padded_inputs(rows, self._pad_id))
            latencies.append(time.perf_counter() - began)
        elapsed = time.perf_counter() - started
        return RunStats(elapsed, latencies, 0, len(texts), process_cpu_seconds() - cpu)

    @staticmethod
    def _timed(texts: Sequence[str], chunks: list[list[str]], run: Callable[[list[str]], Any]) -> RunStats:
        settle_heap()
        cpu = process_cpu_seconds()
        started = time.perf_counter()
        latencies = []
        for chunk in chunks:
            began = time.perf_counter()
            run(chunk)
            latencies.append(time.perf_counter() - began)
        elapsed = time.perf_counter() - started
        return RunStats(elapsed, latencies, 0, len(texts), process_cpu_seconds() - cpu)
