"""The cost of the gRPC call being served, sent as its trailing metadata `x-request-cost` (REST's
`X-Request-Cost`): the metered backends add what they record, the interceptor sends the sum when the call ends
well, and only when a price applied."""

from __future__ import annotations

from contextvars import ContextVar

from gateway.usage.pricing import format_cost
from gateway.usage.record import Usage

COST_TRAILER = "x-request-cost"


class CallCost:
    """What one call's usage records cost, and whether any of them had a price."""

    def __init__(self) -> None:
        self.total = 0.0
        self.priced = False

    def trailer(self) -> tuple[str, str] | None:
        return (COST_TRAILER, format_cost(self.total)) if self.priced else None


# Set by the interceptor in the call's own task (as `CURRENT_KEY`); None outside a gRPC call.
CURRENT_COST: ContextVar[CallCost | None] = ContextVar("current_call_cost", default=None)


def charge(priced: Usage, has_price: bool) -> None:
    """Add a recorded usage's cost to the call being served."""
    cost = CURRENT_COST.get()
    if cost is not None and has_price:
        cost.total += priced.cost
        cost.priced = True
