"""The upstream quota is the account's: three gateway processes sharing one Redis stay inside it together."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import pytest

from localtriton.ports import free_port
from localtriton.server import TritonProcess
from tests.helpers.gateway_processes import Gateways
from tests.helpers.hunyuan_fixtures import RunningHunyuanSimulator

pytestmark = pytest.mark.slow

QUOTA = 20  # the simulator's: requests per rolling second, by arrival; the gateways are set to it, as documented
# The gateways space their calls (1 s + margin) / QUOTA apart. A call admitted on time can reach the upstream late
# when its replica's loop is busy: at the burst's start each replica takes 100 requests at once, and on a busy
# 2-core host that has held a call back by over 0.1 s, which put a 21st arrival in one second. A quarter second
# of margin absorbs that; the default 0.05 s is for a network's jitter. Replicas that did not share the quota
# would send three times as many.
MARGIN_SECONDS = 0.25
REQUESTS = 300


@pytest.fixture
def replicas(
    redis_url: str, triton: TritonProcess, hunyuan_simulator: RunningHunyuanSimulator, gateways: Gateways
) -> Iterator[list[str]]:
    hunyuan_simulator.config.api_key = "quota-key"
    hunyuan_simulator.config.qps_quota = QUOTA
    variables = {
        "TRITON_URL": triton.grpc_url,
        "REDIS_URL": redis_url,
        # What is tested is the shared quota, not the fallback: a busy CI host must not push Redis
        # calls past the default 0.25 s timeout and so into each replica limiting alone.
        "REDIS_TIMEOUT_SECONDS": "2",
        "CHAT_BASE_URL": hunyuan_simulator.base_url,
        "CHAT_API_KEY": "quota-key",
        "CHAT_REQUESTS_PER_SECOND": str(QUOTA),
        "CHAT_RATE_MARGIN_SECONDS": str(MARGIN_SECONDS),
        "CHAT_MAX_WAIT_SECONDS": "60",
        "CHAT_MAX_RETRIES": "0",  # a 429 would surface instead of being retried away
        "GATEWAY_LOG_LEVEL": "WARNING",
    }
    started = [gateways.create(str(n), free_port(), variables).launch() for n in range(3)]
    for gateway in started:
        gateway.wait_healthy()
    yield [gateway.base_url for gateway in started]
    gateways.stop_all()


async def test_three_replicas_never_exceed_the_accounts_qps(
    replicas: list[str], hunyuan_simulator: RunningHunyuanSimulator
) -> None:
    limits = httpx.Limits(max_connections=REQUESTS)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        calls = [
            client.post(
                f"{replicas[i % 3]}/v1/chat/completions",
                json={"model": "hy3-preview", "messages": [{"role": "user", "content": f"q{i}"}]},
            )
            for i in range(REQUESTS)
        ]
        statuses = [r.status_code for r in await asyncio.gather(*calls)]
    assert statuses.count(200) == REQUESTS, {s: statuses.count(s) for s in set(statuses)}
    stats = hunyuan_simulator.stats
    assert stats.rate_limited == 0
    assert stats.max_requests_in_any_window(1.0) <= QUOTA
    assert stats.requests_total == REQUESTS
