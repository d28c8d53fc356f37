"""Reading GPU_METRICS_URLS every GPU_METRICS_INTERVAL_SECONDS, off the request path, and handing the fresh readings
to the GPU policy (`protection`).

A URL whose host is a name is read at every address the name resolves to (each Triton pod behind a headless
Service has its own GPUs); the names are looked up concurrently with a timeout, and a failed or hung lookup keeps
the addresses known. Each endpoint is read concurrently with a timeout, and its text parsed in a worker thread, so a
slow or huge answer holds up neither requests nor the loop. A GPU's reading stays fresh for 3 intervals: an
endpoint not read for that long (down, hung, answering garbage) leaves the policy with its GPUs, logged once, and
comes back, logged once, at its next good read; while no poll succeeds at all for 3 intervals, the policy is given
no readings, so that stale states never hold traffic back. Nothing here raises into a request: the worst a broken
endpoint does is take its GPUs out of the policy.

Which Triton a GPU serves: an endpoint at the host of exactly one of Triton's addresses serves that Triton; any
other, or any endpoint while there is a single Triton, serves them all (`ALL`). The DCGM exporter runs beside
Triton, not in it: its GPUs follow the Triton whose endpoint reports the same GPU UUID; one that no Triton reports
is not Triton's (another workload's GPU on the node) and is left out, unless no Triton endpoint reports GPUs at
all, in which case the exporter's GPUs govern every call.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from gateway.background import cancel_and_wait
from gateway.gpu.metrics_text import GpuReading, merge_by_gpu, parse_readings
from gateway.gpu.protection import ALL, GpuProtection, SeenGpu
from gateway.settings.gpu import STALE_INTERVALS, GpuSettings
from gateway.upstreams.triton_endpoints import Resolver, is_ip, resolve_host

log = logging.getLogger(__name__)

READ_TIMEOUT_SECONDS = 5.0  # at most: an endpoint slower than this is as good as down


@dataclass
class _Endpoint:
    """One address of a GPU_METRICS_URLS entry, and what it last said."""

    url: str
    host: str
    since: float  # when it was first read or last answered: its staleness counts from here
    readings: dict[str, tuple[GpuReading, float]]  # uuid -> (reading, when read)
    dropped: bool = False
    error: str = ""


class GpuMetricsPoller:
    """The background loop: `start` it in the app's lifespan, `aclose` it on the way out."""

    def __init__(
        self,
        settings: GpuSettings,
        protection: GpuProtection,
        tritons: Callable[[], list[str]],
        *,
        resolve: Resolver = resolve_host,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._urls = settings.urls()
        self._interval = settings.metrics_interval_seconds
        self._protection = protection
        self._tritons = tritons
        self._resolve = resolve
        self._timeout = min(READ_TIMEOUT_SECONDS, max(1.0, self._interval))
        self._client = httpx.AsyncClient(timeout=self._timeout, transport=transport)
        self._expanded: dict[str, list[tuple[str, str]]] = {}  # url -> its (address url, host), last resolved
        self._endpoints: dict[str, _Endpoint] = {}
        self._triton_gpus: dict[str, tuple[str, float]] = {}  # uuid -> (scope, last seen) of GPUs Tritons reported
        self._polled_at = time.monotonic()  # when a poll last succeeded
        self._task: asyncio.Task[None] | None = None
        self._failure = ""

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="gpu-metrics")

    async def aclose(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task, name="gpu metrics poller")
        await self._client.aclose()

    async def _run(self) -> None:
        while True:
            started = time.monotonic()
            try:
                await self._poll_or_expire()
                self._failure = ""
            except Exception as exc:  # a bug must not end the loop, nor log every interval
                if str(exc) != self._failure:
                    log.exception(
                        "gpu metrics poll failed; if none succeeds for %d intervals, no GPU holds traffic back",
                        STALE_INTERVALS,
                    )
                self._failure = str(exc)
            await asyncio.sleep(max(0.0, self._interval - (time.monotonic() - started)))

    async def _poll_or_expire(self) -> None:
        try:
            await self.poll()
        except Exception:
            if time.monotonic() - self._polled_at >= STALE_INTERVALS * self._interval:
                self._protection.observe({}, self._tritons())  # every reading is stale by now
            raise

    async def poll(self) -> None:
        """Read every endpoint once and hand the fresh readings to the policy."""
        tritons = self._tritons()
        expanded = await asyncio.gather(*(self._addresses(url) for url in self._urls))
        targets = [target for addresses in expanded for target in addresses]
        known = {url: self._endpoints.get(url) for url, _ in targets}
        now = time.monotonic()
        # An address no longer resolved takes its GPUs with it.
        self._endpoints = {url: known[url] or _Endpoint(url, host, now, {}) for url, host in targets}
        await asyncio.gather(*(self._read(endpoint) for endpoint in self._endpoints.values()))
        now = time.monotonic()
        for endpoint in self._endpoints.values():
            self._judge(endpoint, now)
        self._protection.observe(self._seen(tritons, now), tritons)
        self._polled_at = now

    async def _addresses(self, url: str) -> list[tuple[str, str]]:
        """`url` at each address its host resolves to, with that address (an IP host: itself)."""
        parsed = httpx.URL(url)
        host, port = parsed.host, parsed.port or (443 if parsed.scheme == "https" else 80)
        if not host or is_ip(host):
            return [(url, host)]
        try:
            resolved = await asyncio.wait_for(self._resolve(host, port), self._timeout)
        except (TimeoutError, OSError):
            resolved = []
        if resolved:
            ips = [address.rpartition(":")[0].strip("[]") for address in resolved]
            self._expanded[url] = [(str(parsed.copy_with(host=ip)), ip) for ip in ips]
        return self._expanded.get(url, [(url, host)])

    async def _read(self, endpoint: _Endpoint) -> None:
        try:
            response = await self._client.get(endpoint.url)
            response.raise_for_status()
            readings = await asyncio.to_thread(parse_readings, response.text)
        except Exception as exc:  # unreachable, an error status, not Prometheus text: not read this time
            endpoint.error = f"{type(exc).__name__}: {exc}"
            return
        read_at = time.monotonic()
        endpoint.since = read_at
        endpoint.readings.update({reading.uuid: (reading, read_at) for reading in readings})
        if endpoint.dropped:
            endpoint.dropped = False
            log.info("gpu metrics at %s read again: its GPUs are back in the GPU policy", endpoint.url)

    def _judge(self, endpoint: _Endpoint, now: float) -> None:
        """Drop what `endpoint` said too long ago; log once when it has not been read for 3 intervals."""
        stale_after = STALE_INTERVALS * self._interval
        endpoint.readings = {u: r for u, r in endpoint.readings.items() if now - r[1] <= stale_after}
        if not endpoint.dropped and now - endpoint.since >= stale_after:
            endpoint.dropped = True
            log.warning(
                "gpu metrics at %s not read for %d intervals (%s): its GPUs leave the GPU policy",
                endpoint.url,
                STALE_INTERVALS,
                endpoint.error or "no answer",
            )

    def _seen(self, tritons: list[str], now: float) -> dict[str, SeenGpu]:
        """Each fresh GPU, its readings from every endpoint merged, and the Triton it serves."""
        scopes: dict[str, str] = {}
        from_dcgm: dict[str, str] = {}
        readings: list[GpuReading] = []
        for endpoint in self._endpoints.values():
            scope = scope_of(endpoint.host, tritons)
            for reading, _ in endpoint.readings.values():
                readings.append(reading)
                if reading.source == "triton":
                    scopes.setdefault(reading.uuid, scope)
                else:
                    from_dcgm.setdefault(reading.uuid, scope)
        # A GPU no Triton has reported for 3 intervals is no longer known as Triton's (its pod was replaced).
        stale_after = STALE_INTERVALS * self._interval
        known = {u: seen for u, seen in self._triton_gpus.items() if now - seen[1] <= stale_after}
        self._triton_gpus = known | {uuid: (scope, now) for uuid, scope in scopes.items()}
        for uuid, scope in from_dcgm.items():
            if uuid in self._triton_gpus:
                scopes.setdefault(uuid, self._triton_gpus[uuid][0])
            elif not self._triton_gpus:  # no Triton endpoint reports GPUs: the exporter's govern the calls
                scopes[uuid] = scope
        return {
            uuid: SeenGpu(reading, scopes[uuid]) for uuid, reading in merge_by_gpu(readings).items() if uuid in scopes
        }


def scope_of(host: str, tritons: list[str]) -> str:
    """The Triton address an endpoint at `host` serves: the one Triton address at that host, else `ALL` (several
    at that host, none, or a single Triton in all)."""
    if len(tritons) <= 1:
        return ALL
    matching = [address for address in tritons if address.rpartition(":")[0].strip("[]") == host]
    return matching[0] if len(matching) == 1 else ALL
