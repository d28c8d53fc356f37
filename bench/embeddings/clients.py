"""The clients that send the embedding requests: OpenAI-compatible REST (gateway, infinity-emb) and Triton's gRPC.

Each makes a `Request` for the load generators (`bench.load`): request(i) sends the workload's request i,
checks that every vector came back and returns how many did.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import aiohttp
import numpy as np
import orjson

from bench.load import Request


class EmbeddingsError(RuntimeError):
    """A request that did not come back as the embeddings asked for."""


class RestSession(Protocol):
    async def post(self, url: str, body: bytes) -> tuple[int, bytes, dict[str, str]]: ...

    async def aclose(self) -> None: ...


class AiohttpSession:
    """aiohttp: it costs less CPU per request than httpx, and client and server share the same cores."""

    def __init__(self, concurrency: int, headers: dict[str, str] | None = None) -> None:
        connector = aiohttp.TCPConnector(limit=concurrency, limit_per_host=concurrency)
        self._session = aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=120))
        self._headers = {"Content-Type": "application/json", **(headers or {})}  # e.g. an API key

    async def post(self, url: str, body: bytes) -> tuple[int, bytes, dict[str, str]]:
        async with self._session.post(url, data=body, headers=self._headers) as response:
            return response.status, await response.read(), dict(response.headers)

    async def aclose(self) -> None:
        await self._session.close()


def openai_request(
    session: RestSession,
    url: str,
    requests: Sequence[str | list[str]],
    *,
    model: str | None = None,
    encoding_format: str | None = None,
    misses: list[int] | None = None,
) -> Request:
    """POST request i's input to an OpenAI-compatible /embeddings route; checks and counts the vectors."""
    bodies = []
    for payload in requests:
        body: dict[str, Any] = {"input": payload}
        if model:
            body["model"] = model
        if encoding_format:
            body["encoding_format"] = encoding_format
        bodies.append(orjson.dumps(body))  # encoded ahead: the client's own CPU stays out of the way

    async def send(index: int) -> int:
        payload = requests[index % len(requests)]
        status, content, headers = await session.post(url, bodies[index % len(bodies)])
        if status != 200:
            raise EmbeddingsError(f"HTTP {status}: {content[:200]!r}")
        expected = 1 if isinstance(payload, str) else len(payload)
        got = len(orjson.loads(content)["data"])
        if got != expected:
            raise EmbeddingsError(f"{got} vectors for {expected} texts")
        if misses is not None and headers.get("x-cache", headers.get("X-Cache")) != "hit":
            misses.append(index)
        return got

    return send


class TritonDirect:
    """tritonclient's asyncio gRPC client on the `bge` ensemble: TEXT as BYTES [n, 1]."""

    def __init__(self, target: str) -> None:
        import tritonclient.grpc.aio as grpcaio

        self._grpc = grpcaio
        self._client = grpcaio.InferenceServerClient(target)

    def request(self, requests: Sequence[list[str]]) -> Request:
        grpcaio = self._grpc
        arrays = [np.array([[text.encode("utf-8")] for text in texts], dtype=np.object_) for texts in requests]
        output = grpcaio.InferRequestedOutput("EMBEDDING")

        async def send(index: int) -> int:
            raw = arrays[index % len(arrays)]
            text = grpcaio.InferInput("TEXT", list(raw.shape), "BYTES")
            text.set_data_from_numpy(raw)
            result = await self._client.infer("bge", [text], outputs=[output], client_timeout=120)
            rows = int(result.as_numpy("EMBEDDING").shape[0])
            if rows != len(raw):
                raise EmbeddingsError(f"{rows} vectors for {len(raw)} texts")
            return rows

        return send

    async def aclose(self) -> None:
        await self._client.close()
