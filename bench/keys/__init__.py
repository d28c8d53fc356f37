"""What API keys cost per request: gateways in front of one Triton, cached embedding requests at a fixed
open-loop 500 requests/s, with and without keys, limits and the usage record, with and without Redis.

Four gateways run side by side (one Triton, each gateway's embedding cache warmed first, so that Triton is
out of the timing): open (no keys) and keyed, each with in-process state (limits in memory, keys and usage in
SQLite) and with Redis (limits, usage and the embedding cache in Redis). The keyed gateways read one key from a
keys file; the key and its team both have requests-per-minute limits and a monthly money budget, far above the
load (every check runs, none refuses), and the embedding model has a price, so every request is priced,
budget-checked and recorded. Every round measures each gateway once, in the reverse order of the round before
(drift cancels); added p50 (p99) is a keyed gateway's p50 (p99) minus the open gateway's with the same stores
in the same round, and the figure is the median over `runs` rounds.

The modules: `plan` (rate, configurations, goal), `servers` (keys file and gateways), `report` (table,
targets, notes) and `part` (the run).

    python -m bench keys [--runs 3] [--quick] [--out DIR] [--repository DIR]
"""

from __future__ import annotations

from bench.keys.part import run

__all__ = ["run"]
