"""POST /v1/chat/completions end to end: real gateway in front of the Hunyuan simulator."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from pydantic import SecretStr

from gateway.settings import CacheSettings, ChatSettings, RedisSettings
from localtriton.server import TritonProcess
from tests.helpers.hunyuan_fixtures import RunningHunyuanSimulator
from tests.helpers.running_gateway import RunningGateway

pytestmark = pytest.mark.slow

KEY = "sim-key-secret"


def llm(simulator: RunningHunyuanSimulator, **overrides: Any) -> ChatSettings:
    simulator.config.api_key = KEY
    values: dict[str, Any] = {"base_url": simulator.base_url, "api_key": SecretStr(KEY), "retry_base_seconds": 0.01}
    return ChatSettings(**{**values, **overrides})


@pytest.fixture
def chat_gateway(
    hunyuan_simulator: RunningHunyuanSimulator, triton: TritonProcess, gateway_factory: Callable[..., RunningGateway]
) -> RunningGateway:
    return gateway_factory(triton.grpc_url, chat=llm(hunyuan_simulator), cache=CacheSettings(embedding_cache_mb=0))


def ask(text: str, **extra: Any) -> dict[str, Any]:
    return {"model": "hy3-preview", "messages": [{"role": "user", "content": text}], **extra}


def sse_payloads(lines: Iterator[str]) -> list[str]:
    return [line[len("data: ") :] for line in lines if line.startswith("data: ")]


def test_non_streamed_answer_is_proxied_and_then_served_from_the_exact_cache(
    chat_gateway: RunningGateway, hunyuan_simulator: RunningHunyuanSimulator, http: httpx.Client
) -> None:
    url = f"{chat_gateway.base_url}/v1/chat/completions"
    first = http.post(url, json=ask("What is Triton?", enable_enhancement=False, temperature=0.2))
    assert first.status_code == 200, first.text
    assert first.headers["x-cache"] == "miss"
    body = first.json()
    assert body["object"] == "chat.completion" and "What is Triton?" in body["choices"][0]["message"]["content"]
    assert hunyuan_simulator.stats.last_request is not None
    assert hunyuan_simulator.stats.last_request["enable_enhancement"] is False  # unknown fields pass through
    calls = hunyuan_simulator.stats.requests_total
    second = http.post(url, json=ask("What is Triton?", enable_enhancement=False, temperature=0.2))
    assert second.headers["x-cache"] == "hit" and second.json() == body
    assert hunyuan_simulator.stats.requests_total == calls
    bypass = http.post(
        url,
        json=ask("What is Triton?", enable_enhancement=False, temperature=0.2),
        headers={"Cache-Control": "no-cache"},
    )
    assert bypass.headers["x-cache"] == "miss" and hunyuan_simulator.stats.requests_total == calls + 1


def test_stream_forwards_chunks_as_they_arrive_and_replays_hits_chunk_by_chunk(
    chat_gateway: RunningGateway, hunyuan_simulator: RunningHunyuanSimulator, http: httpx.Client
) -> None:
    hunyuan_simulator.config.ttft_seconds = 0.1
    hunyuan_simulator.config.tokens_per_second = 40
    request = ask("Tell me a long story about dynamic batching " * 3, stream=True)
    with httpx.Client(timeout=30) as direct:
        upstream = direct.post(
            f"{hunyuan_simulator.base_url}/chat/completions", json=request, headers={"Authorization": f"Bearer {KEY}"}
        )
    expected = sse_payloads(iter(upstream.text.splitlines()))
    started = time.monotonic()
    first_at = None
    with http.stream("POST", f"{chat_gateway.base_url}/v1/chat/completions", json=request) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.headers["x-cache"] == "miss"
        lines = []
        for line in response.iter_lines():
            if line.startswith("data: ") and first_at is None:
                first_at = time.monotonic() - started
            lines.append(line)
    total = time.monotonic() - started
    payloads = sse_payloads(iter(lines))
    assert payloads[-1] == "[DONE]"
    assert [json.loads(p)["choices"] for p in payloads[:-1]] == [json.loads(p)["choices"] for p in expected[:-1]]
    assert first_at is not None and first_at < total / 2  # the first token did not wait for the last
    calls = hunyuan_simulator.stats.requests_total
    replay = http.post(f"{chat_gateway.base_url}/v1/chat/completions", json=request)
    assert replay.headers["x-cache"] == "hit" and hunyuan_simulator.stats.requests_total == calls
    replayed = sse_payloads(iter(replay.text.splitlines()))
    assert [json.loads(p)["choices"] for p in replayed[:-1]] == [json.loads(p)["choices"] for p in expected[:-1]]


def test_finished_streams_give_their_upstream_connection_back_to_the_pool(
    hunyuan_simulator: RunningHunyuanSimulator,
    triton: TritonProcess,
    gateway_factory: Callable[..., RunningGateway],
    http: httpx.Client,
) -> None:
    cache = CacheSettings(embedding_cache_mb=0, chat_cache_mb=0)  # no cache: streams still count their tokens
    base = gateway_factory(triton.grpc_url, chat=llm(hunyuan_simulator), cache=cache).base_url
    url = f"{base}/v1/chat/completions"

    def completion_tokens() -> float:  # the registry is per process: compare, do not read absolutes
        line = 'gateway_chat_tokens_total{kind="completion",model="hy3-preview"} '
        text = http.get(f"{base}/metrics").text
        return float(text.split(line)[1].split()[0]) if line in text else 0.0

    before = completion_tokens()
    for index in range(3):
        with http.stream("POST", url, json=ask(f"question {index}", stream=True)) as response:
            assert sse_payloads(response.iter_lines())[-1] == "[DONE]"
    assert http.post(url, json=ask("question 3")).status_code == 200
    # one connection for all four calls: none was closed (and none re-opened with a new handshake)
    assert hunyuan_simulator.stats.requests_total == 4
    assert len(hunyuan_simulator.stats.client_addresses) == 1
    assert completion_tokens() - before >= 8  # each echo answer has at least 2 tokens


def test_client_disconnect_cancels_the_upstream_stream(
    chat_gateway: RunningGateway, hunyuan_simulator: RunningHunyuanSimulator
) -> None:
    hunyuan_simulator.config.tokens_per_second = 5
    with (
        httpx.Client(timeout=30) as client,
        client.stream(
            "POST", f"{chat_gateway.base_url}/v1/chat/completions", json=ask("slow answer please " * 5, stream=True)
        ) as response,
    ):
        for line in response.iter_lines():
            if line.startswith("data: "):
                break
    deadline = time.monotonic() + 5
    while hunyuan_simulator.stats.streams_cancelled < 1:
        assert time.monotonic() < deadline, "the upstream stream was not cancelled"
        time.sleep(0.05)


def test_broken_upstream_stream_ends_with_an_error_event_and_no_done(
    chat_gateway: RunningGateway, hunyuan_simulator: RunningHunyuanSimulator, http: httpx.Client
) -> None:
    hunyuan_simulator.config.drop_stream_after_chunks = 2
    response = http.post(f"{chat_gateway.base_url}/v1/chat/completions", json=ask("break please", stream=True))
    payloads = sse_payloads(iter(response.text.splitlines()))
    assert response.status_code == 200 and "[DONE]" not in payloads and len(payloads) == 3
    assert "stream" in json.loads(payloads[-1])["error"]["message"]
    assert hunyuan_simulator.stats.requests_total == 1  # after the first byte there is no retry


def test_slow_silent_and_unreachable_upstreams_fail_in_the_error_shape(
    hunyuan_simulator: RunningHunyuanSimulator,
    triton: TritonProcess,
    gateway_factory: Callable[..., RunningGateway],
    http: httpx.Client,
) -> None:
    settings = llm(hunyuan_simulator, first_byte_timeout_seconds=0.3, max_retries=0)
    url = f"{gateway_factory(triton.grpc_url, chat=settings).base_url}/v1/chat/completions"
    hunyuan_simulator.config.ttft_seconds = 1.0  # no first byte within 0.3 s
    slow = http.post(url, json=ask("slow start"))
    assert slow.status_code == 504 and "in time" in slow.json()["error"]["message"]
    hunyuan_simulator.config.ttft_seconds = 0.0
    hunyuan_simulator.config.tokens_per_second = 2  # pieces 0.5 s apart: silent for longer than 0.3 s
    with http.stream("POST", url, json=ask("a slow trickle of words", stream=True)) as response:
        assert response.status_code == 200
        payloads = sse_payloads(response.iter_lines())
    assert "[DONE]" not in payloads and "stream" in json.loads(payloads[-1])["error"]["message"]
    unreachable = ChatSettings(base_url="http://127.0.0.1:9/v1", api_key=SecretStr(KEY), retry_base_seconds=0.01)
    down = http.post(
        f"{gateway_factory(triton.grpc_url, chat=unreachable).base_url}/v1/chat/completions", json=ask("hi")
    )
    assert down.status_code == 503 and "unreachable" in down.json()["error"]["message"]
    assert KEY not in slow.text + down.text


def test_429_and_5xx_before_the_first_byte_are_retried_at_the_quotas_rate(
    hunyuan_simulator: RunningHunyuanSimulator,
    triton: TritonProcess,
    gateway_factory: Callable[..., RunningGateway],
    http: httpx.Client,
) -> None:
    from gateway.settings import ChatQuotaSettings

    quota = ChatQuotaSettings(requests_per_second=5, rate_margin_seconds=0)  # arrivals 200 ms apart
    gateway = gateway_factory(triton.grpc_url, chat=llm(hunyuan_simulator, quota=quota))
    hunyuan_simulator.config.fail_next = [429, 500]  # the 429 says Retry-After: 1, the 500 nothing (10-20 ms)
    response = http.post(f"{gateway.base_url}/v1/chat/completions", json=ask("retry me"))
    assert response.status_code == 200
    assert hunyuan_simulator.stats.requests_total == 3
    arrivals = hunyuan_simulator.stats.arrival_times
    assert arrivals[1] - arrivals[0] >= 1.0
    assert min(later - earlier for earlier, later in itertools.pairwise(arrivals)) >= 0.19  # each retry paced


def test_breaker_opens_fails_fast_and_recovers_and_fallback_is_used(
    hunyuan_simulator: RunningHunyuanSimulator,
    triton: TritonProcess,
    gateway_factory: Callable[..., RunningGateway],
    http: httpx.Client,
) -> None:
    settings = llm(hunyuan_simulator, max_retries=0, breaker_failures=2, breaker_reset_seconds=0.5)
    gateway = gateway_factory(triton.grpc_url, chat=settings)
    url = f"{gateway.base_url}/v1/chat/completions"
    hunyuan_simulator.config.fail_next = [500, 500]
    assert http.post(url, json=ask("a")).status_code == 502
    assert http.post(url, json=ask("b")).status_code == 502
    calls = hunyuan_simulator.stats.requests_total
    fast = http.post(url, json=ask("c"))
    assert fast.status_code == 503 and "is failing" in fast.json()["error"]["message"]
    assert fast.headers["retry-after"] == "1"  # the 0.5 s left before the probe, rounded up
    assert hunyuan_simulator.stats.requests_total == calls  # open: no upstream call
    time.sleep(0.6)  # past the breaker's reset time (0.5 s), which is what is tested: the next call probes
    assert http.post(url, json=ask("d")).status_code == 200  # half-open probe succeeds and closes it
    assert http.post(url, json=ask("e")).status_code == 200

    fallback = gateway_factory(
        triton.grpc_url,
        chat=llm(hunyuan_simulator, max_retries=0, fallback_models="deepseek-v4-pro=deepseek-v4-flash"),
    )
    hunyuan_simulator.config.fail_next = [500]
    answer = http.post(f"{fallback.base_url}/v1/chat/completions", json={**ask("f"), "model": "deepseek-v4-pro"})
    assert answer.status_code == 200 and answer.json()["model"] == "deepseek-v4-flash"
    # The fallback's answer is not cached for the requested model: once it answers, it is asked again.
    again = http.post(f"{fallback.base_url}/v1/chat/completions", json={**ask("f"), "model": "deepseek-v4-pro"})
    assert again.headers["x-cache"] == "miss" and again.json()["model"] == "deepseek-v4-pro"


def test_a_probe_with_no_verdict_on_the_upstream_does_not_keep_the_model_shut(
    hunyuan_simulator: RunningHunyuanSimulator,
    triton: TritonProcess,
    gateway_factory: Callable[..., RunningGateway],
    http: httpx.Client,
) -> None:
    """The half-open probe is rejected as a bad request (upstream 400): the upstream is up, and the next
    call probes again instead of the breaker waiting forever for a verdict."""
    settings = llm(hunyuan_simulator, max_retries=0, breaker_failures=1, breaker_reset_seconds=0.3)
    gateway = gateway_factory(triton.grpc_url, chat=settings)
    url = f"{gateway.base_url}/v1/chat/completions"
    hunyuan_simulator.config.fail_next = [500]
    assert http.post(url, json=ask("a")).status_code == 502
    assert http.post(url, json=ask("b")).status_code == 503  # open
    time.sleep(0.4)  # past the breaker's reset time (0.3 s): the next call is the half-open probe
    hunyuan_simulator.config.fail_next = [400]
    assert http.post(url, json=ask("c")).status_code == 400  # the probe, rejected for its own sake
    assert http.post(url, json=ask("d")).status_code == 200  # probes again, closes
    assert http.post(url, json=ask("e")).status_code == 200


@pytest.mark.parametrize(
    ("kwargs", "status", "message"),
    [
        ({"json": {"model": "hy3-preview", "messages": []}}, 400, "messages"),
        ({"json": {"model": "hy3-preview", "messages": [{"role": "wizard", "content": "hi"}]}}, 400, "role"),
        ({"json": ask("x" * 250_000)}, 400, "the maximum is 200000"),
        ({"content": b'{"model": "x", "messages": [', "headers": {"content-type": "application/json"}}, 400, "JSON"),
        ({"json": {"messages": [{"role": "user", "content": "hi"}]}}, 400, "model"),
        ({"json": ask("hi", max_tokens=-5)}, 400, "max_tokens"),
        ({"json": ask("hi", max_tokens="lots")}, 400, "max_tokens"),
    ],
    ids=[
        "no-messages",
        "wrong-role",
        "huge-prompt",
        "invalid-json",
        "no-model",
        "negative-max-tokens",
        "text-max-tokens",
    ],
)
def test_bad_chat_input_gets_a_4xx(
    kwargs: dict[str, Any], status: int, message: str, chat_gateway: RunningGateway, http: httpx.Client
) -> None:
    response = http.post(f"{chat_gateway.base_url}/v1/chat/completions", **kwargs)
    assert response.status_code == status, response.text
    assert message in response.json()["error"]["message"]


def test_an_upstream_refusal_keeps_its_error_code(chat_gateway: RunningGateway, http: httpx.Client) -> None:
    body = {"model": "gpt-unknown", "messages": [{"role": "user", "content": "hi"}]}
    response = http.post(f"{chat_gateway.base_url}/v1/chat/completions", json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "model_not_found" and "gpt-unknown" in error["message"]


def test_missing_api_key_is_503_naming_the_variable(
    hunyuan_simulator: RunningHunyuanSimulator,
    triton: TritonProcess,
    gateway_factory: Callable[..., RunningGateway],
    http: httpx.Client,
) -> None:
    gateway = gateway_factory(triton.grpc_url, chat=ChatSettings(base_url=hunyuan_simulator.base_url))
    response = http.post(f"{gateway.base_url}/v1/chat/completions", json=ask("hi"))
    assert response.status_code == 503 and "CHAT_API_KEY" in response.json()["error"]["message"]
    assert http.post(f"{gateway.base_url}/v1/embeddings", json={"input": "still works"}).status_code == 200


def test_answer_is_shared_by_replicas_through_redis(
    redis_url: str,
    hunyuan_simulator: RunningHunyuanSimulator,
    triton: TritonProcess,
    gateway_factory: Callable[..., RunningGateway],
    http: httpx.Client,
) -> None:
    shared = RedisSettings(url=SecretStr(redis_url))
    first, second = (gateway_factory(triton.grpc_url, chat=llm(hunyuan_simulator), redis=shared) for _ in range(2))
    # The answer is in Redis before the first replica answers (the store is awaited before the response).
    assert http.post(f"{first.base_url}/v1/chat/completions", json=ask("shared?")).headers["x-cache"] == "miss"
    assert http.post(f"{second.base_url}/v1/chat/completions", json=ask("shared?")).headers["x-cache"] == "hit"


def test_openai_client_streams_and_non_streams_unchanged_with_split_utf8(
    chat_gateway: RunningGateway, hunyuan_simulator: RunningHunyuanSimulator
) -> None:
    import openai

    hunyuan_simulator.config.split_utf8 = True
    hunyuan_simulator.config.reply = "你好，世界！这是一个多字节的回答。"
    with openai.OpenAI(base_url=f"{chat_gateway.base_url}/v1", api_key="unused") as client:
        whole = client.chat.completions.create(model="hy3-preview", messages=[{"role": "user", "content": "说中文"}])
        assert whole.choices[0].message.content == "你好，世界！这是一个多字节的回答。"
        stream = client.chat.completions.create(
            model="hy3-preview", messages=[{"role": "user", "content": "再说一次"}], stream=True
        )
        pieces = [chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices]
    assert len(pieces) > 2 and "".join(pieces) == "你好，世界！这是一个多字节的回答。"


def test_grpc_chat_streams_the_same_chunks(
    chat_gateway: RunningGateway, hunyuan_simulator: RunningHunyuanSimulator, http: httpx.Client
) -> None:
    import grpc

    from gateway.grpc.pb.gateway.v1 import gateway_pb2, gateway_pb2_grpc

    request = ask("over gRPC please", stream=True)
    rest = sse_payloads(iter(http.post(f"{chat_gateway.base_url}/v1/chat/completions", json=request).text.splitlines()))
    with grpc.insecure_channel(chat_gateway.grpc_target) as channel:
        stub = gateway_pb2_grpc.ChatStub(channel)
        call = stub.Complete(gateway_pb2.ChatRequest(body_json=json.dumps(request)))
        chunks = list(call)
        assert dict(call.initial_metadata())["x-cache"] == "hit"  # the REST call above filled the cache
        with pytest.raises(grpc.RpcError) as bad:
            list(stub.Complete(gateway_pb2.ChatRequest(body_json='{"model": "m", "messages": []}')))
        assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert [json.loads(c.chunk_json) for c in chunks] == [json.loads(p) for p in rest[:-1]]
    assert "".join(c.content for c in chunks) and chunks[-1].finish_reason == "stop"


@pytest.mark.parametrize(
    ("matcher", "threshold", "question", "paraphrase", "different", "negated"),
    [
        (
            "simhash",
            0.88,
            "What is the capital of France?",
            "what is the capital of   france",
            "What is the capital of Spain?",
            "What is not the capital of France?",  # SimHash 0.906 to the question
        ),
        (
            "embedding",
            0.9,
            "How do I reset my password?",
            "How can I reset my password?",
            "What is the weather like today?",
            "How do I not reset my password?",  # cosine 0.93 to the question
        ),
    ],
)
def test_semantic_cache_serves_paraphrases_only(
    matcher: str,
    threshold: float,
    question: str,
    paraphrase: str,
    different: str,
    negated: str,
    hunyuan_simulator: RunningHunyuanSimulator,
    triton: TritonProcess,
    gateway_factory: Callable[..., RunningGateway],
    http: httpx.Client,
) -> None:
    from gateway.settings import SemanticCacheSettings

    semantic = SemanticCacheSettings(matcher=matcher, threshold=threshold)
    gateway = gateway_factory(triton.grpc_url, chat=llm(hunyuan_simulator), semantic=semantic)
    url = f"{gateway.base_url}/v1/chat/completions"
    original = http.post(url, json=ask(question))
    assert original.headers["x-cache"] == "miss"
    calls = hunyuan_simulator.stats.requests_total
    hit = http.post(url, json=ask(paraphrase))
    assert hit.headers["x-cache"] == "semantic", hit.headers
    assert float(hit.headers["x-cache-similarity"]) >= threshold
    assert hit.json()["choices"] == original.json()["choices"]
    streamed = http.post(url, json=ask(paraphrase, stream=True))
    assert streamed.headers["x-cache"] == "semantic"
    chunks = sse_payloads(iter(streamed.text.splitlines()))
    assert len(chunks) > 2 and chunks[-1] == "[DONE]"
    assert hunyuan_simulator.stats.requests_total == calls
    assert http.post(url, json=ask(different)).headers["x-cache"] == "miss"
    assert http.post(url, json=ask(negated)).headers["x-cache"] == "miss"  # alike, and the opposite question
    earlier = {"role": "user", "content": "Another topic first."}, {"role": "assistant", "content": "Sure."}
    other_history = {**ask(paraphrase), "messages": [*earlier, {"role": "user", "content": paraphrase}]}
    assert http.post(url, json=other_history).headers["x-cache"] == "miss"


def test_only_normally_finished_answers_are_cached_and_costs_are_counted(
    chat_gateway: RunningGateway, hunyuan_simulator: RunningHunyuanSimulator, http: httpx.Client
) -> None:
    url = f"{chat_gateway.base_url}/v1/chat/completions"
    hunyuan_simulator.config.finish_reason = "length"
    assert http.post(url, json=ask("cut short")).json()["choices"][0]["finish_reason"] == "length"
    assert http.post(url, json=ask("cut short")).headers["x-cache"] == "miss"  # a truncated answer is not stored
    hunyuan_simulator.config.finish_reason = None
    http.post(url, json=ask("complete answer"))
    assert http.post(url, json=ask("complete answer")).headers["x-cache"] == "hit"
    text = http.get(f"{chat_gateway.base_url}/metrics").text
    host = f"127.0.0.1:{hunyuan_simulator.port}"  # the host label: the configured base URL's, which served it
    assert f'gateway_chat_upstream_calls_total{{host="{host}",model="hy3-preview"}}' in text
    assert 'gateway_chat_tokens_total{kind="completion",model="hy3-preview"}' in text
    assert 'gateway_chat_calls_saved_total{layer="exact"}' in text
    assert 'gateway_chat_tokens_saved_total{layer="exact"}' in text


async def test_identical_concurrent_requests_make_one_upstream_call(
    chat_gateway: RunningGateway, hunyuan_simulator: RunningHunyuanSimulator
) -> None:
    hunyuan_simulator.config.ttft_seconds = 0.3
    async with httpx.AsyncClient(base_url=chat_gateway.base_url, timeout=30) as client:
        responses = await asyncio.gather(*(client.post("/v1/chat/completions", json=ask("once")) for _ in range(5)))
    assert {r.status_code for r in responses} == {200}
    assert hunyuan_simulator.stats.requests_total == 1
    assert len({r.json()["id"] for r in responses}) == 1


def test_no_quota_slot_within_the_wait_is_429_with_retry_after(
    hunyuan_simulator: RunningHunyuanSimulator,
    triton: TritonProcess,
    gateway_factory: Callable[..., RunningGateway],
    http: httpx.Client,
) -> None:
    from gateway.settings import ChatQuotaSettings

    quota = ChatQuotaSettings(requests_per_second=0.5, max_wait_seconds=0.2)
    gateway = gateway_factory(triton.grpc_url, chat=llm(hunyuan_simulator, quota=quota))
    url = f"{gateway.base_url}/v1/chat/completions"
    assert http.post(url, json=ask("first")).status_code == 200
    refused = http.post(url, json=ask("second"))
    assert refused.status_code == 429 and int(refused.headers["retry-after"]) >= 1
    assert "quota exhausted" in refused.json()["error"]["message"]
    assert hunyuan_simulator.stats.requests_total == 1


def test_a_call_the_upstream_refused_gives_its_token_estimate_back(
    hunyuan_simulator: RunningHunyuanSimulator,
    triton: TritonProcess,
    gateway_factory: Callable[..., RunningGateway],
    http: httpx.Client,
) -> None:
    """1,000 tokens a minute and ~400 estimated per call: two refused calls keeping their estimates would
    leave too few for the next call for most of a minute."""
    from gateway.settings import ChatQuotaSettings

    gateway = gateway_factory(
        triton.grpc_url,
        chat=llm(
            hunyuan_simulator,
            max_retries=0,
            breaker_failures=10,
            quota=ChatQuotaSettings(tokens_per_minute=1000, max_wait_seconds=0.5),
        ),
    )
    url = f"{gateway.base_url}/v1/chat/completions"
    hunyuan_simulator.config.fail_next = [500, 500]
    assert [http.post(url, json=ask(f"q{i}", max_tokens=400)).status_code for i in range(2)] == [502, 502]
    answered = http.post(url, json=ask("q2", max_tokens=400))
    assert answered.status_code == 200, answered.text


def test_answers_with_several_choices_are_not_cached(chat_gateway: RunningGateway, http: httpx.Client) -> None:
    url = f"{chat_gateway.base_url}/v1/chat/completions"
    for _ in range(2):
        assert http.post(url, json=ask("two takes", n=2)).headers["x-cache"] == "miss"
    http.post(url, json=ask("one take", n=1))
    assert http.post(url, json=ask("one take", n=1)).headers["x-cache"] == "hit"


@pytest.mark.parametrize("stream", [False, True], ids=["completion", "stream"])
@pytest.mark.parametrize(("leaving", "status"), [("request deadline", 504), ("client disconnect", 499)])
def test_a_completion_no_request_waits_for_any_more_is_cancelled_and_frees_its_quota_slot(
    leaving: str,
    status: int,
    stream: bool,
    hunyuan_simulator: RunningHunyuanSimulator,
    triton: TritonProcess,
    gateway_factory: Callable[..., RunningGateway],
    http: httpx.Client,
) -> None:
    from gateway.settings import ChatQuotaSettings, LimitSettings

    gateway = gateway_factory(
        triton.grpc_url,
        chat=llm(hunyuan_simulator, quota=ChatQuotaSettings(max_concurrent=1, max_wait_seconds=1.0)),
        limits=LimitSettings(request_timeout_seconds=0.5 if leaving == "request deadline" else 60.0),
    )
    url = f"{gateway.base_url}/v1/chat/completions"
    hunyuan_simulator.config.ttft_seconds = 3.0
    slow = ask("too slow", stream=stream)  # a stream's headers wait for its first chunk: it is still opening
    if leaving == "request deadline":
        assert http.post(url, json=slow).status_code == 504
    else:
        with httpx.Client(timeout=0.3) as impatient, pytest.raises(httpx.ReadTimeout):
            impatient.post(url, json=slow)  # the client gives up and closes its connection
    hunyuan_simulator.config.ttft_seconds = 0.0
    # The only concurrency slot: still held by the abandoned call, this request would wait 1 s and get 429.
    answered = http.post(url, json=ask("quick"))
    assert answered.status_code == 200, answered.text
    assert f'status="{status}"' in http.get(f"{gateway.base_url}/metrics").text  # counted, not lost


async def test_identical_concurrent_streams_follow_one_upstream_call(
    chat_gateway: RunningGateway, hunyuan_simulator: RunningHunyuanSimulator
) -> None:
    hunyuan_simulator.config.tokens_per_second = 20
    request = ask("stream once for everyone", stream=True)
    received = [asyncio.Event() for _ in range(3)]  # the leader has read its first, second, third chunk

    async def one(client: httpx.AsyncClient, after: asyncio.Event | None) -> list[str]:
        if after is not None:
            await after.wait()  # a late follower: the leader's stream is under way
        payloads: list[str] = []
        async with client.stream("POST", "/v1/chat/completions", json=request) as response:
            async for line in response.aiter_lines():
                payloads.extend(sse_payloads(iter([line])))
                if after is None and 0 < len(payloads) <= len(received):
                    received[len(payloads) - 1].set()
        return payloads

    async with httpx.AsyncClient(base_url=chat_gateway.base_url, timeout=30) as client, asyncio.timeout(60):
        results = await asyncio.gather(one(client, None), one(client, received[0]), one(client, received[2]))
    assert hunyuan_simulator.stats.requests_total == 1
    assert results[0][-1] == "[DONE]" and len(results[0]) > 3
    assert results[1] == results[0] and results[2] == results[0]  # late followers get the chunks from the start


def test_a_stream_may_outlast_the_request_deadline_once_it_has_begun(
    hunyuan_simulator: RunningHunyuanSimulator,
    triton: TritonProcess,
    gateway_factory: Callable[..., RunningGateway],
    http: httpx.Client,
) -> None:
    from gateway.settings import LimitSettings

    hunyuan_simulator.config.tokens_per_second = 10  # about 2 s for this answer
    limits = LimitSettings(request_timeout_seconds=0.5)
    gateway = gateway_factory(triton.grpc_url, chat=llm(hunyuan_simulator), limits=limits)
    response = http.post(f"{gateway.base_url}/v1/chat/completions", json=ask("a long streamed answer", stream=True))
    payloads = sse_payloads(iter(response.text.splitlines()))
    assert payloads[-1] == "[DONE]" and "error" not in payloads[-2]
    non_streamed = http.post(f"{gateway.base_url}/v1/chat/completions", json=ask("the same, not streamed"))
    assert non_streamed.status_code == 504  # no answer within the deadline
