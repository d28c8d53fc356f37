"""What the keys part measures: the gateway configurations, the load and the goal; by quick where it differs."""

from __future__ import annotations

from dataclasses import dataclass

PART = "keys"
RATE = 500.0  # requests per second, open loop
SECONDS = {False: 10.0, True: 1.0}  # per configuration and round; by quick
TEXTS = 8  # distinct single-text requests, cycled: each is answered from the warm cache
GOAL_ADDED_P99_MS = 0.3
# Limits far above the load: every check runs (a GCRA step of 1 µs, a budget read), none refuses.
UNLIMITED_RPM = 60_000_000
UNLIMITED_BUDGET = 1e9
EMBEDDING_PRICE = 0.02  # per 1,000 tokens: every answer is priced, charged to the budget and recorded
TEAM = "bench"


@dataclass(frozen=True)
class Config:
    """One gateway: with keys or open, with Redis or in-process stores."""

    name: str
    keys: bool
    redis: bool


OPEN = Config("open (no keys), in process", keys=False, redis=False)
KEYS_LOCAL = Config("keys + limits + usage, in process and SQLite", keys=True, redis=False)
OPEN_REDIS = Config("open (no keys), Redis", keys=False, redis=True)
KEYS_REDIS = Config("keys + limits + usage, Redis", keys=True, redis=True)
CONFIGS = (OPEN, KEYS_LOCAL, OPEN_REDIS, KEYS_REDIS)
# (keyed, its baseline, judged against the goal): the same stores but for the keys, then the brief's plain
# difference to the in-process open gateway, which also counts the embedding cache moving to Redis.
COMPARISONS = ((KEYS_LOCAL, OPEN, True), (KEYS_REDIS, OPEN_REDIS, True), (KEYS_REDIS, OPEN, False))
