"""fal's Platform API request history over real HTTP: the Pika simulator serves it as fal documents it (ended
requests only, payloads on request, cursor pages, the queue's key), and the gateway's client reads every page."""

from __future__ import annotations

import time

import httpx
import pytest
from pydantic import SecretStr

from gateway.errors import GatewayError
from gateway.upstreams.fal import VideoUnavailableError, VideoUpstreamError
from gateway.upstreams.fal_history import FalRequestHistory
from localtriton.ports import free_port
from simulators.pika import DEFAULT_MODEL_PATH
from tests.helpers.pika_fixtures import RunningPikaSimulator

pytestmark = pytest.mark.slow

KEY = "sim-key"
AUTH = {"Authorization": f"Key {KEY}"}
PATH = "/v1/models/requests/by-endpoint"


def submit(sim: RunningPikaSimulator, prompt: str) -> str:
    answer = httpx.post(sim.submit_url, json={"prompt": prompt}, headers=AUTH)
    assert answer.status_code == 200, answer.text
    request_id: str = answer.json()["request_id"]
    return request_id


def ended(sim: RunningPikaSimulator, request_ids: list[str], timeout: float = 5.0) -> None:
    jobs = sim.app.state.simulator.jobs
    deadline = time.monotonic() + timeout
    while not all(jobs[request_id].ended_at is not None for request_id in request_ids):
        assert time.monotonic() < deadline, "jobs did not end"
        time.sleep(0.02)


@pytest.fixture
def sim(pika_simulator: RunningPikaSimulator) -> RunningPikaSimulator:
    pika_simulator.config.api_key = KEY
    pika_simulator.config.job_seconds = 0.05
    return pika_simulator


def test_the_history_lists_ended_requests_with_their_payloads_newest_first(sim: RunningPikaSimulator) -> None:
    done = [submit(sim, f"scene {i}") for i in range(3)]
    sim.config.job_seconds = 30.0
    running = submit(sim, "still running")
    ended(sim, done)
    url = f"{sim.base_url}{PATH}"
    page = httpx.get(url, params={"endpoint_id": DEFAULT_MODEL_PATH, "expand": "payloads"}, headers=AUTH).json()
    assert [item["request_id"] for item in page["items"]] == done[::-1]
    assert running not in {item["request_id"] for item in page["items"]}  # listed once it has ended
    first = page["items"][-1]
    assert first["endpoint_id"] == DEFAULT_MODEL_PATH and first["status_code"] == 200
    assert first["json_input"] == {"prompt": "scene 0"} and first["json_output"]["video"]["url"]
    assert first["sent_at"] <= first["started_at"] <= first["ended_at"] and first["duration"] >= 0
    assert page["has_more"] is False and page["next_cursor"] is None
    bare = httpx.get(url, params={"endpoint_id": DEFAULT_MODEL_PATH}, headers=AUTH).json()
    assert "json_input" not in bare["items"][0]  # payloads only when expanded
    assert httpx.get(url, params={"endpoint_id": "fal-ai/other"}, headers=AUTH).json()["items"] == []
    assert sim.stats.history_calls == 3


def test_the_history_pages_by_cursor_filters_by_status_and_time_and_refuses_bad_queries(
    sim: RunningPikaSimulator,
) -> None:
    done = [submit(sim, f"scene {i}") for i in range(3)]
    sim.config.fail_next = 1
    failed = submit(sim, "fails")
    ended(sim, [*done, failed])
    url = f"{sim.base_url}{PATH}"
    query = {"endpoint_id": DEFAULT_MODEL_PATH, "status": "success", "limit": "2"}
    first = httpx.get(url, params=query, headers=AUTH).json()
    assert len(first["items"]) == 2 and first["has_more"] is True and first["next_cursor"] == "Mg=="
    second = httpx.get(url, params={**query, "cursor": first["next_cursor"]}, headers=AUTH).json()
    assert [item["request_id"] for item in first["items"] + second["items"]] == done[::-1]
    assert second["has_more"] is False
    errors = httpx.get(url, params={"endpoint_id": DEFAULT_MODEL_PATH, "status": "error"}, headers=AUTH).json()
    assert [(item["request_id"], item["status_code"]) for item in errors["items"]] == [(failed, 500)]
    later = httpx.get(url, params={"endpoint_id": DEFAULT_MODEL_PATH, "start": "2999-01-01"}, headers=AUTH)
    assert later.json()["items"] == []
    assert httpx.get(url, params={"endpoint_id": DEFAULT_MODEL_PATH}).status_code == 401
    for bad in ({}, {"endpoint_id": DEFAULT_MODEL_PATH, "limit": "0"}, {"endpoint_id": "x", "cursor": "?"}):
        answer = httpx.get(url, params=bad, headers=AUTH)
        assert answer.status_code == 422 and answer.json()["detail"][0]["loc"][0] == "query", answer.text


async def test_the_gateway_reads_every_page_of_the_history(sim: RunningPikaSimulator) -> None:
    since = time.time()
    done = [submit(sim, f"scene {i}") for i in range(105)]  # two pages of 100
    ended(sim, done)
    async with FalRequestHistory(sim.base_url, SecretStr(KEY), DEFAULT_MODEL_PATH) as history:
        records = await history.succeeded_since(since - 1.0)
    assert sorted(record.request_id for record in records) == sorted(done)
    by_id = {record.request_id: record for record in records}
    assert by_id[done[7]].json_input == {"prompt": "scene 7"}
    sent = by_id[done[7]].sent_at
    assert sent is not None and since - 1.0 <= sent <= time.time()
    async with FalRequestHistory(sim.base_url, SecretStr(KEY), DEFAULT_MODEL_PATH, max_pages=1) as short:
        with pytest.raises(VideoUpstreamError, match="more than 100 requests"):
            await short.succeeded_since(since - 1.0)
    async with FalRequestHistory(sim.base_url, SecretStr("wrong"), DEFAULT_MODEL_PATH) as wrong:
        with pytest.raises(GatewayError) as refused:
            await wrong.succeeded_since(since)
        assert "wrong" not in refused.value.message
    gone = f"http://127.0.0.1:{free_port()}"
    async with FalRequestHistory(gone, SecretStr(KEY), DEFAULT_MODEL_PATH, timeout_seconds=1.0) as down:
        with pytest.raises(VideoUnavailableError):
            await down.succeeded_since(since)
    assert sim.stats.history_calls == 2 + 1 and sim.stats.unauthorized == 1  # the refused one is not served
