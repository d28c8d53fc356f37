"""The price table (GATEWAY_PRICES): what a request costs, in the table's currency."""

from __future__ import annotations

from gateway.settings import ModelPrice
from gateway.usage.record import Usage


def format_cost(cost: float) -> str:
    """A cost as `X-Request-Cost` (and gRPC's `x-request-cost`) carry it: six decimals, the table's currency."""
    return f"{cost:.6f}"


class PriceTable:
    def __init__(self, prices: dict[str, ModelPrice]) -> None:
        self._prices = prices

    def priced(self, model: str, usage: Usage) -> tuple[Usage, bool]:
        """`usage` with its cost filled in, and whether the model has a price at all."""
        price = self._prices.get(model)
        if price is None:
            return usage, False
        cached = min(usage.cached_tokens, usage.prompt_tokens)
        cost = (
            (usage.prompt_tokens - cached) * price.input / 1e6
            + cached * price.cached / 1e6
            + usage.completion_tokens * price.output / 1e6
            + usage.embedding_tokens * price.embedding / 1e3
            + usage.rerank_tokens * price.rerank / 1e3
            + usage.video_seconds * price.video_second
        )
        return usage.with_cost(round(cost, 9)), True
