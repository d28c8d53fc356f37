"""Embeddings part of `make bench`: texts per second and latency of each way to embed the same texts.

One workload (`bench.workload.texts`: 2,000 English and Chinese texts of 5 to 60 words) and one
checkpoint (the one the model repository was exported from) for every system:

- in this process: the naive loop (sentence-transformers `encode(text)` once per text, on a subset),
  sentence-transformers batched (32), and ONNX Runtime on the exported INT8 graph in length-sorted
  batches of 16, 32 and 64, each both as one call on every core and as `bge_onnx` runs it (single-threaded
  runs side by side): the fastest is the ceiling of these cores, the reference of every ratio; and the
  tokenizer stage alone, on coalesced batches and per request (`inprocess`);
- this project: the REST gateway (1 and 32 texts a request), Triton's gRPC endpoint straight
  (the same two shapes), and the gateway answering from a warm embedding cache, at concurrency
  1, 8, 32 and 128; the cache also under an open loop of 500 requests/s, for its latency target
  (`clients`, `loads`);
- infinity-emb (own virtual environment) on the same checkpoint, with each engine that starts here
  (`infinity`).

The systems alternate within each round (round 1: all of them, round 2: all again...) and every
figure is the median over the rounds (`part`); a target is judged on the worst round, so it is met only
when every round meets it. Each row carries the CPU the client, the servers and the
rest of the machine used meanwhile (`bench.cpu`), since on a 2-core machine the load generator and
anything else running compete with the servers for the same cores. `report` makes the part's table,
targets and notes.

    python -m bench embeddings [--runs 3] [--quick] [--out DIR] [--repository DIR] [--model DIR_OR_ID] [--no-infinity]
"""

from __future__ import annotations

from bench.embeddings.part import run

__all__ = ["run"]
