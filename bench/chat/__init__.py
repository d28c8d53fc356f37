"""Chat proxy cost: the gateway in front of the Hunyuan simulator, against the bare simulator and LiteLLM.

All systems run in one session against the same simulators; every round runs each system once, in an
order rotated by one per round, and each figure is the median over `runs` rounds.

- Added time to first token: streamed requests, timed at the client to the first chunk with content,
  through a proxy minus straight to the simulator at the same concurrency. The simulator's own TTFT is
  fixed (50 ms), so the difference is the proxy's cost. Added p50 (p99) is the proxy's p50 (p99) minus
  the bare simulator's p50 (p99) of the same round: a difference of percentiles, not a percentile of
  differences.
- Requests per second: small non-streamed completions against an unpaced simulator, closed loop at each
  concurrency; uncached (every prompt unique, exact cache off) for every system, and exact-cache hits for
  the gateway (one request repeated, cache on). Semantic cache off throughout.
- Concurrent streams held: N streams (1,000) opened at once, each lasting about 10 s; how many end with
  [DONE] and no error event, how many were open at the same moment, and their added TTFT against the bare
  simulator under the same burst.

The modules: `plan` (systems, pacing, load sizes), `routes` (the ways to a simulator), `clients` (one request
and what it tells), `litellm` (the peer), `servers` (start and stop them all), `loads` (runs, sweeps, bursts,
rounds), `report` (points, table, targets, notes) and `part` (the run).

    python -m bench chat [--runs 3] [--quick] [--out DIR]
"""

from __future__ import annotations

from bench.chat.part import run

__all__ = ["run"]
