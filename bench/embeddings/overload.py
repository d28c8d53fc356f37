"""Uncached embeddings offered at 4 x the model's capacity, measured in the same run: with the model's queues
bounded (the gateway's by TRITON_MAX_QUEUE_SECONDS, Triton's by its queue policy), each request is either answered
within its goal or refused at once with 429 and Retry-After, and none waits out its deadline.

An open loop: requests start on schedule whatever the answers do (a closed loop would slow down with the server
and never overload it), each of unique texts, so that no cache answers them; a latency counts from the scheduled
start, so a late load generator counts against the gateway, not for it.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import aiohttp
import orjson

from bench.results import Target
from bench.run_stats import percentile
from gateway.settings import TritonSettings

FACTOR = 4.0  # offered texts per second over the capacity measured in the same run
TEXTS_PER_REQUEST = 8
REFUSED_P99_LIMIT_MS = 10.0
# An answered request waited behind at most TRITON_MAX_QUEUE_SECONDS' default of encoding, then for its own call,
# which texts queued after it may fill to the model's max batch; the bound is judged at the encoder's pace of the
# last calls, which trails a slowing encoder: one full call more. Both calls at the capacity measured in the run.
MAX_QUEUE_SECONDS: float = TritonSettings.model_fields["max_queue_seconds"].default
FULL_CALL_TEXTS = 256
DEADLINE_SECONDS = 60.0  # the gateway's request deadline (GATEWAY_REQUEST_TIMEOUT_SECONDS)


@dataclass
class Overload:
    capacity: float  # texts/s the gateway served at best in this run
    seconds: float
    answered: list[float] = field(default_factory=list)  # latencies, s
    refused: list[float] = field(default_factory=list)
    refused_without_retry_after: int = 0
    others: Counter[str] = field(default_factory=Counter)  # any other outcome: status or exception name

    @property
    def offered(self) -> float:
        return FACTOR * self.capacity

    @property
    def answered_limit_ms(self) -> float:
        return (MAX_QUEUE_SECONDS + 2 * FULL_CALL_TEXTS / self.capacity) * 1000

    def targets(self) -> list[Target]:
        load = f"uncached, {TEXTS_PER_REQUEST} texts/request, open loop at {FACTOR:g} x capacity"
        answered = percentile(self.answered, 99) * 1000 if self.answered else float("inf")
        refused = percentile(self.refused, 99) * 1000 if self.refused else float("inf")
        return [
            Target(
                f"embeddings at {load}: p99 of the answered",
                f"<= TRITON_MAX_QUEUE_SECONDS + 2 calls of {FULL_CALL_TEXTS} texts = {self.answered_limit_ms:.0f} ms",
                f"{answered:.0f} ms ({len(self.answered)} answered)",
                answered <= self.answered_limit_ms,
            ),
            Target(
                f"embeddings at {load}: p99 of the refused (429 + Retry-After)",
                f"<= {REFUSED_P99_LIMIT_MS:g} ms",
                f"{refused:.1f} ms ({len(self.refused)} refused, "
                f"{self.refused_without_retry_after} without Retry-After)",
                refused <= REFUSED_P99_LIMIT_MS and self.refused_without_retry_after == 0,
            ),
            Target(
                f"embeddings at {load}: requests that waited out their deadline or failed otherwise",
                "0",
                str(sum(self.others.values())) + (f" ({dict(self.others)})" if self.others else ""),
                not self.others,
            ),
        ]

    def note(self) -> str:
        sent = len(self.answered) + len(self.refused) + sum(self.others.values())
        return (
            f"overload: {sent} requests of {TEXTS_PER_REQUEST} unique texts in {self.seconds:g} s, offered "
            f"{self.offered:.0f} texts/s = {FACTOR:g} x the {self.capacity:.0f} texts/s the gateway served at best "
            f"in this run; {len(self.answered)} answered ({len(self.answered) * TEXTS_PER_REQUEST / self.seconds:.0f} "
            f"texts/s), {len(self.refused)} refused"
        )


async def overload(url: str, texts: Sequence[str], capacity: float, seconds: float) -> Overload:
    """Requests of `TEXTS_PER_REQUEST` unique texts to the gateway's /v1/embeddings `url`, started at
    `FACTOR` x `capacity` texts per second for `seconds`."""
    result = Overload(capacity, seconds)
    rate = result.offered / TEXTS_PER_REQUEST
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=DEADLINE_SECONDS + 5)
    headers = {"Content-Type": "application/json", "Cache-Control": "no-cache"}
    async with aiohttp.ClientSession(connector=connector, timeout=timeout, headers=headers) as session:

        async def send(index: int, scheduled: float) -> None:
            first = index * TEXTS_PER_REQUEST
            chosen = [f"{index}.{n} {texts[(first + n) % len(texts)]}" for n in range(TEXTS_PER_REQUEST)]
            try:
                async with session.post(url, data=orjson.dumps({"input": chosen})) as response:
                    await response.read()
                    status, retry_after = response.status, response.headers.get("Retry-After")
            except (aiohttp.ClientError, TimeoutError) as exc:
                result.others[type(exc).__name__] += 1
                return
            latency = time.perf_counter() - scheduled
            if status == 200:
                result.answered.append(latency)
            elif status == 429:
                result.refused.append(latency)
                result.refused_without_retry_after += retry_after is None
            else:
                result.others[str(status)] += 1

        started = time.perf_counter()
        tasks = []
        for index in range(int(rate * seconds)):
            scheduled = started + index / rate
            delay = scheduled - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(send(index, scheduled)))
        await asyncio.gather(*tasks)
    return result
