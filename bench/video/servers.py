"""The video part's servers: the Pika simulator and a gateway that takes its webhooks; fresh per run, stopped on
exit."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import redis

from bench.processes import running
from bench.stack import Endpoint, gateway, pika_simulator
from bench.video.plan import API_KEY, GRACE_AFTER_JOB_SECONDS, JOB_SECONDS, TASK_TIMEOUT_SECONDS


@dataclass
class VideoStack:
    pika: Endpoint
    gateway: Endpoint

    def cpu_seconds(self) -> tuple[float, float]:
        return self.gateway.server.cpu_seconds(), self.pika.server.cpu_seconds()


def gateway_env(pika: Endpoint, redis_url: str | None, *, job_seconds: float = JOB_SECONDS[False]) -> dict[str, str]:
    """Video only (no Triton); submit quota far above the load; polling starts soon after a lost webhook."""
    env = {
        "TRITON_URL": "127.0.0.1:9",
        "VIDEO_BASE_URL": pika.base_url,
        "VIDEO_API_KEY": API_KEY,
        "VIDEO_WEBHOOK_JWKS_URL": f"{pika.base_url}/.well-known/jwks.json",
        "VIDEO_PLATFORM_URL": pika.base_url,  # the request history (read only after a lost submit answer)
        "VIDEO_SUBMITS_PER_SECOND": "5000",
        "VIDEO_MAX_CONCURRENT_SUBMITS": "16",
        "VIDEO_CALLBACK_GRACE_SECONDS": f"{job_seconds + GRACE_AFTER_JOB_SECONDS:g}",
        "VIDEO_TASK_TIMEOUT_SECONDS": f"{TASK_TIMEOUT_SECONDS:g}",
        "GATEWAY_MAX_IN_FLIGHT": "4096",  # the completion run holds one SSE stream per task
        "GATEWAY_SHUTDOWN_GRACE_SECONDS": "1",  # each run stops its gateway with tasks still open
    }
    if redis_url is not None:
        env["REDIS_URL"] = redis_url
    return env


@contextlib.contextmanager
def video_stack(
    log_dir: Path,
    name: str,
    *,
    job_seconds: float = JOB_SECONDS[False],
    loss_rate: float = 0.0,
    seed: int = 0,
    redis_url: str | None = None,
) -> Iterator[VideoStack]:
    """The Pika simulator and a gateway with webhooks to itself, on free ports; stopped on exit."""
    pika = pika_simulator(
        log_dir, "--api-key", API_KEY, "--job-seconds", f"{job_seconds:g}", "--callback-loss-rate",
        f"{loss_rate:g}", "--seed", str(seed), "--log-level", "warning",
    )  # fmt: skip
    # The simulator stands in for a remote service: it must not take the gateway's share of the cores.
    pika.server.command = ["nice", "-n", "10", *pika.server.command]
    gw = gateway(log_dir, gateway_env(pika, redis_url, job_seconds=job_seconds), name=name)
    # stack.gateway picks the port, so the public URL (where webhooks go) is only known now.
    gw.server.env["GATEWAY_PUBLIC_URL"] = gw.base_url
    if redis_url is None:
        gw.server.env.pop("REDIS_URL", None)
    else:
        with redis.Redis.from_url(redis_url) as client:
            client.flushdb()  # no tasks, leases or quota left from an earlier run
    for suffix in ("", "-wal", "-shm", "-journal"):
        (log_dir / f"{name}-tasks.sqlite3{suffix}").unlink(missing_ok=True)  # no tasks left from an earlier run
    with running((pika.server, pika.ready_url), (gw.server, gw.ready_url)):
        yield VideoStack(pika, gw)
