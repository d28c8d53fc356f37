"""Which Triton addresses get calls: a stopping Triton still answers the calls it had taken before it began to stop,
and those answers must not put it back in rotation (it would fail the next call, and log its outage twice)."""

from __future__ import annotations

import logging

import pytest

from gateway.upstreams.triton_endpoints import TritonEndpoint, TritonEndpoints


class StoppingTriton:
    """tritonclient's side of a Triton that is shutting down: the model is never ready again."""

    async def is_model_ready(self, model: str) -> bool:
        return False

    async def close(self) -> None:
        pass


def endpoints(triton: StoppingTriton | None = None) -> TritonEndpoints:
    return TritonEndpoints(
        "ipv4:10.0.0.1:8001,10.0.0.2:8001",
        lambda address: triton or StoppingTriton(),  # type: ignore[arg-type,return-value]
        model="bge",
        max_age_seconds=0,
        probe_timeout_seconds=1,
    )


def outage_logs(caplog: pytest.LogCaptureFixture) -> tuple[int, int]:
    messages = [r.getMessage() for r in caplog.records if r.name == "gateway.upstreams.triton"]
    return sum("unavailable at" in m for m in messages), sum("available again" in m for m in messages)


async def test_an_answer_to_a_call_sent_before_the_outage_began_keeps_the_triton_out_of_rotation(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="gateway.upstreams.triton")

    rotation = endpoints()
    stopping = await rotation.pick()
    assert stopping is not None
    drained = stopping.outages  # a call sent now, still running when the Triton begins to stop
    await rotation.failed(stopping, "Server is stopping, scheduler has stopped accepting new inference requests")
    rotation.recovered(stopping, drained)  # the drained call's answer arrives
    assert not stopping.serving
    assert {(await rotation.pick()).address for _ in range(4)} == {"10.0.0.2:8001"}  # type: ignore[union-attr]

    rotation.recovered(stopping, stopping.outages)  # a call sent after the outage began: it is back
    assert stopping.serving
    await rotation.aclose()
    assert outage_logs(caplog) == (1, 1), "one WARNING and one INFO for one outage"


async def test_a_readiness_answer_sent_before_the_outage_began_does_not_count() -> None:
    rotation: TritonEndpoints
    stopping: TritonEndpoint | None = None

    class ReadyWhenAsked(StoppingTriton):
        """Answers "ready" to a question asked before its outage began, the answer arriving after."""

        async def is_model_ready(self, model: str) -> bool:
            assert stopping is not None
            await rotation.failed(stopping, "Server is stopping")
            return True

    rotation = endpoints(ReadyWhenAsked())
    stopping = await rotation.pick()
    assert stopping is not None
    assert await rotation.probe(stopping) is False
    assert not stopping.serving
    await rotation.aclose()
