"""Keys over three gateway processes sharing one Redis: a revoked key is refused by all three within 1 s, a key's
requests per minute hold for the three together, no secret reaches their logs, and the usage record equals what
the upstream counted after one replica is killed mid-load."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from localtriton.ports import free_port
from tests.helpers.checkout import ROOT
from tests.helpers.conditions import until
from tests.helpers.gateway_processes import GatewayProcess, Gateways
from tests.helpers.hunyuan_fixtures import RunningHunyuanSimulator

pytestmark = pytest.mark.slow

ADMIN = "replica-admin-key-0001"
RPM = 600  # 600 at once, then one every 100 ms for the key, whichever replica it calls


@pytest.fixture
def replica_processes(
    redis_url: str, tmp_path: Path, hunyuan_simulator: RunningHunyuanSimulator, gateways: Gateways
) -> Iterator[list[GatewayProcess]]:
    """Three gateways on one Redis; stopped with SIGTERM at the end (a test fails if one does not exit in time)."""
    variables = {
        "REDIS_URL": redis_url,
        "REDIS_TIMEOUT_SECONDS": "2",  # a busy host must not push the shared limits into their fallback
        "GATEWAY_API_KEYS": ADMIN,
        "GATEWAY_LOG_LEVEL": "INFO",  # access logs included: they must not hold a key either
        "CHAT_BASE_URL": hunyuan_simulator.base_url,
        "CHAT_API_KEY": "upstream-key",
        # The account's quota is not what these tests are about: a killed replica's leases must not hold it.
        "CHAT_MAX_CONCURRENT": "100",
        "CHAT_REQUESTS_PER_SECOND": "1000",
    }
    started = [
        gateways.create(str(n), free_port(), {**variables, "TASKS_SQLITE_PATH": str(tmp_path / f"tasks-{n}.sqlite3")})
        for n in range(3)
    ]
    for gateway in started:
        gateway.launch()
    for gateway in started:
        gateway.wait_healthy()
    yield started
    gateways.stop_all()


@pytest.fixture
def replicas(replica_processes: list[GatewayProcess]) -> list[str]:
    """The three replicas' base URLs."""
    return [gateway.base_url for gateway in replica_processes]


def bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


def create_key(http: httpx.Client, url: str, **body: object) -> dict[str, str]:
    response = http.post(f"{url}/v1/admin/keys", json={"team": "search", **body}, headers=bearer(ADMIN))
    assert response.status_code == 201, response.text
    created: dict[str, str] = response.json()
    return created


def status_on(http: httpx.Client, url: str, secret: str) -> int:
    return http.get(f"{url}/v1/models", headers=bearer(secret)).status_code


def test_a_revoked_key_is_refused_by_every_replica_within_a_second(replicas: list[str], tmp_path: Path) -> None:
    with httpx.Client(timeout=30) as http:
        created = create_key(http, replicas[0], name="to-revoke")
        secret = created["key"]
        deadline = time.monotonic() + 5
        while any(status_on(http, url, secret) != 200 for url in replicas):
            assert time.monotonic() < deadline, "a new key was not accepted by every replica"
            time.sleep(0.05)

        deleted = http.delete(f"{replicas[0]}/v1/admin/keys/{created['id']}", headers=bearer(ADMIN))
        assert deleted.status_code == 200
        revoked_at = time.monotonic()
        refused_after = {}
        while len(refused_after) < len(replicas) and time.monotonic() - revoked_at < 3:
            for url in replicas:
                if url not in refused_after and status_on(http, url, secret) == 401:
                    refused_after[url] = time.monotonic() - revoked_at
        assert set(refused_after) == set(replicas)
        assert max(refused_after.values()) < 1.0, refused_after
        answer = http.get(f"{replicas[2]}/v1/models", headers=bearer(secret))
        assert "revoked" in answer.json()["error"]["message"]
    for log in tmp_path.glob("gateway-*.log"):
        assert secret not in log.read_text(errors="replace")


def test_a_keys_requests_per_minute_hold_across_three_replicas(replicas: list[str]) -> None:
    with httpx.Client(timeout=30) as http:
        created = create_key(http, replicas[0], name="rpm", limits={"requests_per_minute": {"models": RPM}})
        secret = created["key"]
        created_at, probes = time.monotonic(), 0
        deadline = created_at + 5
        while True:
            statuses = [status_on(http, url, secret) for url in replicas]
            probes += statuses.count(200)  # each took one of the burst
            if 401 not in statuses:
                break
            assert time.monotonic() < deadline, "a new key was not accepted by every replica"
            time.sleep(0.05)

    # 8 loops per replica: the load asks for more than the limit all along, the burst first.
    hammer = subprocess.run(
        [sys.executable, "-m", "tests.helpers.hammer", "6", "8", *replicas],
        env={**os.environ, "HAMMER_KEY": secret},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    since_created = time.monotonic() - created_at
    result = json.loads(hammer.stdout)
    statuses, elapsed = result["statuses"], result["elapsed"]
    admitted, refused = statuses.count(200), statuses.count(429)
    assert admitted + refused == len(statuses), {s: statuses.count(s) for s in set(statuses)}
    allowed = RPM + since_created * RPM / 60 + 1 - probes  # GCRA: the burst of N, then one per interval
    assert admitted <= allowed
    assert admitted >= 0.95 * (RPM + elapsed * RPM / 60 - probes), (admitted, allowed)
    with httpx.Client(timeout=30, headers=bearer(secret)) as http:
        # What refilled since the hammer stopped passes; the limit then refuses again, whichever replica.
        answers = [http.get(f"{url}/v1/models") for _ in range(20) for url in replicas]
    over = next(a for a in answers if a.status_code == 429)
    assert over.json()["error"]["code"] == "rate_limit_exceeded" and over.headers["retry-after"] == "1"


async def test_usage_equals_what_the_upstream_counted_after_a_replica_is_killed_mid_load(
    replica_processes: list[GatewayProcess], hunyuan_simulator: RunningHunyuanSimulator
) -> None:
    """Each replica is called with a key of its own, so each key's record can be set against the simulator's count
    of the same answers (by the answer's id). The live replicas' records equal it exactly. The killed replica may
    have had calls the upstream answered (and counted) whose answer it never passed on: those, and only those,
    are counted upstream but not answered; its record holds every answer its clients received, and at most those
    unanswered calls besides (one whose record was written just before the kill cut its answer off)."""
    hunyuan_simulator.config.ttft_seconds = 0.2  # calls overlap, so the kill finds some in flight
    urls = [gateway.base_url for gateway in replica_processes]
    with httpx.Client(timeout=30) as http:
        created = [create_key(http, urls[0], name=f"load-{n}") for n in range(3)]
        secrets = [key["key"] for key in created]
        deadline = time.monotonic() + 5
        while any(status_on(http, url, secret) != 200 for url in urls for secret in secrets):
            assert time.monotonic() < deadline, "a new key was not accepted by every replica"
            time.sleep(0.05)

    # Four callers per replica, five questions each, one after the other: about 1 s of load.
    answered_by = [0, 0, 0]
    async with httpx.AsyncClient(timeout=60, headers={"Cache-Control": "no-cache"}) as client:

        async def caller(replica: int, n: int) -> list[httpx.Response | None]:
            answers: list[httpx.Response | None] = []
            for i in range(5):
                content = f"question {replica} {n} {i}"
                body = {"model": "hy3-preview", "messages": [{"role": "user", "content": content}]}
                try:
                    url = f"{urls[replica]}/v1/chat/completions"
                    answers.append(await client.post(url, json=body, headers=bearer(secrets[replica])))
                    answered_by[replica] += 1
                except httpx.HTTPError:
                    answers.append(None)  # asked the killed replica
            return answers

        async def kill() -> None:
            # Mid-load: once each of its four callers has had about one answer, with four questions each to go.
            await until(lambda: answered_by[2] >= 4, what="replica 2's first answers")
            await asyncio.to_thread(replica_processes[2].kill)

        callers = await asyncio.gather(*(caller(r, n) for r in range(3) for n in range(4)), kill())
    by_replica = [[a for answers in callers[r * 4 : r * 4 + 4] for a in answers] for r in range(3)]
    diagnostics = "\n".join(gateway.tail() for gateway in replica_processes)
    for replica in (0, 1):
        assert all(a is not None and a.status_code == 200 for a in by_replica[replica]), diagnostics
    assert all(a is None or a.status_code == 200 for a in by_replica[2]), diagnostics
    cut_off = sum(a is None for a in by_replica[2])  # clients that saw the kill as a connection error
    assert 0 < cut_off < 20, "the kill did not land mid-load"

    counted = dict(hunyuan_simulator.stats.usage_by_answer)  # answer id -> the usage the upstream counted
    answered = [[a.json() for a in group if a is not None] for group in by_replica]
    assert all(answer["id"] in counted for group in answered for answer in group)
    unanswered = [counted[i] for i in counted.keys() - {answer["id"] for group in answered for answer in group}]
    # Counted upstream, never answered: only calls of clients that saw the kill, at most the one call each of the
    # killed replica's four callers had in flight.
    assert len(unanswered) <= min(cut_off, 4)

    rows = usage_by_key(urls[0])
    for replica, group in enumerate(answered):
        row = rows[created[replica]["prefix"]]
        received = totals([counted[answer["id"]] for answer in group])
        assert received == totals([answer["usage"] for answer in group])  # what the clients got, as counted
        recorded = (row["requests"], row["prompt_tokens"], row["completion_tokens"])
        if replica < 2:
            assert recorded == received, (replica, recorded, received)
        else:  # the killed replica: its answers are all on record, and nothing the upstream did not count
            upper = tuple(a + b for a, b in zip(received, totals(unanswered), strict=True))
            assert all(r <= got <= u for r, got, u in zip(received, recorded, upper, strict=True)), (recorded, received)


def totals(usages: list[dict[str, Any]]) -> tuple[int, int, int]:
    """(requests, prompt tokens, completion tokens) of chat `usage` objects."""
    return len(usages), sum(u["prompt_tokens"] for u in usages), sum(u["completion_tokens"] for u in usages)


def usage_by_key(url: str) -> dict[str, dict[str, Any]]:
    """Today's usage rows of every key (the admin sees all), by key prefix."""
    day = time.strftime("%Y-%m-%d", time.gmtime())
    with httpx.Client(timeout=30) as http:
        answer = http.get(
            f"{url}/v1/usage", params={"start": day, "end": day, "group_by": "key"}, headers=bearer(ADMIN)
        )
    assert answer.status_code == 200, answer.text
    return {row["key_prefix"]: row for row in answer.json()["data"]}
