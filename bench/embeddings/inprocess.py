"""The in-process systems: the naive loop, sentence-transformers batched, the ONNX Runtime INT8 configurations
whose fastest is the ceiling, and the tokenizer stage alone.

Each is timed on the calling thread with nothing else in flight. The INT8 graph Triton serves runs in two
configurations, each over the same texts sorted once by token length and cut into batches of 16, 32 or 64
rows: one call per batch with every core on one session (`ort_one_call`), and `bge_onnx`'s own way, its
`encoder` module (`ort_side_by_side`): one single-threaded run per core, side by side, over the batch's chunks of
similar length, in the pieces that suit a process alone. The fastest of them is the most these cores give.

A third configuration is a bound, not a ceiling: `bge_onnx`'s encoder as served, on batches in the order the
texts come (`ort_arrival_order`), the batches a server's calls carry: what the encoder alone makes of them.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from bench.cpu import process_cpu_seconds, settle_heap
from bench.embeddings.plan import BATCH, CEILING_BATCHES
from bench.embeddings.repository import max_sequence_length, model_module
from bench.padding import Int64Array, padded_inputs
from bench.run_stats import RunStats

# `bge_onnx` cuts a batch into more pieces per worker, which balance runs that other processes preempt;
# with the cores to itself the encoder does best with fewer, larger runs (docs/benchmarks.md).
IN_PROCESS_PIECES = 3


class InProcess:
    """The in-process systems, each timed on the calling thread with nothing else in flight."""

    def __init__(self, repository: Path, checkpoint_path: Path) -> None:
        from sentence_transformers import SentenceTransformer
        from tokenizers import Tokenizer

        model = repository / "bge_onnx" / "1" / "model_int8.onnx"
        self._encoder = model_module(repository, "bge_onnx", "encoder")
        # bge_onnx's own session options either way: one call on every core (spinning, onnxruntime's default,
        # as this configuration always ran), and its default plan, single-threaded runs side by side, one per core.
        one_call = self._encoder.plan_session("CPU", 0, {"parallel_runs": "1", "allow_spinning": "true"}, "", 1)
        self._session = self._encoder.create_session(str(model), one_call)
        plan = self._encoder.plan_session("CPU", 0, {}, "", 1)
        self._single = self._encoder.create_session(str(model), plan)
        self._workers: int = plan.parallel_runs
        self._executor = ThreadPoolExecutor(self._workers, "bench-bge_onnx-run") if self._workers > 1 else None
        tokenizer_file = repository / "bge_tokenizer" / "1" / "tokenizer.json"
        self._tokenizer = Tokenizer.from_file(str(tokenizer_file))
        self._tokenizer.no_padding()
        self._tokenizer.enable_truncation(max_sequence_length(repository))
        self._pad_id = self._tokenizer.token_to_id("[PAD]") or 0
        tokenization = model_module(repository, "bge_tokenizer", "tokenization")
        self._text_tokenizer = tokenization.TextTokenizer(str(tokenizer_file), max_sequence_length(repository))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self._model = SentenceTransformer(str(checkpoint_path), device="cpu")

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True)

    def warm_up(self, texts: Sequence[str]) -> None:
        """Each INT8 configuration once, untimed: a session's first runs grow its memory arena and threads."""
        for batch in CEILING_BATCHES:
            self.ort_one_call(texts, batch)
            self.ort_side_by_side(texts, batch)
            self.ort_arrival_order(texts, batch)

    def naive(self, texts: Sequence[str]) -> RunStats:
        """`encode(text)` once per text: what a service does before it batches anything."""
        return self._timed(texts, [[text] for text in texts], lambda chunk: self._model.encode(chunk[0]))

    def st_batched(self, texts: Sequence[str]) -> RunStats:
        """`encode(texts, batch_size=32)`: sentence-transformers sorts by length and batches itself."""
        stats = self._timed(texts, [list(texts)], lambda chunk: self._model.encode(chunk, batch_size=BATCH))
        # One call: each batch's latency is taken as its share of the total.
        stats.latencies = [stats.elapsed * BATCH / max(len(texts), 1)] * math.ceil(len(texts) / BATCH)
        return stats

    def ort_one_call(self, texts: Sequence[str], batch: int) -> RunStats:
        """The INT8 graph, one call on every core per sorted batch of `batch` rows."""
        return self._batches(texts, batch, lambda inputs: self._session.run(["EMBEDDING"], inputs), sort=True)

    def ort_side_by_side(self, texts: Sequence[str], batch: int) -> RunStats:
        """The INT8 graph as `bge_onnx` runs a dynamic batch of `batch` rows: `encoder.encode_by_length`, its
        chunks of similar length on single-threaded runs side by side, one per core. In pieces of the size
        that does best alone in a process (`IN_PROCESS_PIECES`), so the reference is the encoder at its best
        rather than as tuned for cores it shares."""
        return self._batches(texts, batch, self._encode_by_length(IN_PROCESS_PIECES), sort=True)

    def ort_arrival_order(self, texts: Sequence[str], batch: int) -> RunStats:
        """`bge_onnx`'s encoder exactly as served (its own pieces per worker) on batches of `batch` texts in the
        order they come, as the served calls carry them: the encoder sorts within each batch, never across."""
        return self._batches(texts, batch, self._encode_by_length(self._encoder.PIECES_PER_WORKER), sort=False)

    def _encode_by_length(self, pieces: int) -> Callable[[dict[str, Int64Array]], Any]:
        def run(inputs: dict[str, Int64Array]) -> Any:
            ids, mask = [inputs["INPUT_IDS"]], [inputs["ATTENTION_MASK"]]
            padding = self._encoder.PADDING_RATIO
            return self._encoder.encode_by_length(
                self._run_single, ids, mask, padding, self._executor, self._workers, pieces
            )

        return run

    def tokenize_coalesced(self, texts: Sequence[str]) -> RunStats:
        """The tokenizer stage as the gateway could run it: the Rust tokenizer over a coalesced batch of 32 texts
        in one call, packed into one padded array (`bge_tokenizer`'s own `TextTokenizer`)."""
        chunks = [list(texts[start : start + BATCH]) for start in range(0, len(texts), BATCH)]
        return self._timed(texts, chunks, self._tokenize)

    def tokenize_per_request(self, texts: Sequence[str]) -> RunStats:
        """The tokenizer stage per 1-text request, as `bge_tokenizer` packs each request: one encode and one
        pack per text (the python backend's IPC is not in it; the served CPU account has it)."""
        return self._timed(texts, [[text] for text in texts], self._tokenize)

    def _tokenize(self, chunk: list[str]) -> Any:
        return self._text_tokenizer.pack(self._text_tokenizer.encode(chunk))

    def _run_single(self, input_ids: Int64Array, attention_mask: Int64Array) -> npt.NDArray[np.float32]:
        (embeddings,) = self._single.run(None, {"INPUT_IDS": input_ids, "ATTENTION_MASK": attention_mask})
        return np.asarray(embeddings, dtype=np.float32)

    def _batches(
        self, texts: Sequence[str], batch: int, run: Callable[[dict[str, Int64Array]], Any], *, sort: bool
    ) -> RunStats:
        """Tokenise all, sort by token length if `sort`, `run` each batch of `batch` rows, padded to its longest."""
        settle_heap()
        cpu = process_cpu_seconds()
        started = time.perf_counter()
        encodings = self._tokenizer.encode_batch(list(texts))
        order = sorted(range(len(texts)), key=lambda i: len(encodings[i].ids)) if sort else range(len(texts))
        latencies = []
        for start in range(0, len(order), batch):
            began = time.perf_counter()
            run(padded_inputs([encodings[i].ids for i in order[start : start + batch]], self._pad_id))
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
