"""What the key limiters check: one limit of one subject (`Check`), and the answer when it refuses (`Refusal`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

CheckKind = Literal["rate", "tokens", "slots", "count", "budget"]


@dataclass(frozen=True)
class Check:
    """One limit of one subject. Parameters by kind: rate (a = interval µs, b = burst: the requests admitted back
    to back from idle, then one per interval); tokens (a = per minute, b = reserve); slots (a = maximum,
    b = lease id, c = lease µs); count (a = limit, b = amount, c = ttl ms); budget (a = limit,
    b = 'cost' | 'tokens', c = µs until the budget renews)."""

    kind: CheckKind
    key: str
    a: float | int
    b: float | int | str = 0
    c: int = 0


def burst(check: Check) -> int:
    """A rate check's burst: at least one (a check built without one paces evenly)."""
    return max(int(check.b), 1)


@dataclass(frozen=True)
class Refusal:
    check: Check
    wait_seconds: float
