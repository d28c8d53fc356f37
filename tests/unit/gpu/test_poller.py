"""The poller against real HTTP endpoints serving recorded Triton and DCGM text: which Triton each GPU serves, the
merge of both sources, a host name read at each of its addresses, and an endpoint that stops answering leaving the
policy (logged once) and coming back (logged once)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator

import pytest

from gateway.gpu.poller import GpuMetricsPoller, scope_of
from gateway.gpu.protection import ALL, GpuProtection
from gateway.settings import GpuSettings
from tests.helpers.gpu_metrics import GIB, Gpu, MetricsServer, dcgm_text, triton_text

INTERVAL = 0.05
FIRST = Gpu(uuid="GPU-11111111-aaaa-bbbb-cccc-000000000001")
SECOND = Gpu(uuid="GPU-22222222-aaaa-bbbb-cccc-000000000002", used_bytes=78 * GIB, temperature=90)
OTHER = Gpu(uuid="GPU-33333333-aaaa-bbbb-cccc-000000000003", index=1, temperature=99)  # not Triton's


@pytest.fixture
def servers() -> Iterator[tuple[MetricsServer, MetricsServer]]:
    """Two Triton pods' metrics ports (two loopback addresses), the second one also serving the node's DCGM."""
    with MetricsServer("127.0.0.1") as one, MetricsServer("127.0.0.2") as two:
        one.texts["/metrics"] = triton_text([FIRST])
        two.texts["/metrics"] = triton_text([SECOND])
        two.texts["/dcgm"] = dcgm_text([SECOND, OTHER])
        yield one, two


def poller(urls: list[str], tritons: list[str], **kwargs: object) -> tuple[GpuMetricsPoller, GpuProtection]:
    settings = GpuSettings(metrics_urls=",".join(urls), metrics_interval_seconds=INTERVAL)
    guard = GpuProtection(settings, 4)
    return GpuMetricsPoller(settings, guard, lambda: tritons, **kwargs), guard  # type: ignore[arg-type]


def test_an_endpoint_maps_to_the_triton_at_its_host_else_to_all() -> None:
    tritons = ["10.0.0.1:8001", "10.0.0.2:8001", "[fd00::3]:8001"]
    assert scope_of("10.0.0.2", tritons) == "10.0.0.2:8001"
    assert scope_of("fd00::3", tritons) == "[fd00::3]:8001"
    assert scope_of("10.9.9.9", tritons) == ALL, "e.g. a DCGM exporter's Service"
    assert scope_of("10.0.0.1", ["10.0.0.1:8001"]) == ALL, "a single Triton: its GPUs govern every call"
    assert scope_of("127.0.0.1", ["127.0.0.1:8001", "127.0.0.1:9001"]) == ALL, "two Tritons on one host"


async def test_each_triton_is_judged_by_its_own_gpus_and_dcgm_follows_the_uuid(
    servers: tuple[MetricsServer, MetricsServer],
) -> None:
    one, two = servers
    tritons = ["127.0.0.1:8001", "127.0.0.2:8001"]
    polling, guard = poller([one.url("/metrics"), two.url("/metrics"), two.url("/dcgm")], tritons)
    await polling.poll()
    await polling.aclose()
    second = tritons[1]
    assert guard.rank(second, True) == 3, "degraded (78 of 80 GiB) and throttled (90 °C, from DCGM)"
    assert guard.rank(tritons[0], True) == 0
    guard.refuse_bulk("embeddings", 8)  # the first Triton has room
    assert guard.in_flight_limit == 4, "one Triton is cool"
    assert guard.readiness() == "degraded"


async def test_a_host_name_is_read_at_every_address_it_resolves_to(
    servers: tuple[MetricsServer, MetricsServer],
) -> None:
    one, _ = servers
    lookups: list[str] = []

    async def resolve(host: str, port: int) -> list[str]:  # the cluster's DNS for Triton's headless Service
        lookups.append(host)
        return [f"127.0.0.1:{port}", f"127.0.0.3:{port}"]

    with MetricsServer("127.0.0.3", one.port) as three:  # a second pod, on the same port at its own address
        three.texts["/metrics"] = triton_text([SECOND])
        tritons = ["127.0.0.1:8001", "127.0.0.3:8001"]
        polling, guard = poller([f"http://triton-headless.ai.svc:{one.port}/metrics"], tritons, resolve=resolve)
        await polling.poll()
        await polling.aclose()
    assert lookups == ["triton-headless.ai.svc"]
    assert one.reads["/metrics"] == 1 and three.reads["/metrics"] == 1
    assert guard.rank("127.0.0.3:8001", True) == 2 and guard.rank("127.0.0.1:8001", True) == 0


async def test_an_endpoint_not_read_for_three_intervals_leaves_the_policy_once_and_comes_back_once(
    servers: tuple[MetricsServer, MetricsServer], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="gateway.gpu")
    _, two = servers
    polling, guard = poller([two.url("/metrics")], ["127.0.0.2:8001"])
    await polling.poll()
    assert guard.readiness() == "degraded"
    two.statuses["/metrics"] = 500
    for _ in range(6):
        await asyncio.sleep(INTERVAL)
        await polling.poll()
    assert guard.readiness() == "unknown", "its GPU left the policy: no data, no policy"
    guard.refuse_bulk("embeddings", 8)
    two.statuses.pop("/metrics")
    await polling.poll()
    await polling.aclose()
    assert guard.readiness() == "degraded"
    messages = [r.getMessage() for r in caplog.records if r.name == "gateway.gpu.poller"]
    assert sum("not read for 3 intervals (HTTPStatusError" in m for m in messages) == 1
    assert sum("read again" in m for m in messages) == 1


async def test_text_that_is_not_prometheus_counts_as_a_failed_read(
    servers: tuple[MetricsServer, MetricsServer], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="gateway.gpu")
    one, _ = servers
    one.texts["/metrics"] = "<html>upstream connect error</html>\n"
    polling, guard = poller([one.url("/metrics")], ["127.0.0.1:8001"])
    for _ in range(6):  # 5 intervals: well past the 3 after which it is dropped
        await polling.poll()
        await asyncio.sleep(INTERVAL)
    await polling.aclose()
    assert guard.readiness() == "unknown"
    assert any("(ValueError" in r.getMessage() for r in caplog.records if r.name == "gateway.gpu.poller")


async def test_the_loop_polls_in_the_background_until_closed(servers: tuple[MetricsServer, MetricsServer]) -> None:
    one, _ = servers
    polling, guard = poller([one.url("/metrics")], ["127.0.0.1:8001"])
    await polling.start()
    await asyncio.sleep(INTERVAL * 4)
    await polling.aclose()
    reads = one.reads["/metrics"]
    assert reads >= 3 and guard.readiness() == "ok"
    await asyncio.sleep(INTERVAL * 2)
    assert one.reads["/metrics"] == reads, "no read after aclose"


async def test_a_hung_lookup_holds_up_no_reading_for_longer_than_its_timeout(
    servers: tuple[MetricsServer, MetricsServer],
) -> None:
    one, _ = servers

    async def resolve(host: str, port: int) -> list[str]:
        if host == "hung.test":
            await asyncio.Event().wait()  # a DNS server that never answers
        return [f"127.0.0.1:{port}"]

    urls = [f"http://hung.test:{one.port}/metrics", f"http://triton.test:{one.port}/metrics"]
    polling, guard = poller(urls, ["127.0.0.1:8001"], resolve=resolve)
    await asyncio.wait_for(polling.poll(), 3)  # the lookup's timeout (1 s), not for ever
    await polling.aclose()
    assert one.reads["/metrics"] == 1 and guard.readiness() == "ok"


async def test_while_every_poll_fails_the_gpus_leave_the_policy_after_three_intervals(
    servers: tuple[MetricsServer, MetricsServer],
) -> None:
    _, two = servers
    broken = False

    async def resolve(host: str, port: int) -> list[str]:
        if broken:
            raise RuntimeError("a bug in the lookup")
        return [f"127.0.0.2:{port}"]

    polling, guard = poller([f"http://triton.test:{two.port}/metrics"], ["127.0.0.2:8001"], resolve=resolve)
    await polling.poll()
    assert guard.readiness() == "degraded"
    broken = True
    await polling.start()
    await asyncio.sleep(INTERVAL * 5)
    await polling.aclose()
    assert guard.readiness() == "unknown", "stale states must not hold traffic back"


async def test_a_gpu_no_triton_reports_any_more_is_no_longer_tritons(
    servers: tuple[MetricsServer, MetricsServer],
) -> None:
    one, two = servers
    two.texts["/dcgm"] = dcgm_text([Gpu(uuid=FIRST.uuid, temperature=90)])  # the first Triton's GPU is hot
    tritons = ["127.0.0.1:8001", "127.0.0.2:8001"]
    polling, guard = poller([one.url("/metrics"), two.url("/metrics"), two.url("/dcgm")], tritons)
    await polling.poll()
    assert guard.rank(tritons[0], False) == 1
    one.texts["/metrics"] = triton_text([Gpu(uuid="GPU-44444444-aaaa-bbbb-cccc-000000000004")])  # a new pod, GPU
    for _ in range(8):  # past 3 intervals for the old reading, and 3 more for the GPU's last sighting
        await asyncio.sleep(INTERVAL)
        await polling.poll()
    await polling.aclose()
    assert guard.rank(tritons[0], False) == 0, "the hot GPU is another workload's now, not the first Triton's"
