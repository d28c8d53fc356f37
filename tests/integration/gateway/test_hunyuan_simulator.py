"""The Hunyuan simulator over real HTTP: the protocol it speaks and each way it can be told to misbehave."""

from __future__ import annotations

import asyncio
import json
import math
import os
import subprocess
import sys
import time
from typing import Any

import httpx
import pytest

from localtriton.ports import free_port
from simulators.hunyuan import echo_reply, split_pieces
from tests.helpers.conditions import wait_until
from tests.helpers.hunyuan_fixtures import RunningHunyuanSimulator

pytestmark = pytest.mark.slow

MODEL = "hy3-preview"
PROMPT = "hello 世界"
ANSWER = echo_reply([{"role": "user", "content": PROMPT}])


def chat_request(text: str = PROMPT, **fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": text}], **fields}


def sse_data(body: str) -> list[str]:
    """The data of each event in an SSE body, in order."""
    assert body.endswith("\n\n")
    return [event.removeprefix("data: ") for event in body.split("\n\n") if event]


def streamed_content(chunks: list[dict[str, Any]]) -> str:
    return "".join(chunk["choices"][0]["delta"].get("content", "") for chunk in chunks)


def assert_error(response: httpx.Response, status: int, code: str | None = None) -> None:
    assert response.status_code == status
    error = response.json()["error"]
    assert isinstance(error["message"], str) and error["message"]
    assert isinstance(error["type"], str) and error["type"]
    assert error["code"] == code if code is not None else error["code"]


def test_non_streaming_answer_has_the_openai_shape(
    hunyuan_simulator: RunningHunyuanSimulator, http: httpx.Client
) -> None:
    response = http.post(f"{hunyuan_simulator.base_url}/chat/completions", json=chat_request())

    assert response.status_code == 200
    data = response.json()
    assert data["object"] == "chat.completion"
    assert data["model"] == MODEL
    assert isinstance(data["id"], str) and isinstance(data["created"], int)
    assert data["choices"] == [
        {"index": 0, "message": {"role": "assistant", "content": ANSWER}, "finish_reason": "stop"}
    ]
    completion_tokens = len(split_pieces(ANSWER))
    prompt_tokens = math.ceil(len(PROMPT) / 4)
    assert data["usage"] == {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
    assert hunyuan_simulator.stats.requests_total == 1
    assert hunyuan_simulator.stats.requests_by_model == {MODEL: 1}


def test_stream_sends_role_content_and_final_chunks_then_done(
    hunyuan_simulator: RunningHunyuanSimulator, http: httpx.Client
) -> None:
    with http.stream("POST", f"{hunyuan_simulator.base_url}/chat/completions", json=chat_request(stream=True)) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        body = r.read().decode()

    data = sse_data(body)
    assert data[-1] == "[DONE]"
    chunks = [json.loads(item) for item in data[:-1]]
    assert {chunk["object"] for chunk in chunks} == {"chat.completion.chunk"}
    assert len({chunk["id"] for chunk in chunks}) == 1
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert streamed_content(chunks) == ANSWER
    assert [chunk["choices"][0]["finish_reason"] for chunk in chunks[:-1]] == [None] * (len(chunks) - 1)
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert not any("usage" in chunk for chunk in chunks)  # not asked for: OpenAI streams carry none
    stats = hunyuan_simulator.stats
    wait_until(lambda: stats.streams_completed == 1)
    assert (stats.streams_open, stats.in_flight, stats.streams_cancelled) == (0, 0, 0)
    assert list(stats.usage_by_answer) == [chunks[0]["id"]]


def test_a_stream_asked_for_usage_ends_with_a_usage_chunk_without_choices(
    hunyuan_simulator: RunningHunyuanSimulator, http: httpx.Client
) -> None:
    body = chat_request(stream=True, stream_options={"include_usage": True})
    with http.stream("POST", f"{hunyuan_simulator.base_url}/chat/completions", json=body) as r:
        data = sse_data(r.read().decode())

    assert data[-1] == "[DONE]"
    chunks = [json.loads(item) for item in data[:-1]]
    *answer, usage = chunks
    assert usage["choices"] == [] and usage["object"] == "chat.completion.chunk" and usage["id"] == answer[0]["id"]
    assert usage["usage"]["completion_tokens"] == len(split_pieces(ANSWER)) == len(answer) - 2
    assert answer[-1]["choices"][0]["finish_reason"] == "stop" and not any("usage" in c for c in answer)
    assert hunyuan_simulator.stats.usage_by_answer == {usage["id"]: usage["usage"]}
    refused = http.post(f"{hunyuan_simulator.base_url}/chat/completions", json=chat_request(stream_options=True))
    assert_error(refused, 400)


def test_first_chunk_comes_after_the_ttft_and_pieces_are_paced(
    hunyuan_simulator: RunningHunyuanSimulator, http: httpx.Client
) -> None:
    hunyuan_simulator.config.ttft_seconds = 0.3
    hunyuan_simulator.config.tokens_per_second = 20
    hunyuan_simulator.config.reply = reply = "一二三四五六七八九十" * 2
    pieces = len(split_pieces(reply))  # 11, 50 ms apart after the first
    content_times: list[float] = []
    start = time.monotonic()
    with http.stream("POST", f"{hunyuan_simulator.base_url}/chat/completions", json=chat_request(stream=True)) as r:
        for line in r.iter_lines():
            if '"content":"' in line and '"content":""' not in line:
                content_times.append(time.monotonic())
    end = time.monotonic()

    assert len(content_times) == pieces
    assert 0.25 <= content_times[0] - start < 0.3 + 0.5
    assert content_times[-1] - content_times[0] >= 0.8 * (pieces - 1) / 20
    assert end - content_times[0] >= 0.8 * (pieces - 1) / 20


def test_wrong_or_missing_key_is_refused_with_401(
    hunyuan_simulator: RunningHunyuanSimulator, http: httpx.Client
) -> None:
    hunyuan_simulator.config.api_key = "sk-right"
    url = f"{hunyuan_simulator.base_url}/chat/completions"

    assert_error(http.post(url, json=chat_request(), headers={"Authorization": "Bearer sk-wrong"}), 401)
    assert_error(http.post(url, json=chat_request()), 401)
    assert_error(http.get(f"{hunyuan_simulator.base_url}/models"), 401)
    assert http.post(url, json=chat_request(), headers={"Authorization": "Bearer sk-right"}).status_code == 200


def test_models_are_listed(hunyuan_simulator: RunningHunyuanSimulator, http: httpx.Client) -> None:
    response = http.get(f"{hunyuan_simulator.base_url}/models")

    assert response.status_code == 200
    assert response.json()["object"] == "list"
    assert {"hy3-preview", "deepseek-v4-pro", "deepseek-v4-flash"} <= {m["id"] for m in response.json()["data"]}


def test_bad_requests_get_400(hunyuan_simulator: RunningHunyuanSimulator, http: httpx.Client) -> None:
    url = f"{hunyuan_simulator.base_url}/chat/completions"

    assert_error(http.post(url, json=chat_request() | {"model": "gpt-4o"}), 400, "model_not_found")
    assert_error(http.post(url, json={"model": MODEL, "messages": []}), 400)
    assert_error(http.post(url, json=chat_request(max_tokens=0)), 400)
    assert_error(http.post(url, content=b"{not json", headers={"Content-Type": "application/json"}), 400)


# Retired names (Tencent's migration notice, cloud.tencent.com product 1729 doc 131925); hunyuan-role is the old
# name of today's hunyuan-role-latest.
@pytest.mark.parametrize("retired", ["hunyuan-t1-latest", "hunyuan-large", "hunyuan-functioncall", "hunyuan-role"])
def test_retired_hunyuan_models_are_unknown_models(
    retired: str, hunyuan_simulator: RunningHunyuanSimulator, http: httpx.Client
) -> None:
    """TokenHub serves hy3-preview in place of the hunyuan-* models that went offline on 2026-06-22."""
    url = f"{hunyuan_simulator.base_url}/chat/completions"
    response = http.post(url, json=chat_request(model=retired))

    assert_error(response, 400, "model_not_found")
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["source"] == "client" and error["request_id"]
    assert retired in error["message"]
    assert retired not in {m["id"] for m in http.get(f"{hunyuan_simulator.base_url}/models").json()["data"]}
    assert http.post(url, json=chat_request()).status_code == 200


async def test_qps_quota_answers_429_with_retry_after(
    hunyuan_simulator: RunningHunyuanSimulator, http: httpx.Client
) -> None:
    hunyuan_simulator.config.qps_quota = 5
    url = f"{hunyuan_simulator.base_url}/chat/completions"

    async with httpx.AsyncClient(timeout=10) as client:
        responses = await asyncio.gather(*(client.post(url, json=chat_request()) for _ in range(15)))

    refused = [r for r in responses if r.status_code == 429]
    assert {r.status_code for r in responses} == {200, 429}
    for response in refused:
        assert_error(response, 429, "rate_limit_exceeded")
        assert response.headers["Retry-After"] == "1"
    stats = hunyuan_simulator.stats
    assert stats.rate_limited == len(refused)
    assert stats.max_requests_in_any_window() > 5
    assert stats.max_requests_in_any_window(accepted_only=True) <= 5
    await asyncio.sleep(1.05)  # the quota's 1 s window rolls on: its length is what is tested
    assert http.post(url, json=chat_request()).status_code == 200


def test_fail_next_answers_the_listed_statuses_in_order(
    hunyuan_simulator: RunningHunyuanSimulator, http: httpx.Client
) -> None:
    hunyuan_simulator.config.fail_next = [429, 500, 503, 200, 400]
    url = f"{hunyuan_simulator.base_url}/chat/completions"

    responses = [http.post(url, json=chat_request()) for _ in range(6)]

    assert [r.status_code for r in responses] == [429, 500, 503, 200, 400, 200]
    for response in (responses[0], responses[1], responses[2], responses[4]):
        assert_error(response, response.status_code)
    assert responses[0].headers["Retry-After"] == "1"
    assert hunyuan_simulator.config.fail_next == []


def test_error_and_rate_limit_rates(hunyuan_simulator: RunningHunyuanSimulator, http: httpx.Client) -> None:
    url = f"{hunyuan_simulator.base_url}/chat/completions"
    hunyuan_simulator.config.error_rate = 1.0
    assert_error(http.post(url, json=chat_request()), 500)
    hunyuan_simulator.config.rate_limit_rate = 1.0
    assert_error(http.post(url, json=chat_request()), 429)
    hunyuan_simulator.config.error_rate = hunyuan_simulator.config.rate_limit_rate = 0.5

    statuses = {http.post(url, json=chat_request()).status_code for _ in range(30)}

    assert statuses == {200, 429, 500}


def test_concurrency_limit_refuses_requests_beyond_it(
    hunyuan_simulator: RunningHunyuanSimulator, http: httpx.Client
) -> None:
    hunyuan_simulator.config.max_concurrency = 1
    hunyuan_simulator.config.ttft_seconds = 0.3
    url = f"{hunyuan_simulator.base_url}/chat/completions"

    with http.stream("POST", url, json=chat_request(stream=True)) as first:
        assert first.status_code == 200
        assert_error(http.post(url, json=chat_request()), 429, "concurrency_limit_exceeded")
        first.read()
    wait_until(lambda: hunyuan_simulator.stats.in_flight == 0)
    assert http.post(url, json=chat_request()).status_code == 200
    assert hunyuan_simulator.stats.max_in_flight == 1


def test_max_tokens_and_finish_reason_override(hunyuan_simulator: RunningHunyuanSimulator, http: httpx.Client) -> None:
    url = f"{hunyuan_simulator.base_url}/chat/completions"

    cut = http.post(url, json=chat_request(max_tokens=3)).json()
    assert cut["choices"][0]["finish_reason"] == "length"
    assert cut["usage"]["completion_tokens"] == 3
    assert cut["choices"][0]["message"]["content"] == "".join(split_pieces(ANSWER)[:3])

    hunyuan_simulator.config.finish_reason = "length"
    assert http.post(url, json=chat_request()).json()["choices"][0]["finish_reason"] == "length"


def test_dropped_stream_ends_without_done(hunyuan_simulator: RunningHunyuanSimulator, http: httpx.Client) -> None:
    hunyuan_simulator.config.drop_stream_after_chunks = 3
    lines: list[str] = []

    with http.stream("POST", f"{hunyuan_simulator.base_url}/chat/completions", json=chat_request(stream=True)) as r:
        assert r.status_code == 200
        with pytest.raises(httpx.RemoteProtocolError):
            lines.extend(r.iter_lines())

    data = [line for line in lines if line.startswith("data: ")]
    assert len(data) == 3
    assert "data: [DONE]" not in data
    wait_until(lambda: hunyuan_simulator.stats.streams_dropped == 1)
    assert hunyuan_simulator.stats.streams_open == 0


def test_split_utf8_cuts_a_character_across_writes(
    hunyuan_simulator: RunningHunyuanSimulator, http: httpx.Client
) -> None:
    hunyuan_simulator.config.split_utf8 = True
    writes: list[bytes] = []

    with http.stream("POST", f"{hunyuan_simulator.base_url}/chat/completions", json=chat_request(stream=True)) as r:
        writes.extend(r.iter_raw())

    def decodes(data: bytes) -> bool:
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            return False
        return True

    assert not all(decodes(write) for write in writes)
    body = b"".join(writes).decode("utf-8")
    data = sse_data(body)
    assert data[-1] == "[DONE]"
    assert streamed_content([json.loads(item) for item in data[:-1]]) == ANSWER


def test_client_disconnect_is_counted_as_cancelled(
    hunyuan_simulator: RunningHunyuanSimulator, http: httpx.Client
) -> None:
    hunyuan_simulator.config.tokens_per_second = 10  # the whole answer would take seconds

    with http.stream("POST", f"{hunyuan_simulator.base_url}/chat/completions", json=chat_request(stream=True)) as r:
        for line in r.iter_lines():
            if '"content":"E' in line:
                break

    stats = hunyuan_simulator.stats
    wait_until(lambda: stats.streams_cancelled == 1)
    assert (stats.streams_open, stats.in_flight, stats.streams_completed) == (0, 0, 0)


def test_unknown_fields_are_accepted_and_recorded(
    hunyuan_simulator: RunningHunyuanSimulator, http: httpx.Client
) -> None:
    tool = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object", "properties": {}}}}
    body = chat_request(
        temperature=0.5,
        top_p=0.9,
        tools=[tool],
        enable_enhancement=False,
        citation=True,
        x_custom={"nested": [1, "二"]},
    )

    response = http.post(f"{hunyuan_simulator.base_url}/chat/completions", json=body, headers={"X-Request-Id": "abc"})

    assert response.status_code == 200
    assert hunyuan_simulator.stats.last_request == body
    assert hunyuan_simulator.stats.last_headers["x-request-id"] == "abc"


def test_command_line_serves_the_simulator(http: httpx.Client) -> None:
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "simulators.hunyuan",
        "--port",
        str(port),
        "--ttft",
        "0",
        "--log-level",
        "warning",
    ]
    env = {**os.environ, "PYTHONWARNINGS": "error::RuntimeWarning"}  # runpy warns if the module is imported twice
    with subprocess.Popen(command, env=env, stderr=subprocess.PIPE) as process:
        try:
            wait_until(lambda: ready(http, f"http://127.0.0.1:{port}/v1/models"), timeout=20)
            response = http.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=chat_request())
            assert response.json()["choices"][0]["message"]["content"] == ANSWER
        finally:
            process.terminate()
            _, stderr = process.communicate(timeout=10)
    assert b"Warning" not in stderr


def ready(http: httpx.Client, url: str) -> bool:
    try:
        return http.get(url).status_code == 200
    except httpx.TransportError:
        return False
