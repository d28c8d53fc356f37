"""The cost of the request being served: the billed services (`gateway.billing`) add what they record; the
transport sends the sum, only when a price applied: REST as the header `X-Request-Cost` (the key middleware),
gRPC as the trailing metadata `x-request-cost` when the call ends well (the interceptor)."""

from __future__ import annotations

from contextvars import ContextVar

from gateway.usage.pricing import format_cost
from gateway.usage.record import Usage

COST_HEADER = "x-request-cost"


class CallCost:
    """What one call's usage records cost, and whether any of them had a price."""

    def __init__(self) -> None:
        self.total = 0.0
        self.priced = False

    def header(self) -> tuple[str, str] | None:
        return (COST_HEADER, format_cost(self.total)) if self.priced else None


# Set by the transport in the request's own task (as `CURRENT_KEY`); None outside a request.
CURRENT_COST: ContextVar[CallCost | None] = ContextVar("current_call_cost", default=None)


def charge(priced: Usage, has_price: bool) -> None:
    """Add a recorded usage's cost to the request being served."""
    cost = CURRENT_COST.get()
    if cost is not None and has_price:
        cost.total += priced.cost
        cost.priced = True
