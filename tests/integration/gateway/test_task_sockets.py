"""Task changes pushed over WebSocket: two real gateways (uvicorn with the `websockets` protocol) on one real Redis,
in front of the Pika (fal queue) simulator, read with the `websockets` client and, in the last test, by the example
page in headless Chromium.

Webhooks land on replica B only (its URL is both replicas' GATEWAY_PUBLIC_URL) and polling waits longer than a job
runs, so every change after the submit is written by B: a socket on A that sees it got it through the task store's
change feed. The gateways, the simulator and the page's server are started once for the module.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import grpc
import httpx
import pytest
from pydantic import SecretStr
from starlette.staticfiles import StaticFiles
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect
from websockets.typing import Origin, Subprotocol

from gateway.grpc.pb.gateway.v1 import gateway_pb2, gateway_pb2_grpc
from gateway.observability import WebSocketWireFilter
from gateway.settings import (
    AuthSettings,
    LimitSettings,
    RedisSettings,
    ServerSettings,
    TaskStoreSettings,
    VideoSettings,
    all_environment_variables,
)
from localtriton.ports import free_port
from simulators.pika import PikaSimulatorConfig
from tests.helpers.checkout import ROOT
from tests.helpers.conditions import wait_until
from tests.helpers.headless_chromium import chromium_page
from tests.helpers.metrics import metric
from tests.helpers.pika_fixtures import RunningPikaSimulator
from tests.helpers.redis_fixtures import RedisServer
from tests.helpers.running_gateway import RunningGateway, gateway_settings, scratch_dir
from tests.helpers.servers import ThreadedServer

pytestmark = pytest.mark.slow

KEY = "sk-sockets-video-key-0001"
LIMITED_KEY = "sk-sockets-limited-key-0002"  # the oversubscription test's own, so no other test's watchers count
FAL_KEY = "fal-key-for-the-socket-tests"
PER_CALLER = 3
NO_TRITON = "127.0.0.1:9"  # video tasks do not need Triton
SUBPROTOCOL = "ai-gateway.v1"


@dataclass(frozen=True)
class Replicas:
    a: RunningGateway
    b: RunningGateway
    simulator: RunningPikaSimulator
    page_origin: str  # where the example page is served (allowed by CORS)


def ws_url(gateway: RunningGateway, path: str) -> str:
    return gateway.base_url.replace("http://", "ws://") + path


def auth(key: str = KEY) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture(scope="module")
def replicas(redis_server: RedisServer) -> Iterator[Replicas]:
    redis_server.start()
    redis_server.command("FLUSHALL")
    simulator = RunningPikaSimulator(PikaSimulatorConfig(api_key=FAL_KEY, job_seconds=0.6)).start()
    page = ThreadedServer(StaticFiles(directory=ROOT / "examples"), "example-pages")  # the page's own origin
    page.start_server()
    page_origin = f"http://127.0.0.1:{page.port}"
    port_b = free_port()

    def replica(port: int) -> RunningGateway:
        data = scratch_dir("socket-gateway-")
        server = ServerSettings(
            host="127.0.0.1",
            http_port=port,
            grpc_port=free_port(),
            public_url=f"http://127.0.0.1:{port_b}",
            shutdown_grace_seconds=2,
            cors_allow_origins=page_origin,
        )
        video = VideoSettings(
            base_url=simulator.base_url,
            api_key=SecretStr(FAL_KEY),
            webhook_jwks_url=simulator.jwks_url,
            platform_url=simulator.base_url,
            callback_grace_seconds=30,  # no polling: only B's webhooks end the tasks
        )
        return RunningGateway(
            gateway_settings(
                NO_TRITON,
                server=server,
                video=video,
                redis=RedisSettings(url=SecretStr(redis_server.url)),
                tasks=TaskStoreSettings(sqlite_path=str(data / "tasks.sqlite3"), scan_interval_seconds=0.05),
                auth=AuthSettings(api_keys=SecretStr(f"{KEY},{LIMITED_KEY}"), keys_sqlite_path=str(data / "keys.db")),
                limits=LimitSettings(max_task_watchers_per_caller=PER_CALLER),
            )
        ).start()

    with pytest.MonkeyPatch.context() as env:  # the module's gateways read none of the developer's settings
        for name in all_environment_variables():
            env.delenv(name, raising=False)
        a, b = replica(free_port()), replica(port_b)
    yield Replicas(a, b, simulator, page_origin)
    for server in (a, b, simulator, page):
        server.stop()


@pytest.fixture
def http() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=30) as client:
        yield client


def submit(http: httpx.Client, gateway: RunningGateway, key: str = KEY) -> str:
    answer = http.post(
        f"{gateway.base_url}/v1/images/generations", json={"prompt": "a red fox in snow"}, headers=auth(key)
    )
    assert answer.status_code == 202, answer.text
    task_id: str = answer.json()["id"]
    return task_id


def status(http: httpx.Client, gateway: RunningGateway, task_id: str) -> str:
    answer: str = http.get(f"{gateway.base_url}/v1/tasks/{task_id}", headers=auth()).json()["status"]
    return answer


def open_socket(
    url: str, *, key: str | None = None, token: str | None = None, origin: str | None = None
) -> ClientConnection:
    protocols = [Subprotocol(SUBPROTOCOL), Subprotocol(f"token.{token}")] if token is not None else None
    headers = auth(key) if key is not None else None
    sent_origin = Origin(origin) if origin is not None else None
    return connect(
        url, additional_headers=headers, subprotocols=protocols, origin=sent_origin, proxy=None, open_timeout=10
    )


def read_until_closed(socket: ClientConnection, timeout: float = 15.0) -> tuple[list[dict[str, Any]], int | None, str]:
    """Every message until the server closes, then its close code and reason."""
    messages: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    try:
        while True:
            messages.append(json.loads(socket.recv(timeout=max(0.1, deadline - time.monotonic()))))
    except ConnectionClosed:
        return messages, socket.close_code, socket.close_reason or ""


def read_until(socket: ClientConnection, done: Any, timeout: float = 15.0) -> list[dict[str, Any]]:
    """Messages until one for which `done(message)` holds (included)."""
    messages: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    while not messages or not done(messages[-1]):
        messages.append(json.loads(socket.recv(timeout=max(0.1, deadline - time.monotonic()))))
    return messages


def sse_events(http: httpx.Client, gateway: RunningGateway, task_id: str, last_event_id: int) -> list[tuple[str, str]]:
    """(id, data) of each event of the task's event stream after `last_event_id`; [DONE] has no id."""
    headers = {**auth(), "Last-Event-ID": str(last_event_id)}
    events, event_id = [], ""
    with http.stream("GET", f"{gateway.base_url}/v1/tasks/{task_id}/events", headers=headers) as stream:
        assert stream.status_code == 200
        for line in stream.iter_lines():
            if line.startswith("id: "):
                event_id = line[len("id: ") :]
            elif line.startswith("data: "):
                events.append((event_id, line[len("data: ") :]))
                event_id = ""
    return events


def test_a_socket_on_one_replica_gets_each_change_the_other_writes_then_done_and_a_normal_close(
    replicas: Replicas, http: httpx.Client
) -> None:
    a, b = replicas.a, replicas.b
    task_id = submit(http, a)
    with open_socket(ws_url(a, f"/v1/tasks/{task_id}/ws"), key=KEY) as socket:
        assert socket.ping().wait(5), "no pong to the client's ping"
        messages, code, _ = read_until_closed(socket)
    assert code == 1000 and messages[-1] == {"type": "done", "task_id": task_id}, messages
    events = messages[:-1]
    assert {message["type"] for message in events} == {"event"}, messages
    statuses = [event["task"]["status"] for event in events]
    assert statuses[0] in ("pending", "processing") and statuses[-1] == "completed", statuses
    assert statuses == sorted(statuses, key=["pending", "processing", "completed"].index)
    ids = [event["id"] for event in events]
    assert ids == sorted(set(ids)), ids
    final = http.get(f"{b.base_url}/v1/tasks/{task_id}", headers=auth()).json()
    assert events[-1]["task"] == final and final["urls"], final  # the task object of GET and of the event stream

    # The event stream carries the same ids, and resumes after the one named by Last-Event-ID.
    after_first = sse_events(http, a, task_id, ids[0])
    assert after_first == [(str(ids[-1]), json.dumps(final, separators=(",", ":"))), ("", "[DONE]")], after_first
    assert sse_events(http, b, task_id, ids[-1]) == [("", "[DONE]")]


def test_a_browser_token_reconnects_to_the_other_replica_and_resumes_after_the_last_event_it_read(
    replicas: Replicas, http: httpx.Client
) -> None:
    a, b = replicas.a, replicas.b
    task_id = submit(http, a)
    answer = http.post(f"{a.base_url}/v1/tasks/{task_id}/token", headers=auth())
    assert answer.status_code == 200, answer.text
    token = answer.json()
    assert token["object"] == "task.watch_token" and token["task_id"] == task_id
    assert time.time() + 240 < token["expires_at"] <= time.time() + 301  # GATEWAY_WATCH_TOKEN_SECONDS: 300

    with open_socket(ws_url(a, f"/v1/tasks/{task_id}/ws"), token=token["token"]) as first:
        assert first.subprotocol == SUBPROTOCOL  # the token is never echoed back
        seen = json.loads(first.recv(timeout=10))
    assert seen["type"] == "event" and seen["task"]["status"] != "completed", seen
    # Reconnected to the other replica, with the same token, it gets only what came after the last event it read.
    with open_socket(ws_url(b, f"/v1/tasks/{task_id}/ws?last_event_id={seen['id']}"), token=token["token"]) as second:
        rest, code, _ = read_until_closed(second)
    assert code == 1000 and rest[-1] == {"type": "done", "task_id": task_id}, rest
    assert rest[-2]["task"]["status"] == "completed" and all(event["id"] > seen["id"] for event in rest[:-1]), rest

    # A token from gRPC (on B) opens /v1/ws on A, for its own task only; resumed past the end, only `done` comes.
    with grpc.insecure_channel(b.grpc_target) as channel:
        minted = gateway_pb2_grpc.ImagesStub(channel).CreateWatchToken(
            gateway_pb2.TaskRequest(task_id=task_id), metadata=(("authorization", f"Bearer {KEY}"),), timeout=10
        )
    assert minted.task_id == task_id and minted.expires_at > time.time()
    with open_socket(ws_url(a, "/v1/ws"), token=minted.token) as socket:
        last = {task_id: rest[-2]["id"]}
        socket.send(json.dumps({"type": "subscribe", "task_ids": ["task_other", task_id], "last_event_ids": last}))
        messages = read_until(socket, lambda message: message["type"] == "done")
    refused, subscribed, done = messages
    assert refused["type"] == "error" and refused["task_id"] == "task_other", refused
    assert refused["error"]["code"] == "invalid_watch_token"
    assert subscribed == {"type": "subscribed", "task_ids": [task_id]} and done["task_id"] == task_id


def test_one_socket_follows_the_tasks_it_subscribes_to_until_each_is_done(
    replicas: Replicas, http: httpx.Client
) -> None:
    a, b = replicas.a, replicas.b
    first, second = submit(http, b), submit(http, a)
    with open_socket(ws_url(a, "/v1/ws"), key=KEY) as socket:
        socket.send(json.dumps({"type": "subscribe", "task_ids": [first, second, "task_unknown"]}))
        assert json.loads(socket.recv(timeout=10)) == {
            "type": "subscribed",
            "task_ids": [first, second, "task_unknown"],
        }
        messages: list[dict[str, Any]] = []
        while sum(message["type"] == "done" for message in messages) < 2:
            messages.append(json.loads(socket.recv(timeout=15)))
        socket.send(json.dumps({"type": "unsubscribe", "task_ids": [first]}))
        assert json.loads(socket.recv(timeout=10)) == {"type": "unsubscribed", "task_ids": [first]}
        socket.send("not json")
        assert json.loads(socket.recv(timeout=10))["error"]["type"] == "invalid_request_error"
    unknown = [message for message in messages if message.get("task_id") == "task_unknown"]
    assert [message["error"]["type"] for message in unknown] == ["not_found_error"], unknown
    for task_id in (first, second):
        statuses = [m["task"]["status"] for m in messages if m["type"] == "event" and m["task"]["id"] == task_id]
        assert statuses[-1] == "completed", (task_id, messages)


def test_a_socket_without_valid_credentials_is_closed_with_1008_and_causes_no_outbound_work(
    replicas: Replicas, http: httpx.Client, caplog: pytest.LogCaptureFixture
) -> None:
    a, b, simulator = replicas.a, replicas.b, replicas.simulator
    task_id = submit(http, a)
    other_task = submit(http, a)
    other_token = http.post(f"{a.base_url}/v1/tasks/{other_task}/token", headers=auth()).json()["token"]
    ended = lambda: status(http, a, task_id) == status(http, a, other_task) == "completed"  # noqa: E731
    wait_until(ended, what="the tasks to complete")  # nothing of theirs is left for the upstream to do
    stats = simulator.stats
    before = (stats.submitted, stats.status_polls, stats.result_reads, stats.history_calls, stats.cancels)
    forged = other_token[:-4] + ("AAAA" if not other_token.endswith("AAAA") else "BBBB")
    path = f"/v1/tasks/{task_id}/ws"
    cases: list[tuple[str, dict[str, Any], str]] = [
        ("no credentials", {}, "invalid_api_key"),
        ("an unknown key", {"key": "sk-not-a-key-of-this-gateway"}, "invalid_api_key"),
        ("a forged token", {"token": forged}, "invalid_watch_token"),
        ("a token of another task", {"token": other_token}, "invalid_watch_token"),
        ("not a token", {"token": "letmein"}, "invalid_watch_token"),
    ]
    caplog.set_level(logging.DEBUG)
    for what, credentials, code in cases:
        with open_socket(ws_url(a, path), **credentials) as socket:
            messages, close_code, reason = read_until_closed(socket)
        assert close_code == 1008 and reason, (what, close_code, reason)
        assert len(messages) == 1 and messages[0]["type"] == "error", (what, messages)
        assert messages[0]["error"]["code"] == code, (what, messages)
    with open_socket(ws_url(b, f"{path}?api_key={KEY}")) as socket:  # a key in the URL is refused, not used
        messages, close_code, _ = read_until_closed(socket)
    assert close_code == 1008 and messages[0]["error"]["code"] == "credentials_in_url", messages
    with pytest.raises(InvalidStatus) as refused:  # a page of another origin: refused before the socket opens
        open_socket(ws_url(a, path), key=KEY, origin="https://evil.example")
    assert refused.value.response.status_code == 403
    assert json.loads(refused.value.response.body)["error"]["code"] == "origin_not_allowed"
    with open_socket(ws_url(a, path), key=KEY, origin=replicas.page_origin) as allowed:
        assert read_until_closed(allowed)[1] == 1000

    stats = simulator.stats
    assert (stats.submitted, stats.status_polls, stats.result_reads, stats.history_calls, stats.cancels) == before
    # What the gateway logs (at every level, through the filter its logging installs) and exports.
    wire = WebSocketWireFilter()
    logged = [r.getMessage() for r in caplog.records if r.name.startswith(("gateway", "uvicorn")) and wire.filter(r)]
    exposed = "\n".join(logged) + http.get(f"{a.base_url}/metrics").text
    for secret in (KEY, other_token, forged, "sk-not-a-key-of-this-gateway", FAL_KEY):
        assert secret not in exposed


def test_watchers_past_the_keys_limit_are_refused_and_a_socket_that_oversubscribes_is_closed_with_1008(
    replicas: Replicas, http: httpx.Client
) -> None:
    a, simulator = replicas.a, replicas.simulator
    simulator.config.job_seconds = 30.0  # the tasks stay open while they are watched
    tasks = [submit(http, a, LIMITED_KEY) for _ in range(3)]
    watchers_before = metric(http, a.base_url, "gateway_task_watchers")
    try:
        with (
            httpx.Client(timeout=30) as streams,
            streams.stream("GET", f"{a.base_url}/v1/tasks/{tasks[0]}/events", headers=auth(LIMITED_KEY)) as sse,
            open_socket(ws_url(a, "/v1/ws"), key=LIMITED_KEY) as socket,
        ):
            assert sse.status_code == 200  # 1 watcher: the event stream
            socket.send(json.dumps({"type": "subscribe", "task_ids": tasks[1:]}))  # 2 more: the key's 3
            read_until(socket, lambda message: message["type"] == "subscribed")
            wait_until(lambda: metric(http, a.base_url, "gateway_task_watchers") == watchers_before + 3)

            with open_socket(ws_url(a, f"/v1/tasks/{tasks[0]}/ws"), key=LIMITED_KEY) as fourth:
                messages, code, reason = read_until_closed(fourth)
            assert code == 1008 and messages[0]["error"]["code"] == "too_many_watchers", messages
            assert "limit is 3" in reason, reason
            refused = http.get(f"{a.base_url}/v1/tasks/{tasks[0]}/events", headers=auth(LIMITED_KEY))
            assert refused.status_code == 429 and refused.json()["error"]["code"] == "too_many_watchers"
            with grpc.insecure_channel(a.grpc_target) as channel, pytest.raises(grpc.RpcError) as watch:
                request = gateway_pb2.TaskRequest(task_id=tasks[0])
                metadata = (("authorization", f"Bearer {LIMITED_KEY}"),)
                list(gateway_pb2_grpc.ImagesStub(channel).WatchTask(request, metadata=metadata, timeout=5))
            assert watch.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            with open_socket(ws_url(a, f"/v1/tasks/{tasks[0]}/ws"), key=KEY) as other_key:  # another key's count
                assert json.loads(other_key.recv(timeout=10))["type"] == "event"

            socket.send(json.dumps({"type": "subscribe", "task_ids": [tasks[0]]}))  # a 4th: the socket is closed
            messages, code, _ = read_until_closed(socket)
            assert code == 1008 and messages[-1]["error"]["code"] == "too_many_watchers", messages
        wait_until(lambda: metric(http, a.base_url, "gateway_task_watchers") == watchers_before, what="permits back")
    finally:
        simulator.config.job_seconds = 0.6
        for task_id in tasks:
            http.delete(f"{a.base_url}/v1/tasks/{task_id}", headers=auth(LIMITED_KEY))


def test_the_example_page_shows_the_completed_tasks_url_in_headless_chromium(
    replicas: Replicas, http: httpx.Client
) -> None:
    a = replicas.a
    page_url = f"{replicas.page_origin}/video_progress.html?gateway={a.base_url}&key={KEY}&prompt=a+fox"
    with chromium_page(page_url) as page:
        shown = page.wait_for(
            "document.getElementById('result').textContent",
            bool,
            timeout=30,
            what="the video URL on the page",
        )
        task_id = page.evaluate("document.getElementById('task').textContent")
        statuses = page.evaluate("[...document.querySelectorAll('#statuses li')].map(item => item.textContent)")
        error = page.evaluate("document.getElementById('error').textContent")
    task = http.get(f"{a.base_url}/v1/tasks/{task_id}", headers=auth()).json()
    assert task["status"] == "completed" and shown == task["urls"][0], (task, shown)
    assert statuses[-1].endswith(" completed") and not error, (statuses, error)


def test_the_example_page_is_plain_html_with_no_key_of_its_own() -> None:
    page = (ROOT / "examples" / "video_progress.html").read_text(encoding="utf-8")
    assert "sk-" not in page and "<script src" not in page  # no build step, no CDN, no key
