"""Calls go to the Tritons the GPU policy ranks lowest: a Triton short of GPU memory gets no calls of several texts
while another has room, a hot one no calls while a cooler one serves, and when all rank alike all get calls."""

from __future__ import annotations

from gateway.upstreams.triton_endpoints import TritonEndpoints

A, B = "10.0.0.1:8001", "10.0.0.2:8001"


class IdleTriton:
    async def close(self) -> None:
        pass


def rotation(ranks: dict[tuple[str, bool], int]) -> TritonEndpoints:
    return TritonEndpoints(
        f"ipv4:{A},{B}",
        lambda address: IdleTriton(),  # type: ignore[arg-type,return-value]
        model="bge",
        max_age_seconds=0,
        probe_timeout_seconds=1,
        rank=lambda address, bulk: ranks.get((address, bulk), 0),
    )


async def picked(endpoints: TritonEndpoints, *, bulk: bool, calls: int = 6) -> set[str]:
    return {(await endpoints.pick(bulk=bulk)).address for _ in range(calls)}  # type: ignore[union-attr]


async def test_bulk_calls_avoid_a_triton_short_of_memory_and_single_texts_do_not() -> None:
    endpoints = rotation({(A, True): 2})
    assert await picked(endpoints, bulk=True) == {B}
    assert await picked(endpoints, bulk=False) == {A, B}
    await endpoints.aclose()


async def test_a_hot_triton_gets_calls_again_when_every_triton_is_as_hot() -> None:
    ranks = {(A, False): 1, (A, True): 1}
    endpoints = rotation(ranks)
    assert await picked(endpoints, bulk=False) == {B}
    ranks |= {(B, False): 1, (B, True): 1}
    assert await picked(endpoints, bulk=False) == {A, B}
    await endpoints.aclose()


async def test_the_retry_of_a_failed_call_may_go_to_the_ranked_triton_when_no_other_is_left() -> None:
    endpoints = rotation({(A, True): 2})
    first = await endpoints.pick(bulk=True)
    assert first is not None and first.address == B
    other = await endpoints.pick(exclude=first, bulk=True)
    assert other is not None and other.address == A
    await endpoints.aclose()
