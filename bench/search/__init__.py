"""Semantic search benchmarks.

- The `search` part of `make bench` (`part`, run as `python -m bench search`): ingest, quality and latency
  through the gateway's API with the real Triton, at 100,000 documents, and chromadb side by side. The modules:
  `plan` (data, sizes, goals), `api` (the gateway over HTTP), `fill` (the top-up through the gateway's store),
  `quality` (recall and MRR, exact search), `chroma` and `chroma_peer` (the peer, in its own environment),
  `report` (table, targets, notes).
- `measure` (`python -m bench.search.measure`): the embedded engines alone, in-process, which chose the default.
"""
