"""A streamed chat's usage, with the official `openai` client against a real gateway and the Hunyuan simulator: the
gateway always asks the upstream for the usage chunk, records its tokens on the key and settles the key's chat
tokens per minute with them, and passes that chunk on only to clients that asked for it (`stream_options`);
an answer replayed from the exact cache is recorded as a cached request, as before."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import openai
import pytest
from pydantic import SecretStr

from gateway.settings import AuthSettings, ChatSettings, ModelPrice, UsageSettings
from tests.helpers.hunyuan_fixtures import RunningHunyuanSimulator
from tests.helpers.running_gateway import RunningGateway

pytestmark = pytest.mark.slow

ADMIN = "admin-stream-usage-key-0001"
NO_TRITON = "127.0.0.1:1"  # nothing here needs embeddings
MODEL = "hy3-preview"
# Each stream reserves its estimate (prompt / 4 + 512 answer tokens) of this; only a stream settled with its real
# (much smaller) usage leaves enough for the next one: an unsettled estimate would refuse the second stream.
TOKENS_PER_MINUTE = 700


@pytest.fixture
def gateway(
    gateway_factory: Callable[..., RunningGateway], hunyuan_simulator: RunningHunyuanSimulator
) -> RunningGateway:
    return gateway_factory(
        NO_TRITON,
        auth=AuthSettings(api_keys=SecretStr(ADMIN)),
        chat=ChatSettings(base_url=hunyuan_simulator.base_url, api_key=SecretStr("upstream-key")),
        usage=UsageSettings(prices={MODEL: ModelPrice(input=1000, output=2000)}),
    )


@pytest.fixture
def team_key(gateway: RunningGateway, http: httpx.Client) -> str:
    body = {"name": "streamer", "team": "apps", "limits": {"chat_tokens_per_minute": TOKENS_PER_MINUTE}}
    created = http.post(f"{gateway.base_url}/v1/admin/keys", json=body, headers={"Authorization": f"Bearer {ADMIN}"})
    assert created.status_code == 201, created.text
    secret: str = created.json()["key"]
    return secret


@pytest.fixture
def client(gateway: RunningGateway, team_key: str) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{gateway.base_url}/v1", api_key=team_key, max_retries=0, timeout=60) as made:
        yield made


def stream(client: openai.OpenAI, question: str, **options: Any) -> list[Any]:
    messages: Any = [{"role": "user", "content": question}]
    return list(client.chat.completions.create(model=MODEL, messages=messages, stream=True, **options))


def usage_row(http: httpx.Client, gateway: RunningGateway, secret: str) -> dict[str, Any]:
    day = time.strftime("%Y-%m-%d", time.gmtime())
    answer = http.get(
        f"{gateway.base_url}/v1/usage", params={"start": day, "end": day}, headers={"Authorization": f"Bearer {secret}"}
    )
    assert answer.status_code == 200, answer.text
    (row,) = answer.json()["data"]
    assert isinstance(row, dict)
    return row


def test_a_stream_is_recorded_with_its_tokens_and_its_usage_chunk_reaches_only_clients_that_asked(
    gateway: RunningGateway,
    client: openai.OpenAI,
    team_key: str,
    http: httpx.Client,
    hunyuan_simulator: RunningHunyuanSimulator,
) -> None:
    plain = stream(client, "what is the capital of France?")
    assert all(chunk.usage is None and chunk.choices for chunk in plain)  # no usage chunk, as OpenAI without asking
    assert "".join(chunk.choices[0].delta.content or "" for chunk in plain).startswith("Echo: what is the capital")
    sent = hunyuan_simulator.stats.last_request
    assert sent is not None and sent["stream_options"] == {"include_usage": True}  # asked upstream all the same
    counted = hunyuan_simulator.stats.usage_by_answer[plain[0].id]
    row = usage_row(http, gateway, team_key)
    assert (row["requests"], row["prompt_tokens"], row["completion_tokens"]) == (
        1,
        counted["prompt_tokens"],
        counted["completion_tokens"],
    )
    assert row["cost"] == pytest.approx((counted["prompt_tokens"] * 1000 + counted["completion_tokens"] * 2000) / 1e6)

    # Asked for: the last chunk has no choices and the usage the upstream counted. This second stream is admitted
    # only because the first one's reservation was settled with its real usage.
    asked = stream(client, "and of Spain?", stream_options={"include_usage": True})
    *answer, last = asked
    assert last.choices == [] and last.usage is not None and all(chunk.usage is None for chunk in answer)
    counted_too = hunyuan_simulator.stats.usage_by_answer[asked[0].id]
    assert (last.usage.prompt_tokens, last.usage.completion_tokens) == (
        counted_too["prompt_tokens"],
        counted_too["completion_tokens"],
    )
    row = usage_row(http, gateway, team_key)
    assert row["requests"] == 2 and row["cached_requests"] == 0
    assert row["completion_tokens"] == counted["completion_tokens"] + counted_too["completion_tokens"]

    # Replays from the exact cache: recorded as cached requests that saved the answer's tokens, and the usage chunk
    # (kept in the cache with the answer) again reaches only the client that asked for it.
    upstream_calls = hunyuan_simulator.stats.requests_total
    replayed = stream(client, "what is the capital of France?")
    assert all(chunk.usage is None and chunk.choices for chunk in replayed)
    replayed_asked = stream(client, "and of Spain?", stream_options={"include_usage": True})
    assert replayed_asked[-1].choices == [] and replayed_asked[-1].usage == last.usage
    assert hunyuan_simulator.stats.requests_total == upstream_calls
    row = usage_row(http, gateway, team_key)
    assert (row["requests"], row["cached_requests"]) == (4, 2)
    assert row["completion_tokens"] == counted["completion_tokens"] + counted_too["completion_tokens"]
    assert row["saved_tokens"] == counted["total_tokens"] + counted_too["total_tokens"]
