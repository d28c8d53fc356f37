"""`python -m tests.helpers.hammer SECONDS LOOPS URL...`: GET /v1/models on every URL from LOOPS concurrent loops
each, with the key in $HAMMER_KEY, for SECONDS; prints {"statuses": [...], "elapsed": s} as JSON.

A process of its own: in the test process the loops would share the GIL with whatever else runs there, and a
limit whose unclaimed slots are lost would then be measured against the client's pace, not the gateways'."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time

import httpx


async def hammer(urls: list[str], loops: int, seconds: float, key: str) -> tuple[list[int], float]:
    statuses: list[int] = []
    async with httpx.AsyncClient(timeout=30, headers={"Authorization": f"Bearer {key}"}) as client:
        started = time.monotonic()

        async def loop(url: str) -> None:
            while time.monotonic() - started < seconds:
                statuses.append((await client.get(f"{url}/v1/models")).status_code)

        await asyncio.gather(*(loop(url) for url in urls for _ in range(loops)))
        return statuses, time.monotonic() - started


def main() -> None:
    seconds, loops, *urls = sys.argv[1:]
    statuses, elapsed = asyncio.run(hammer(urls, int(loops), float(seconds), os.environ["HAMMER_KEY"]))
    print(json.dumps({"statuses": statuses, "elapsed": elapsed}))


if __name__ == "__main__":
    main()
