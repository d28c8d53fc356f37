"""The client side of a chat load: one request through a route (`Probe`), an answer read to its end, and
what a single latency cannot say (time to first byte and to the first answer token, streams open at once,
cache hits, failures)."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import AsyncIterator
from typing import NamedTuple

import aiohttp

from bench.chat.routes import Route


class AnswerError(Exception):
    """An answer that is not a complete, error-free completion."""


class StreamTimes(NamedTuple):
    """Seconds from sending a streamed request to its first event (the first byte of the body: the role chunk,
    before any reasoning) and to its first answer token (the first content; a reasoning model thinks first)."""

    first_byte: float
    first_answer: float


class Probe:
    """Sends one kind of request through a route and records what a single latency cannot say."""

    def __init__(self, client: aiohttp.ClientSession, route: Route) -> None:
        self.client = client
        self.route = route
        self.url = f"{route.base_url}/chat/completions"
        self.headers = dict(route.headers)
        self.ttfbs: list[float] = []  # seconds to the first event, completed streams only
        self.ttfts: list[float] = []  # seconds to the first content chunk, completed streams only
        self.open = self.peak_open = self.hits = 0
        self.failures: Counter[str] = Counter()

    async def complete(self, index: int) -> int:
        try:
            async with self.client.post(self.url, json=self.route.body(stream=False), headers=self.headers) as response:
                body = await response.read()
                if response.status != 200:
                    raise AnswerError(f"status {response.status}: {body[:200]!r}")
        except Exception as exc:
            self.failures[failure_reason(exc)] += 1
            raise
        self.hits += response.headers.get("x-cache") == "hit"
        return 1

    async def stream(self, index: int) -> int:
        body = self.route.body(stream=True)
        started = time.perf_counter()
        try:
            async with self.client.post(self.url, json=body, headers=self.headers) as response:
                if response.status != 200:
                    raise AnswerError(f"status {response.status}: {(await response.read())[:200]!r}")
                self.open += 1
                self.peak_open = max(self.peak_open, self.open)
                try:
                    times = await stream_times(decoded_lines(response), started)
                finally:
                    self.open -= 1
        except Exception as exc:
            self.failures[failure_reason(exc)] += 1
            raise
        self.ttfbs.append(times.first_byte)
        self.ttfts.append(times.first_answer)
        return 1


async def decoded_lines(response: aiohttp.ClientResponse) -> AsyncIterator[str]:
    async for line in response.content:
        yield line.decode("utf-8")


async def stream_times(lines: AsyncIterator[str], started: float) -> StreamTimes:
    """Read an SSE stream to [DONE]; the times from `started` to the first event and to the first content."""
    first_byte: float | None = None
    first_answer: float | None = None
    async for line in lines:
        if not line.startswith("data:"):
            continue
        if first_byte is None:
            first_byte = time.perf_counter() - started
        data = line[5:].strip()
        if data == "[DONE]":
            if first_answer is None:
                raise AnswerError("stream ended without content")
            return StreamTimes(first_byte, first_answer)
        chunk = json.loads(data)
        if "error" in chunk:
            raise AnswerError(f"error event: {str(chunk['error'])[:200]}")
        if first_answer is None and any(c.get("delta", {}).get("content") for c in chunk.get("choices", [])):
            first_answer = time.perf_counter() - started
    raise AnswerError("stream ended without [DONE]")


def failure_reason(exc: Exception) -> str:
    """A failure's key in the notes' counts: its type and message, bounded."""
    return f"{type(exc).__name__}: {exc}"[:160]
