"""The Tritons behind `TRITON_URL`: one channel per address, resolved by the gateway, and which of them get calls.

gRPC's own balancing over one channel cannot fail over: a Triton that is shutting down keeps its port open and
answers every call with an error (`unknown model`, `stopped accepting new inference requests`), so round robin keeps
sending it half the calls until it exits, and a call that fails there is not tried on the other Triton. The gateway
therefore resolves `TRITON_URL` itself and keeps one channel per address:

- `ipv4:a:p,b:p` (and `ipv6:`) is a fixed list; `dns:///host:port` or `host:port` is resolved with the system's
  resolver (IPv4 first, as a headless Service answers), again every `TRITON_CHANNEL_MAX_AGE_SECONDS` and at once
  when a call fails, so that a replacement pod gets calls within a second; any other target is one channel left to
  gRPC's own resolver.
- An address whose call failed as unavailable is out of rotation until a readiness probe (every
  `PROBE_INTERVAL_SECONDS`) finds the model ready on it again; while every address is out, calls still go to them
  (a Triton that came back is found by the call itself). Only an answer to a call sent after the outage began
  counts: a stopping Triton still answers the calls it had taken, and those say nothing about its next one.
- An address gone from the resolution gets no new calls; its channel is closed once its calls end.
- Among the addresses in rotation, a call goes to those `rank` puts lowest: the GPU policy (`gateway.gpu`) ranks a
  Triton whose GPU is hot or short of memory above the others, so that its calls go elsewhere while it recovers.

Each address's outage is logged once when it starts (WARNING) and once when it ends (INFO).
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import itertools
import logging
import socket
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import tritonclient.grpc.aio as grpcaio

from gateway import metrics
from gateway.upstreams.triton_channels import AgingClient

log = logging.getLogger("gateway.upstreams.triton")

PROBE_INTERVAL_SECONDS = 0.25  # how often an address out of rotation is asked whether the model is ready again
RESOLVE_AFTER_FAILURE_SECONDS = 1.0  # at most one resolution a second on failures (a burst fails together)

Resolver = Callable[[str, int], Awaitable[list[str]]]
Rank = Callable[[str, bool], int]  # (address, a call of several texts) -> how much calls should avoid it; 0: not at all


@dataclass(frozen=True)
class TritonTarget:
    """What `TRITON_URL` names: fixed addresses, or a host name and port to resolve."""

    addresses: tuple[str, ...] = ()
    host: str = ""
    port: int = 0

    @property
    def resolved_by_gateway(self) -> bool:
        return bool(self.host)

    @classmethod
    def parse(cls, url: str) -> TritonTarget:
        if url.startswith(("ipv4:", "ipv6:")):
            return cls(addresses=tuple(a.strip() for a in url[5:].split(",") if a.strip()))
        if url.startswith("dns:"):
            name = url.removeprefix("dns:")
            if name.startswith("//"):  # dns://[authority]/host:port
                name = name[2:].partition("/")[2]
        elif url.startswith("unix:") or "/" in url:
            return cls(addresses=(url,))
        else:
            name = url
        host, _, port = name.rpartition(":")
        if not host or not port.isdigit():
            return cls(addresses=(url,))  # no port: gRPC's resolver and default port, one channel
        if is_ip(host.strip("[]")):
            return cls(addresses=(name,))
        return cls(host=host, port=int(port))


def is_ip(host: str) -> bool:
    """Whether `host` is an IP address (unbracketed), not a name to resolve."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


async def resolve_host(host: str, port: int) -> list[str]:
    """`host`'s addresses as `ip:port`, IPv4 ones if it has any (in the resolver's order, without repeats)."""
    loop = asyncio.get_running_loop()
    for family in (socket.AF_INET, socket.AF_INET6):
        try:
            infos = await loop.getaddrinfo(host, port, family=family, type=socket.SOCK_STREAM)
        except socket.gaierror:
            continue
        ips = dict.fromkeys(str(info[4][0]) for info in infos)
        if ips:
            return [f"{ip}:{port}" if family == socket.AF_INET else f"[{ip}]:{port}" for ip in ips]
    return []


@dataclass(eq=False)
class TritonEndpoint:
    """One Triton address, its channel, and whether it gets calls."""

    address: str
    clients: AgingClient
    serving: bool = True
    outages: int = 0  # begun so far; a call's answer counts for rotation only if none began while it ran
    probe: asyncio.Task[None] | None = field(default=None, repr=False)

    @contextmanager
    def lease(self) -> Iterator[grpcaio.InferenceServerClient]:
        with self.clients.lease() as client:
            yield client


class TritonEndpoints:
    """The addresses calls go to, round robin over those in rotation."""

    def __init__(
        self,
        url: str,
        open_client: Callable[[str], grpcaio.InferenceServerClient],
        *,
        model: str,
        max_age_seconds: float,
        probe_timeout_seconds: float,
        resolve: Resolver = resolve_host,
        rank: Rank | None = None,
    ) -> None:
        self._target = TritonTarget.parse(url)
        self._rank = rank
        self._open_client = open_client
        self._model = model
        self._max_age = max_age_seconds
        self._probe_timeout = probe_timeout_seconds
        self._resolve = resolve
        self._endpoints: dict[str, TritonEndpoint] = {}
        self._turn = itertools.count()
        self._resolved_at = -float("inf")
        self._resolved_on_failure_at = -float("inf")
        self._resolving: asyncio.Task[None] | None = None
        self._closed = False
        if not self._target.resolved_by_gateway:
            self._apply(list(self._target.addresses))

    @property
    def addresses(self) -> list[str]:
        return list(self._endpoints)

    async def pick(
        self, exclude: TritonEndpoint | None = None, *, bulk: bool = False, serving_only: bool = False
    ) -> TritonEndpoint | None:
        """The next address for a call (none but `exclude` in rotation: one out of rotation, or with `serving_only`
        None; none at all: None), among those `rank` puts lowest for a call of one text or, `bulk`, of several."""
        await self._resolve_if_due()
        candidates = [e for e in self._endpoints.values() if e is not exclude]
        in_rotation = [e for e in candidates if e.serving]
        if not in_rotation and not serving_only:
            in_rotation = candidates
        if not in_rotation:
            return None
        if self._rank is not None and len(in_rotation) > 1:
            ranks = {e.address: self._rank(e.address, bulk) for e in in_rotation}
            lowest = min(ranks.values())
            in_rotation = [e for e in in_rotation if ranks[e.address] == lowest]
        return in_rotation[next(self._turn) % len(in_rotation)]

    async def current(self) -> list[TritonEndpoint]:
        """Every known address (resolved first if due), in rotation or not."""
        await self._resolve_if_due()
        return list(self._endpoints.values())

    @property
    def open_channels(self) -> int:
        return sum(e.clients.open_clients for e in self._endpoints.values())

    async def failed(self, endpoint: TritonEndpoint, why: str) -> None:
        """`endpoint` answered as gone or stopping: out of rotation until ready, and the name resolved again."""
        self.went_away(endpoint, why)
        now = time.monotonic()
        if self._target.resolved_by_gateway and now - self._resolved_on_failure_at >= RESOLVE_AFTER_FAILURE_SECONDS:
            self._resolved_on_failure_at = now
            await self._refresh()

    def went_away(self, endpoint: TritonEndpoint, why: str) -> None:
        if endpoint.serving:
            endpoint.serving = False
            endpoint.outages += 1
            log.warning("triton unavailable at %s (model %s): %s", endpoint.address, self._model, why)
            self._publish()
        if endpoint.probe is None and not self._closed and endpoint.address in self._endpoints:
            endpoint.probe = asyncio.create_task(self._probe(endpoint))

    def recovered(self, endpoint: TritonEndpoint, outages_when_sent: int) -> None:
        """`endpoint` answered a call sent when it had had `outages_when_sent` outages: back in rotation, unless an
        outage began after the call was sent (a drained call of a stopping Triton, or a stale readiness answer)."""
        if endpoint.outages != outages_when_sent:
            return
        if not endpoint.serving:
            endpoint.serving = True
            log.info("triton available again at %s (model %s)", endpoint.address, self._model)
            self._publish()
        if endpoint.probe is not None and endpoint.probe is not asyncio.current_task():
            endpoint.probe.cancel()
        endpoint.probe = None

    async def aclose(self) -> None:
        self._closed = True
        tasks = [e.probe for e in self._endpoints.values() if e.probe is not None]
        if self._resolving is not None:
            tasks.append(self._resolving)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        endpoints, self._endpoints = list(self._endpoints.values()), {}
        await asyncio.gather(*(e.clients.aclose() for e in endpoints))

    async def _probe(self, endpoint: TritonEndpoint) -> None:
        """Until the model is ready on `endpoint` again (or the address is gone)."""
        while endpoint.address in self._endpoints and not endpoint.serving:
            await asyncio.sleep(PROBE_INTERVAL_SECONDS)
            if await self.probe(endpoint):
                return

    async def probe(self, endpoint: TritonEndpoint) -> bool:
        """Whether the model is ready on `endpoint`; puts it back in rotation (or takes it out) accordingly."""
        outages = endpoint.outages
        try:
            with endpoint.lease() as client:
                ready = bool(await asyncio.wait_for(client.is_model_ready(self._model), self._probe_timeout))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # unreachable, stopping, timed out: all mean "not yet"
            self.went_away(endpoint, f"{type(exc).__name__}: {exc}")
            return False
        if not ready:
            self.went_away(endpoint, "the model is not ready")
            return False
        self.recovered(endpoint, outages)
        return endpoint.serving  # False where an outage began while the probe ran: its answer is stale

    async def _resolve_if_due(self) -> None:
        if not self._target.resolved_by_gateway:
            return
        if not self._endpoints:
            await self._refresh()  # the first call, or every address vanished: nothing to call without it
        elif self._max_age > 0 and time.monotonic() - self._resolved_at >= self._max_age and self._resolving is None:
            self._resolving = asyncio.create_task(self._refresh())  # in the background: calls go on meanwhile
            self._resolving.add_done_callback(lambda _: setattr(self, "_resolving", None))

    async def _refresh(self) -> None:
        self._resolved_at = time.monotonic()
        addresses = await self._resolve(self._target.host, self._target.port)
        if addresses:  # a failed lookup keeps the addresses known: a DNS hiccup must not empty the rotation
            self._apply(addresses)
        elif not self._endpoints:
            log.warning("triton unavailable: %s:%s resolves to no address", self._target.host, self._target.port)

    def _apply(self, addresses: list[str]) -> None:
        if self._closed:
            return
        for address in addresses:
            if address not in self._endpoints:
                clients = AgingClient(functools.partial(self._open_client, address), self._max_age)
                self._endpoints[address] = TritonEndpoint(address, clients)
        for address in [a for a in self._endpoints if a not in addresses]:
            gone = self._endpoints.pop(address)
            gone.clients.retire()
            if gone.probe is not None:
                gone.probe.cancel()
            log.info("triton at %s left the rotation: %s no longer resolves to it", address, self._target.host)
        self._publish()

    def _publish(self) -> None:
        serving = sum(e.serving for e in self._endpoints.values())
        metrics.TRITON_UP.set(1 if serving else 0)
        metrics.TRITON_ADDRESSES.labels(state="serving").set(serving)
        metrics.TRITON_ADDRESSES.labels(state="out").set(len(self._endpoints) - serving)
