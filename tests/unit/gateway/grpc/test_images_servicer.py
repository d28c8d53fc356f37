"""gateway.v1.Images end to end over a real grpc.aio server, with an in-memory fake of the video task service.

The fake keeps the service's contract (NotFoundError for unknown ids, ConflictError for a reused idempotency key
with another request or for cancelling a finished task, watch raising up front); the gateway's real VideoService
against the Pika simulator is covered by the integration tests.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from gateway.errors import ConflictError, NotFoundError
from gateway.grpc.pb.gateway.v1 import gateway_pb2 as pb
from gateway.limits import watcher_limit
from gateway.protocol.video import ImageGenerationRequest
from gateway.services.video import public_task
from gateway.tasks.model import Task, TaskError, TaskState
from tests.helpers.conditions import wait_until
from tests.helpers.grpc_harness import API_KEY, AUTH, Harness, HarnessFactory

RESULT = {"video": {"url": "https://files.example/out.mp4", "content_type": "video/mp4"}, "seed": 7, "note": "红狐"}


def make_task(task_id: str = "task_1", state: TaskState = TaskState.PENDING, **changes: Any) -> Task:
    return Task(
        id=task_id, state=state, arguments={}, created_at=1000.7, updated_at=1000.7, deadline_at=1900.0, **changes
    )


def ended(task: Task, state: TaskState, **changes: Any) -> Task:
    return dataclasses.replace(task, state=state, updated_at=1010.2, ended_at=1010.2, expires_at=87410.2, **changes)


COMPLETED = ended(make_task(), TaskState.COMPLETED, result=RESULT)
FAILED = ended(make_task(), TaskState.FAILED, error=TaskError("upstream_error", "the model ran out of memory"))


@dataclass
class SubmitCall:
    request: ImageGenerationRequest
    idempotency_key: str | None
    caller: str


@dataclass
class FakeImages:
    """VideoService's contract in memory. `histories` scripts what WatchTask sees; ids in `hold_open` keep
    the watch open after their history (until the call is cancelled)."""

    tasks: dict[str, Task] = field(default_factory=dict)
    histories: dict[str, list[Task]] = field(default_factory=dict)
    hold_open: set[str] = field(default_factory=set)
    submits: list[SubmitCall] = field(default_factory=list)
    closed_watches: list[str] = field(default_factory=list)
    _keys: dict[tuple[str, str], tuple[ImageGenerationRequest, Task]] = field(default_factory=dict)

    async def submit(
        self, request: ImageGenerationRequest, *, idempotency_key: str | None = None, caller: str = ""
    ) -> tuple[Task, bool]:
        self.submits.append(SubmitCall(request, idempotency_key, caller))
        if idempotency_key and (caller, idempotency_key) in self._keys:
            earlier, task = self._keys[(caller, idempotency_key)]
            if earlier != request:
                raise ConflictError("Idempotency-Key was already used for a different request")
            return task, False
        task = make_task(f"task_{len(self.tasks) + 1}")
        self.tasks[task.id] = task
        if idempotency_key:
            self._keys[(caller, idempotency_key)] = (request, task)
        return task, True

    async def get(self, task_id: str) -> Task:
        if task_id not in self.tasks:
            raise NotFoundError(f"task {task_id!r} not found (unknown, or expired after its retention)")
        return self.tasks[task_id]

    async def cancel(self, task_id: str) -> Task:
        task = await self.get(task_id)
        if task.state.terminal and task.state != TaskState.CANCELLED:
            raise ConflictError(f"task {task_id} has already {task.state.value}; it can no longer be cancelled")
        self.tasks[task_id] = ended(task, TaskState.CANCELLED, error=TaskError("cancelled", "cancelled by the client"))
        return self.tasks[task_id]

    async def watch(self, task_id: str) -> AsyncGenerator[Task, None]:
        await self.get(task_id)
        return self._changes(task_id)

    async def _changes(self, task_id: str) -> AsyncGenerator[Task, None]:
        try:
            for task in self.histories.get(task_id, [self.tasks[task_id]]):
                yield task
            if task_id in self.hold_open:
                await asyncio.Event().wait()
        finally:
            self.closed_watches.append(task_id)


@pytest.fixture
def images() -> FakeImages:
    return FakeImages()


@pytest.fixture
def harness(harness_factory: HarnessFactory, images: FakeImages) -> Harness:
    return harness_factory(images=images)


def rpc_error(call: Callable[[], Any]) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value


def trailer(call: Any, key: str) -> str | None:
    return next((value for name, value in call.trailing_metadata() or () if name == key), None)


# --- Submit -----------------------------------------------------------------------------------------------------


def test_submit_maps_the_fields_and_passes_options_through(harness: Harness, images: FakeImages) -> None:
    request = pb.ImageRequest(
        prompt="a red fox in snow",
        negative_prompt="blur",
        width=1280,
        height=720,
        options_json='{"seed": 7, "duration": 5, "aspect_ratio": "16:9", "extra": {"motion": [1, 2]}}',
    )

    task = harness.images.Submit(request, metadata=AUTH)

    (call,) = images.submits
    assert call.request.model_dump(exclude_none=True) == {
        "prompt": "a red fox in snow",
        "negative_prompt": "blur",
        "width": 1280,
        "height": 720,
        "seed": 7,
        "duration": 5,
        "aspect_ratio": "16:9",
        "extra": {"motion": [1, 2]},
    }
    assert call.request.model_extra == {"seed": 7, "duration": 5, "aspect_ratio": "16:9", "extra": {"motion": [1, 2]}}
    assert (task.id, task.status) == ("task_1", "pending")


def test_submit_leaves_unset_fields_unset(harness: Harness, images: FakeImages) -> None:
    harness.images.Submit(pb.ImageRequest(prompt="a fox", size="1280x720"), metadata=AUTH)

    (call,) = images.submits
    assert call.request == ImageGenerationRequest(prompt="a fox", size="1280x720")
    assert (call.request.negative_prompt, call.request.width, call.request.height) == (None, None, None)
    assert call.request.model_extra == {}
    assert call.idempotency_key is None


def test_submit_passes_the_idempotency_key_and_the_caller(harness: Harness, images: FakeImages) -> None:
    harness.images.Submit(pb.ImageRequest(prompt="a fox", idempotency_key="order-42"), metadata=AUTH)

    (call,) = images.submits
    assert (call.idempotency_key, call.caller) == ("order-42", API_KEY)  # the key, as REST scopes it


def test_without_configured_keys_the_caller_is_empty(harness_factory: HarnessFactory, images: FakeImages) -> None:
    harness = harness_factory(keys=(), images=images)

    harness.images.Submit(pb.ImageRequest(prompt="a fox", idempotency_key="order-42"))

    assert images.submits[0].caller == ""


def test_a_repeated_key_answers_the_earlier_task_marked_as_replayed(harness: Harness) -> None:
    request = pb.ImageRequest(prompt="a fox", idempotency_key="order-42")

    first, first_call = harness.images.Submit.with_call(request, metadata=AUTH)
    again, again_call = harness.images.Submit.with_call(request, metadata=AUTH)

    assert again.id == first.id
    assert trailer(first_call, "idempotent-replayed") is None
    assert trailer(again_call, "idempotent-replayed") == "true"


def test_a_repeated_key_with_another_request_fails_its_precondition(harness: Harness) -> None:
    harness.images.Submit(pb.ImageRequest(prompt="a fox", idempotency_key="order-42"), metadata=AUTH)

    error = rpc_error(
        lambda: harness.images.Submit(pb.ImageRequest(prompt="a cat", idempotency_key="order-42"), metadata=AUTH)
    )

    assert (error.code(), error.details()) == (
        grpc.StatusCode.FAILED_PRECONDITION,
        "Idempotency-Key was already used for a different request",
    )


@pytest.mark.parametrize(
    ("request_", "details"),
    [
        (pb.ImageRequest(), "prompt: String should have at least 1 character"),
        (pb.ImageRequest(prompt="x", width=100, height=720), "width: Input should be greater than or equal to 256"),
        (pb.ImageRequest(prompt="x", width=0, height=720), "width: Input should be greater than or equal to 256"),
        (pb.ImageRequest(prompt="x", size="big"), "size: String should match pattern '^\\d{1,5}x\\d{1,5}$'"),
        (pb.ImageRequest(prompt="x", options_json="[1, 2]"), "options_json: expected a JSON object, got array"),
        (pb.ImageRequest(prompt="x", options_json='"seed"'), "options_json: expected a JSON object, got string"),
        (
            pb.ImageRequest(prompt="x", options_json='{"seed": 7'),
            "options_json: expected a JSON object, got invalid JSON "
            "(Expecting ',' delimiter: line 1 column 11 (char 10))",
        ),
        (
            pb.ImageRequest(prompt="x", options_json='{"width": 512, "prompt": "y", "seed": 1}'),
            "options_json: prompt, width must be given as ImageRequest fields, not options",
        ),
        (
            pb.ImageRequest(prompt="x", idempotency_key="k" * 256),
            "idempotency_key has 256 characters; at most 255 are accepted",
        ),
    ],
    ids=[
        "no-prompt",
        "narrow",
        "explicit-zero",
        "bad-size",
        "options-array",
        "options-string",
        "options-not-json",
        "options-repeat-fields",
        "long-key",
    ],
)
def test_invalid_requests_are_invalid_argument_with_the_reason(
    harness: Harness, images: FakeImages, request_: pb.ImageRequest, details: str
) -> None:
    error = rpc_error(lambda: harness.images.Submit(request_, metadata=AUTH))

    assert (error.code(), error.details()) == (grpc.StatusCode.INVALID_ARGUMENT, details)
    assert images.submits == []


# --- the task as REST shows it ----------------------------------------------------------------------------------


def test_a_completed_task_carries_what_rest_shows(harness: Harness, images: FakeImages) -> None:
    images.tasks[COMPLETED.id] = COMPLETED
    rest = public_task(COMPLETED)

    task = harness.images.GetTask(pb.TaskRequest(task_id=COMPLETED.id), metadata=AUTH)

    assert (task.id, task.status, task.created_at, task.updated_at) == ("task_1", "completed", 1000, 1010)
    assert (task.completed_at, task.expires_at) == (rest.completed_at, rest.expires_at) == (1010, 87410)
    assert list(task.urls) == rest.urls == ["https://files.example/out.mp4"]
    assert json.loads(task.result_json) == RESULT
    assert task.result_json == json.dumps(RESULT, ensure_ascii=False, separators=(",", ":"))
    assert (task.error_code, task.error_message) == ("", "")


def test_a_pending_task_leaves_the_end_fields_unset(harness: Harness, images: FakeImages) -> None:
    images.tasks["task_1"] = make_task()

    task = harness.images.GetTask(pb.TaskRequest(task_id="task_1"), metadata=AUTH)

    assert task.status == "pending"
    assert not task.HasField("completed_at")
    assert not task.HasField("expires_at")
    assert (list(task.urls), task.result_json, task.error_code) == ([], "", "")


def test_a_failed_task_carries_its_error(harness: Harness, images: FakeImages) -> None:
    images.tasks[FAILED.id] = FAILED

    task = harness.images.GetTask(pb.TaskRequest(task_id=FAILED.id), metadata=AUTH)

    assert (task.status, task.error_code, task.error_message) == (
        "failed",
        "upstream_error",
        "the model ran out of memory",
    )
    assert task.HasField("completed_at")


# --- CancelTask -------------------------------------------------------------------------------------------------


def test_cancel_answers_the_cancelled_task(harness: Harness, images: FakeImages) -> None:
    images.tasks["task_1"] = make_task(state=TaskState.PROCESSING)

    task = harness.images.CancelTask(pb.TaskRequest(task_id="task_1"), metadata=AUTH)

    assert (task.status, task.error_code, task.error_message) == ("cancelled", "cancelled", "cancelled by the client")


def test_cancelling_a_finished_task_fails_its_precondition(harness: Harness, images: FakeImages) -> None:
    images.tasks[COMPLETED.id] = COMPLETED

    error = rpc_error(lambda: harness.images.CancelTask(pb.TaskRequest(task_id=COMPLETED.id), metadata=AUTH))

    assert (error.code(), error.details()) == (
        grpc.StatusCode.FAILED_PRECONDITION,
        "task task_1 has already completed; it can no longer be cancelled",
    )


# --- WatchTask --------------------------------------------------------------------------------------------------


def test_watch_streams_every_change_and_ends_after_the_final_state(harness: Harness, images: FakeImages) -> None:
    pending = make_task()
    processing = dataclasses.replace(pending, state=TaskState.PROCESSING, updated_at=1003.0)
    images.tasks["task_1"] = COMPLETED
    images.histories["task_1"] = [pending, processing, COMPLETED]

    responses = harness.images.WatchTask(pb.TaskRequest(task_id="task_1"), metadata=AUTH)
    tasks = list(responses)

    assert [task.status for task in tasks] == ["pending", "processing", "completed"]
    assert [task.updated_at for task in tasks] == [1000, 1003, 1010]
    assert list(tasks[-1].urls) == ["https://files.example/out.mp4"]
    assert responses.code() == grpc.StatusCode.OK
    assert images.closed_watches == ["task_1"]


def test_cancelling_the_watch_closes_it_on_the_server(harness: Harness, images: FakeImages) -> None:
    images.tasks["task_1"] = make_task()
    images.hold_open.add("task_1")

    responses = harness.images.WatchTask(pb.TaskRequest(task_id="task_1"), metadata=AUTH)
    first = next(responses)
    responses.cancel()

    assert first.status == "pending"
    wait_until(lambda: images.closed_watches == ["task_1"], 5)


def test_a_watch_holds_a_watcher_permit_until_it_ends(harness_factory: HarnessFactory, images: FakeImages) -> None:
    watchers = watcher_limit(1)
    harness = harness_factory(images=images, watchers=watchers)
    images.tasks["task_1"] = make_task()
    images.hold_open.add("task_1")
    responses = harness.images.WatchTask(pb.TaskRequest(task_id="task_1"), metadata=AUTH)
    next(responses)
    assert watchers.count == 1
    refused = rpc_error(lambda: list(harness.images.WatchTask(pb.TaskRequest(task_id="task_1"), metadata=AUTH)))
    assert refused.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "1 task watchers" in refused.details()
    responses.cancel()
    wait_until(lambda: watchers.count == 0, 5)


# --- errors and authentication ----------------------------------------------------------------------------------


def unknown_task(harness: Harness, method: str) -> Callable[[], Any]:
    request = pb.TaskRequest(task_id="task_missing")
    if method == "WatchTask":
        return lambda: list(harness.images.WatchTask(request, metadata=AUTH))
    return lambda: getattr(harness.images, method)(request, metadata=AUTH)


@pytest.mark.parametrize("method", ["GetTask", "CancelTask", "WatchTask"])
def test_an_unknown_task_is_not_found(harness: Harness, method: str) -> None:
    error = rpc_error(unknown_task(harness, method))

    assert (error.code(), error.details()) == (
        grpc.StatusCode.NOT_FOUND,
        "task 'task_missing' not found (unknown, or expired after its retention)",
    )


CALLS: dict[str, Callable[[Harness, Any], Any]] = {
    "Submit": lambda h, metadata: h.images.Submit(pb.ImageRequest(prompt="a fox"), metadata=metadata),
    "GetTask": lambda h, metadata: h.images.GetTask(pb.TaskRequest(task_id="task_1"), metadata=metadata),
    "CancelTask": lambda h, metadata: h.images.CancelTask(pb.TaskRequest(task_id="task_1"), metadata=metadata),
    "WatchTask": lambda h, metadata: list(h.images.WatchTask(pb.TaskRequest(task_id="task_1"), metadata=metadata)),
}


@pytest.mark.parametrize("method", list(CALLS))
@pytest.mark.parametrize("metadata", [(), (("authorization", "Bearer wrong-key"),)], ids=["missing", "wrong"])
def test_every_method_needs_the_api_key(harness: Harness, images: FakeImages, method: str, metadata: Any) -> None:
    images.tasks["task_1"] = make_task()

    error = rpc_error(lambda: CALLS[method](harness, metadata))

    assert error.code() == grpc.StatusCode.UNAUTHENTICATED
    assert images.submits == []
    assert images.tasks["task_1"].state == TaskState.PENDING
    assert images.closed_watches == []


# --- health and reflection --------------------------------------------------------------------------------------


def reflected_services(harness: Harness) -> set[str]:
    stub = reflection_pb2_grpc.ServerReflectionStub(harness.channel)
    (response,) = stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]))
    return {service.name for service in response.list_services_response.service}


def test_reflection_and_health_list_the_images_service(harness: Harness) -> None:
    health = health_pb2_grpc.HealthStub(harness.channel)

    assert {"gateway.v1.Embeddings", "gateway.v1.Images"} <= reflected_services(harness)
    status = health.Check(health_pb2.HealthCheckRequest(service="gateway.v1.Images")).status
    assert status == health_pb2.HealthCheckResponse.SERVING


def test_without_an_image_backend_the_service_is_not_offered(harness_factory: HarnessFactory) -> None:
    harness = harness_factory()

    assert "gateway.v1.Images" not in reflected_services(harness)
    error = rpc_error(lambda: CALLS["GetTask"](harness, AUTH))
    assert error.code() == grpc.StatusCode.UNIMPLEMENTED
