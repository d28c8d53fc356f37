"""TRITON_URL's forms: which the gateway resolves itself (one channel per address) and which it leaves to gRPC."""

from __future__ import annotations

import pytest

from gateway.upstreams.triton_endpoints import TritonTarget, resolve_host


@pytest.mark.parametrize(
    ("url", "addresses"),
    [
        ("ipv4:127.0.0.1:8001,127.0.0.1:8011", ("127.0.0.1:8001", "127.0.0.1:8011")),
        ("ipv4:10.0.0.1:8001", ("10.0.0.1:8001",)),
        ("ipv6:[::1]:8001,[::1]:8011", ("[::1]:8001", "[::1]:8011")),
        ("127.0.0.1:8001", ("127.0.0.1:8001",)),
        ("[::1]:8001", ("[::1]:8001",)),
        ("dns:///10.1.2.3:8001", ("10.1.2.3:8001",)),
        ("unix:/run/triton.sock", ("unix:/run/triton.sock",)),
        ("triton", ("triton",)),  # no port: gRPC's own resolver and default port
    ],
)
def test_fixed_addresses(url: str, addresses: tuple[str, ...]) -> None:
    target = TritonTarget.parse(url)
    assert target.addresses == addresses and not target.resolved_by_gateway


@pytest.mark.parametrize(
    "url",
    ["dns:///ai-triton-headless.ns.svc.cluster.local:8001", "dns://10.0.0.10/ai-triton-headless.ns.svc.cluster.local:8001",
     "ai-triton-headless.ns.svc.cluster.local:8001"],
)  # fmt: skip
def test_names_are_resolved_by_the_gateway(url: str) -> None:
    target = TritonTarget.parse(url)
    assert target.resolved_by_gateway
    assert (target.host, target.port) == ("ai-triton-headless.ns.svc.cluster.local", 8001)


async def test_a_name_resolves_to_ipv4_addresses_first_without_repeats() -> None:
    addresses = await resolve_host("localhost", 8001)
    assert addresses == ["127.0.0.1:8001"]


async def test_a_name_that_does_not_resolve_gives_no_address() -> None:
    assert await resolve_host("no-such-host.invalid", 8001) == []
