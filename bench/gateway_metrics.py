"""Reading the gateway's Prometheus `/metrics`: what a part counts from the gateway's side (tasks found by
polling, webhooks applied, upstream calls saved by a cache)."""

from __future__ import annotations

import aiohttp
from prometheus_client.parser import text_string_to_metric_families


async def scrape(session: aiohttp.ClientSession, base_url: str) -> str:
    async with session.get(f"{base_url}/metrics", raise_for_status=True) as response:
        return await response.text()


def metric(text: str, name: str, **labels: str) -> float:
    """Sum of the samples called `name` (with the `_total` suffix of counters) whose labels include `labels`."""
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items())
    )
