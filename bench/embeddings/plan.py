"""What the embeddings part measures: the systems (one series each), the settings swept and the workload."""

from __future__ import annotations

from dataclasses import dataclass

from bench.workload import texts as workload_texts

PART = "embeddings"
CONCURRENCIES = (1, 8, 32, 128)
BATCH = 32  # texts per request of the batched systems, rows per in-process batch
NAIVE_TEXTS = 300  # the naive loop is slow: it runs on this many of the texts
CACHE_RATE = 500.0  # requests per second of the warm-cache open loop
CACHE_SECONDS = 10.0
TARGET_CONCURRENCY = 32  # where the throughput targets are judged
P99_CONCURRENCY = 8  # where the uncached latency target is judged

# System names: one series each in the plots.
NAIVE = "sentence-transformers, encode() per text"
ST_BATCHED = "sentence-transformers, batches of 32"
ORT_INT8 = "ONNX Runtime INT8 in-process, sorted batches of 32"
GATEWAY_1 = "gateway REST, 1 text/request"
GATEWAY_32 = "gateway REST, 32 texts/request"
GATEWAY_BASE64 = "gateway REST, 1 text/request, base64"
TRITON_1 = "Triton gRPC, 1 text/request"
TRITON_32 = "Triton gRPC, 32 texts/request"
CACHED_1 = "gateway REST, warm cache, 1 text/request"
CACHED_OPEN_LOOP = f"gateway REST, warm cache, open loop {CACHE_RATE:.0f} requests/s"
INFINITY_PREFIX = "infinity-emb"


@dataclass
class Plan:
    texts: list[str]
    naive_texts: int
    concurrencies: tuple[int, ...]
    runs: int
    infinity: bool
    cache_rate: float
    cache_seconds: float

    @classmethod
    def make(cls, *, runs: int, quick: bool, infinity: bool) -> Plan:
        if quick:
            return cls(workload_texts(32), 8, (1, 8), 1, False, 100.0, 1.0)
        return cls(workload_texts(2000), NAIVE_TEXTS, CONCURRENCIES, max(runs, 1), infinity, CACHE_RATE, CACHE_SECONDS)
