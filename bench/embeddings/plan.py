"""What the embeddings part measures: the systems (one series each), the settings swept and the workload."""

from __future__ import annotations

from dataclasses import dataclass

from bench.workload import texts as workload_texts

PART = "embeddings"
CONCURRENCIES = (1, 8, 32, 128)
BATCH = 32  # texts per request of the batched systems, rows per in-process batch
CEILING_BATCHES = (16, 32, 64, 128, 256)  # rows per batch of each in-process INT8 configuration, up to the max batch
NAIVE_TEXTS = 300  # the naive loop is slow: it runs on this many of the texts
CACHE_RATE = 500.0  # requests per second of the warm-cache open loop
CACHE_SECONDS = 10.0
OVERLOAD_SECONDS = 20.0  # of uncached requests at 4 x the capacity (bench.embeddings.overload)
TARGET_CONCURRENCY = 32  # where the throughput targets are judged
P99_CONCURRENCY = 8  # where the uncached latency target is judged

# System names: one series each in the plots.
NAIVE = "sentence-transformers, encode() per text"
ST_BATCHED = "sentence-transformers, batches of 32"
ORT_ONE_CALL = "ONNX Runtime INT8 in-process, sorted batches of {batch}"  # one call on every core per batch
ORT_SIDE_BY_SIDE = "ONNX Runtime INT8 in-process, single-threaded runs side by side, sorted batches of {batch}"
# bge_onnx's encoder as served (its own pieces), on batches in the order the texts come, as a server's calls
# carry them: what the encoder alone makes of the batches the stack gives it, with no server around it.
ORT_ARRIVAL = "ONNX Runtime INT8 in-process, bge_onnx's encoder as served, batches of {batch} in arrival order"
ORT_INT8 = ORT_ONE_CALL.format(batch=BATCH)  # the old ceiling: its ratios stay beside the best one's
GATEWAY_1 = "gateway REST, 1 text/request"
GATEWAY_32 = "gateway REST, 32 texts/request"
GATEWAY_BASE64 = "gateway REST, 1 text/request, base64"
TRITON_1 = "Triton gRPC, 1 text/request"
TRITON_32 = "Triton gRPC, 32 texts/request"
TOKENIZE_COALESCED = "tokenizer in-process: Rust tokenizers on coalesced batches of 32"
TOKENIZE_PER_REQUEST = "tokenizer in-process: per 1-text request, as bge_tokenizer"
CACHED_1 = "gateway REST, warm cache, 1 text/request"
CACHED_OPEN_LOOP = f"gateway REST, warm cache, open loop {CACHE_RATE:.0f} requests/s"
INFINITY_PREFIX = "infinity-emb"


def ceiling_systems() -> list[str]:
    """Every in-process INT8 configuration, one series each; the fastest is the ceiling of the ratios."""
    return [name.format(batch=batch) for name in (ORT_ONE_CALL, ORT_SIDE_BY_SIDE) for batch in CEILING_BATCHES]


def arrival_systems() -> list[str]:
    """The served encoder alone on unsorted batches, one series per batch size: a bound, not a ceiling."""
    return [ORT_ARRIVAL.format(batch=batch) for batch in CEILING_BATCHES]


@dataclass
class Plan:
    texts: list[str]
    naive_texts: int
    concurrencies: tuple[int, ...]
    runs: int
    infinity: bool
    cache_rate: float
    cache_seconds: float
    overload_seconds: float = OVERLOAD_SECONDS

    @classmethod
    def make(cls, *, runs: int, quick: bool, infinity: bool) -> Plan:
        if quick:
            return cls(workload_texts(32), 8, (1, 8), 1, False, 100.0, 1.0, 2.0)
        return cls(workload_texts(2000), NAIVE_TEXTS, CONCURRENCIES, max(runs, 1), infinity, CACHE_RATE, CACHE_SECONDS)
