"""The gateway's Triton channel is replaced once it is TRITON_CHANNEL_MAX_AGE_SECONDS old (a new DNS resolution),
against the real Triton: no call is cut, replaced channels are closed, 0 never replaces."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
import tritonclient.grpc.aio as grpcaio

from gateway.settings import TritonSettings
from gateway.upstreams.triton import CHANNEL_ARGS, TritonClient
from gateway.upstreams.triton_channels import AgingClient
from localtriton.server import TritonProcess

pytestmark = pytest.mark.slow

WORKERS = 8  # concurrent callers: a replacement always finds calls in flight on the old channel
REPLACEMENTS = 4


def connections_to(port: int) -> int:
    """TCP connections this process holds open to `port` (its sockets in /proc/net/tcp, established)."""
    sockets = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue  # closed meanwhile
        if target.startswith("socket:["):
            sockets.add(target[len("socket:[") : -1])
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            remote_port, state, inode = int(fields[2].rsplit(":", 1)[1], 16), fields[3], fields[9]
            count += remote_port == port and state == "01" and inode in sockets
    return count


async def settled_connections(port: int, expected: int) -> int:
    """The connection count once gRPC's threads have closed the sockets of closed channels (at most ~5 s)."""
    for _ in range(100):
        if (count := connections_to(port)) == expected:
            return count
        await asyncio.sleep(0.05)
    return connections_to(port)


class CountingOpener:
    """Opens real tritonclients and counts them."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.opened = 0

    def __call__(self, address: str | None = None) -> grpcaio.InferenceServerClient:
        assert address in (None, self.url)
        self.opened += 1
        return grpcaio.InferenceServerClient(self.url, channel_args=CHANNEL_ARGS)


async def steady_stream(client: TritonClient, opener: CountingOpener, *, until_opened: int, calls: int) -> int:
    """Embedding calls from WORKERS callers until `opener` has opened `until_opened` clients or `calls` are made;
    every call must succeed. Returns the most channels seen open at once."""
    made, most_open = 0, 1

    async def worker(n: int) -> None:
        nonlocal made, most_open
        while opener.opened < until_opened and made < calls:
            made += 1
            result = await client.embed([f"caller {n} sentence {made}", "a second text in the same call"])
            assert result.vectors.shape[0] == 2 and result.token_counts.min() > 0
            most_open = max(most_open, client.open_channels)

    await asyncio.gather(*(worker(n) for n in range(WORKERS)))
    return most_open


async def test_an_aged_channel_is_replaced_under_load_without_failing_a_call_or_leaking(triton: TritonProcess) -> None:
    opener = CountingOpener(triton.grpc_url)
    settings = TritonSettings(url=triton.grpc_url, channel_max_age_seconds=0.05)
    async with TritonClient(settings, opener) as client:
        most_open = await steady_stream(client, opener, until_opened=1 + REPLACEMENTS, calls=5000)
        assert opener.opened >= 1 + REPLACEMENTS, "the channel was replaced while calls kept coming"
        assert most_open >= 2, "a replaced channel stayed open for the calls still in flight on it"
        assert client.open_channels == 1, "and was closed when they ended"
        assert await settled_connections(triton.grpc_port, 1) == 1, "replaced channels' connections closed"
    assert await settled_connections(triton.grpc_port, 0) == 0


async def test_a_call_in_flight_finishes_on_the_channel_it_started_on(triton: TritonProcess) -> None:
    opener = CountingOpener(triton.grpc_url)
    clients = AgingClient(opener, max_age_seconds=0.01)
    with clients.lease() as old:
        await asyncio.sleep(0.02)  # the channel is now older than its max age
        with clients.lease() as new:
            assert new is not old and opener.opened == 2
            assert await old.is_server_live(), "the replaced channel still serves the call that holds it"
            assert await new.is_server_live()
            assert clients.open_clients == 2
    assert clients.open_clients == 1
    assert await settled_connections(triton.grpc_port, 1) == 1, "the old channel closed once its call ended"
    await clients.aclose()
    assert await settled_connections(triton.grpc_port, 0) == 0


async def test_max_age_zero_keeps_one_channel(triton: TritonProcess) -> None:
    opener = CountingOpener(triton.grpc_url)
    settings = TritonSettings(url=triton.grpc_url, channel_max_age_seconds=0)
    async with TritonClient(settings, opener) as client:
        most_open = await steady_stream(client, opener, until_opened=2, calls=200)
        assert opener.opened == 1 and most_open == 1
        assert await settled_connections(triton.grpc_port, 1) == 1
