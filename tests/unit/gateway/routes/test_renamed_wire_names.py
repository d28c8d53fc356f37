"""The video webhook route and the chat and video metrics renamed in 0.2 keep their old names for one release:
`/v1/callbacks/pika/{id}` (jobs an older replica submitted carry it) and `gateway_llm_*` / `gateway_image_*`."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from prometheus_client import REGISTRY, generate_latest
from starlette.testclient import TestClient

from gateway import metrics
from gateway.app import create_app
from tests.helpers.running_gateway import gateway_settings


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    with TestClient(create_app(gateway_settings("127.0.0.1:9"))) as test_client:
        yield test_client


@pytest.mark.parametrize("route", ["/v1/callbacks/video/task-1", "/v1/callbacks/pika/task-1"])
def test_both_webhook_routes_check_the_url_token_first(client: TestClient, route: str) -> None:
    before = REGISTRY.get_sample_value("gateway_video_callbacks_total", {"result": "bad_token"}) or 0.0
    answer = client.post(route, params={"token": "forged"}, content=b"{}")
    assert answer.status_code == 401 and answer.json()["error"]["type"] == "authentication_error"
    assert REGISTRY.get_sample_value("gateway_video_callbacks_total", {"result": "bad_token"}) == before + 1


def test_the_old_route_is_marked_deprecated_in_the_openapi_document(client: TestClient) -> None:
    paths = client.get("/openapi.json").json()["paths"]
    assert paths["/v1/callbacks/pika/{task_id}"]["post"]["deprecated"] is True
    assert "deprecated" not in paths["/v1/callbacks/video/{task_id}"]["post"]


def test_renamed_metrics_are_exported_under_both_names() -> None:
    metrics.CHAT_TOKENS.labels(model="m", kind="prompt").inc(3)
    metrics.VIDEO_TASK_DURATION.labels(state="completed").observe(2.0)
    text = generate_latest().decode()
    renamed = [
        ("gateway_chat_tokens_total", "gateway_llm_tokens_total"),
        ("gateway_video_task_duration_seconds_count", "gateway_image_task_duration_seconds_count"),
    ]
    for new, old in renamed:
        samples = {line.split(" ")[0].replace(new, "*") for line in text.splitlines() if line.startswith(new + "{")}
        assert samples and samples == {
            line.split(" ")[0].replace(old, "*") for line in text.splitlines() if line.startswith(old + "{")
        }
    assert REGISTRY.get_sample_value("gateway_llm_tokens_total", {"model": "m", "kind": "prompt"}) == (
        REGISTRY.get_sample_value("gateway_chat_tokens_total", {"model": "m", "kind": "prompt"})
    )
    assert "# HELP gateway_image_task_duration_seconds Deprecated: gateway_video_task_duration_seconds." in text
