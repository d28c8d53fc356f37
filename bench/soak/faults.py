"""The fault schedule: what breaks when, each fault an action on the platform, recorded with its start and end
(Unix seconds) and what it is allowed to degrade.

Faults of a component with a peer (a gateway replica, a Triton) are `redundant`: no request may fail while they
last. Faults of a component without one (Redis, Milvus, an upstream) may degrade the routes `degrades` names, as
docs/operations.md says, and nothing else.
"""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from bench.soak.platform import Platform
from bench.soak.records import FaultEvent
from bench.soak.rules import RECOVERY_SECONDS

log = logging.getLogger("bench.soak")

VIDEO_ROUTES = ("video_submit", "video_poll", "video_watch")
SEARCH_ROUTES = ("search", "search_filter", "upsert", "delete", "search_after_upsert")
CHAT_ROUTES = ("chat", "chat_stream")
# Redis holds the video tasks (503 while it does not answer) and the usage record and key store (usage reads, the
# admin API); caches miss and quotas turn per replica, which costs no request.
REDIS_DEGRADES = (*VIDEO_ROUTES, "usage", "admin")


@dataclass(frozen=True)
class Planned:
    at: float  # seconds after the schedule starts
    name: str


Action = Callable[[Platform, FaultEvent], Awaitable[None]]


async def gateway_kill(platform: Platform, event: FaultEvent) -> None:
    index = 1 % len(platform.gateways)
    event.target = f"127.0.0.1:{platform.gateway_ports[index]}"
    event.detail["replica"] = platform.gateways[index].name
    await platform.kill_gateway(index)
    await asyncio.sleep(1.0)  # the supervisor notices and starts it; the phase ends when it answers again
    while not platform.gateways[index].alive() or not await asyncio.to_thread(platform.gateways[index].ready):
        await asyncio.sleep(0.2)


async def gateway_rolling_restart(platform: Platform, event: FaultEvent) -> None:
    for index in range(len(platform.gateways)):
        await platform.restart_gateway(index)
        await asyncio.sleep(2.0)


async def triton_sigterm(platform: Platform, event: FaultEvent) -> None:
    """One Triton stopped gracefully, then started again (a rolling restart's step)."""
    event.target = platform.tritons[0].name
    await platform.restart_triton(0)


async def triton_rolling_restart(platform: Platform, event: FaultEvent) -> None:
    for index in range(len(platform.tritons)):
        await platform.restart_triton(index)
        await asyncio.sleep(5.0)


async def triton_kill(platform: Platform, event: FaultEvent) -> None:
    event.target = platform.tritons[1].name
    await platform.kill_triton(1)


async def redis_pause(platform: Platform, event: FaultEvent) -> None:
    assert platform.redis is not None
    await platform.pause(platform.redis, float(event.detail.get("seconds", 10.0)))


async def redis_kill(platform: Platform, event: FaultEvent) -> None:
    assert platform.redis is not None
    await platform.kill_and_start(platform.redis)


async def milvus_restart(platform: Platform, event: FaultEvent) -> None:
    """Stop and start again at once: a pod replaced (the platform starts Milvus so that it serves again within
    its sessions' lease, 10 s, with its data: see `Platform._start_milvus`)."""
    assert platform.milvus is not None
    await platform.restart(platform.milvus, pause=0.0)


async def chat_5xx_burst(platform: Platform, event: FaultEvent) -> None:
    await platform.simulator_config(platform.hunyuan, error_rate=1.0)
    await asyncio.sleep(10.0)
    await platform.simulator_config(platform.hunyuan, error_rate=0.0)


async def chat_latency_spike(platform: Platform, event: FaultEvent) -> None:
    await platform.simulator_config(platform.hunyuan, ttft_seconds=platform.config.chat_ttft_seconds + 5.0)
    await asyncio.sleep(20.0)
    await platform.simulator_config(platform.hunyuan, ttft_seconds=platform.config.chat_ttft_seconds)


async def chat_dropped_streams(platform: Platform, event: FaultEvent) -> None:
    await platform.simulator_config(platform.hunyuan, drop_stream_after_chunks=5, drop_streams=20)
    await asyncio.sleep(15.0)
    await platform.simulator_config(platform.hunyuan, drop_stream_after_chunks=None, drop_streams=None)


async def fal_submit_timeouts(platform: Platform, event: FaultEvent) -> None:
    """fal's submit answers after the gateway's read timeout (VIDEO_READ_TIMEOUT_SECONDS=5): outcome unknown."""
    await platform.simulator_config(platform.pika, submit_delay_seconds=8.0)
    await asyncio.sleep(20.0)
    await platform.simulator_config(platform.pika, submit_delay_seconds=0.0)


async def cpu_starvation(platform: Platform, event: FaultEvent) -> None:
    """Busy processes at the platform's priority, two per core, for 30 s: every process waits for the CPU."""
    seconds = float(event.detail.get("seconds", 30.0))
    spin = f"import time\nend = time.time() + {seconds}\nwhile time.time() < end:\n    pass\n"
    workers = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(2 * (os.cpu_count() or 1))]
    try:
        await asyncio.sleep(seconds)
    finally:
        for worker in workers:
            worker.kill()
            worker.wait(timeout=5)


# name -> (component, action, redundant, degrades)
FAULTS: dict[str, tuple[str, Action, bool, tuple[str, ...]]] = {
    "gateway SIGKILL": ("gateway", gateway_kill, True, ()),
    "gateway rolling restart": ("gateway", gateway_rolling_restart, True, ()),
    "triton SIGTERM": ("triton", triton_sigterm, True, ()),
    "triton rolling restart": ("triton", triton_rolling_restart, True, ()),
    "triton SIGKILL": ("triton", triton_kill, True, ()),
    "redis SIGSTOP 10 s": ("redis", redis_pause, False, REDIS_DEGRADES),
    "redis kill and restart": ("redis", redis_kill, False, REDIS_DEGRADES),
    "chat upstream 5xx burst": ("chat-upstream", chat_5xx_burst, False, CHAT_ROUTES),
    "chat upstream latency spike": ("chat-upstream", chat_latency_spike, False, CHAT_ROUTES),
    "chat upstream dropped streams": ("chat-upstream", chat_dropped_streams, False, CHAT_ROUTES),
    "fal submit timeouts": ("fal", fal_submit_timeouts, False, ()),
    "cpu starvation 30 s": ("cpu", cpu_starvation, False, ()),
    "milvus restart": ("milvus", milvus_restart, False, SEARCH_ROUTES),
}

SHORT_SCHEDULE = (Planned(12, "gateway SIGKILL"), Planned(40, "triton SIGTERM"), Planned(75, "redis SIGSTOP 10 s"))


def full_schedule(seconds: float) -> tuple[Planned, ...]:
    """Every fault, spread evenly over the middle of `seconds` of steady load (the first and last tenth quiet:
    warm-up and the leak baseline, then the recovery)."""
    names = list(FAULTS)
    first, last = 0.1 * seconds, 0.85 * seconds
    step = (last - first) / len(names)
    return tuple(Planned(first + index * step, name) for index, name in enumerate(names))


async def run_schedule(platform: Platform, schedule: tuple[Planned, ...], events: list[FaultEvent]) -> None:
    """Run each fault at its time, but never before the one before it has ended and its recovery passed (so each
    phase shows one fault), appending its event to `events`."""
    started = time.monotonic()
    quiet_from = started
    for planned in schedule:
        await asyncio.sleep(max(0.0, started + planned.at - time.monotonic(), quiet_from - time.monotonic()))
        component, action, redundant, degrades = FAULTS[planned.name]
        event = FaultEvent(planned.name, component, time.time(), redundant=redundant, degrades=degrades)
        if "SIGSTOP" in planned.name:
            event.detail["seconds"] = 10.0
        events.append(event)
        log.info("fault: %s", planned.name)
        try:
            await action(platform, event)
        except Exception as exc:  # a fault that could not be applied is reported, the soak goes on
            log.exception("fault %s failed", planned.name)
            event.detail["error"] = f"{type(exc).__name__}: {exc}"
        event.end = time.time()
        quiet_from = time.monotonic() + RECOVERY_SECONDS.get(component, 10)
        log.info("fault over: %s (%.1f s)", planned.name, event.end - event.start)
