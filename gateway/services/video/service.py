"""Video generation (text-to-video through fal) as asynchronous tasks: accept, read, watch, cancel, and take the
upstream's webhook. The public route keeps the OpenAI images shape (`/v1/images/generations`).

Accepting a request only writes the task to the store and queues it (`VideoSubmitter` submits it),
so the answer never waits for the upstream. Every state change goes through `TaskLedger.change`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import time
from collections.abc import AsyncGenerator, Mapping
from functools import partial
from typing import Any, Protocol

from gateway import metrics
from gateway.errors import ConflictError, InvalidRequestError
from gateway.protocol.unicode import require_unicode
from gateway.protocol.video import MAX_SIDE, MIN_SIDE, ImageGenerationRequest, TaskErrorObject, TaskObject
from gateway.services.video.ledger import TaskLedger
from gateway.services.video.reaper import VideoReaper
from gateway.services.video.submitter import VideoSubmitter
from gateway.tasks.base import TaskStoreError
from gateway.tasks.model import Task, TaskError, TaskState
from gateway.tasks.watch import resumed, watch
from gateway.upstreams.fal import KEY_ENV, VideoNotConfiguredError, result_urls, text_to_video_arguments
from gateway.upstreams.webhooks import WebhookRefusals, WebhookSignatureError, WebhookUrls

log = logging.getLogger(__name__)


__all__ = ["Task", "VideoService", "WebhookVerifier", "public_task"]  # Task: what the transports are handed


class WebhookVerifier(Protocol):
    async def verify(self, headers: Mapping[str, str], body: bytes) -> None: ...


class VideoService:
    def __init__(
        self,
        ledger: TaskLedger,
        submitter: VideoSubmitter,
        reaper: VideoReaper,
        verifier: WebhookVerifier,
        webhook_urls: WebhookUrls,
        *,
        configured: bool,
        task_timeout_seconds: float,
        max_prompt_chars: int,
    ) -> None:
        self._ledger = ledger
        self._submitter = submitter
        self._reaper = reaper
        self._verifier = verifier
        self._webhook_urls = webhook_urls
        self._refusals = WebhookRefusals()
        self._configured = configured
        self._timeout = task_timeout_seconds
        self._max_prompt_chars = max_prompt_chars

    async def submit(
        self, request: ImageGenerationRequest, *, idempotency_key: str | None = None, caller: str = ""
    ) -> tuple[Task, bool]:
        """Store a pending task and queue it; `(task, False)` when the idempotency key names an earlier one."""
        started = time.perf_counter()
        if not self._configured:
            raise VideoNotConfiguredError(f"video generation is not configured: set {KEY_ENV}")
        arguments = self._arguments(request)
        request_hash = _digest(json.dumps(request.model_dump(exclude_none=True), sort_keys=True))
        now = self._ledger.clock()
        task = Task(
            id=Task.new_id(),
            state=TaskState.PENDING,
            arguments=arguments,
            created_at=now,
            updated_at=now,
            deadline_at=now + self._timeout,
            # Scoped to the caller's credentials, so two clients cannot collide on (or probe) each other's keys.
            idempotency_key=_digest(f"{caller}\0{idempotency_key}") if idempotency_key else None,
            request_hash=request_hash,
        )
        leased_at = time.monotonic()
        stored, created = await self._ledger.create(task, self._submitter.submit_lease(task.id))
        if not created and stored.request_hash != request_hash:
            raise ConflictError(
                "Idempotency-Key was already used for a different request; use a new key for a new request",
                param="Idempotency-Key",
            )
        if created:
            self._submitter.enqueue_created(stored, leased_at)
        metrics.VIDEO_SUBMIT_LATENCY.observe(time.perf_counter() - started)
        return stored, created

    async def get(self, task_id: str) -> Task:
        return await self._ledger.get(task_id)

    async def cancel(self, task_id: str) -> Task:
        """Cancel a pending or processing task (again: no change); a finished one answers 409."""

        def decide(task: Task) -> Task | None:
            if task.state == TaskState.CANCELLED:
                return None
            if task.state.terminal:
                raise ConflictError(f"task {task_id} has already {task.state.value}; it can no longer be cancelled")
            return self._ledger.ended(
                task, TaskState.CANCELLED, error=TaskError("cancelled", "cancelled by the client")
            )

        task, changed = await self._ledger.change(task_id, decide)
        if changed:
            self._reaper.cancel_upstream(task)
        return task

    async def watch(self, task_id: str, after: int | None = None) -> AsyncGenerator[Task, None]:
        """The task now and at each visible change, ending with its final state; with `after` (a version the client
        saw), only the versions past it (a reconnect). Raises 404 up front."""
        changes = await watch(partial(self._ledger.get, task_id), partial(self._ledger.changes, task_id), _visible)
        return changes if after is None else resumed(changes, after)

    async def handle_callback(
        self, task_id: str, headers: Mapping[str, str], body: bytes, token: str, attempt: int | None = None
    ) -> Task:
        """Apply a verified webhook that came to the URL its job was submitted with (`token`, `attempt`).

        The token is checked first (local, constant time): a call without it causes no outbound call (no JWKS
        fetch) and no log line of its own. The job of an attempt whose submit answer was lost is adopted; a job
        the task does not track (an earlier attempt's) is cancelled. Duplicates and late copies change nothing."""
        try:
            self._webhook_urls.verify(task_id, token, attempt)
        except WebhookSignatureError:
            metrics.VIDEO_CALLBACKS.labels(result="bad_token").inc()
            self._refusals.refused()
            raise
        try:
            await self._verifier.verify(headers, body)
        except Exception as exc:
            _reject(task_id, exc)
            raise
        webhook = _webhook(body)
        request_id = {name.lower(): value for name, value in headers.items()}.get("x-fal-webhook-request-id", "")
        try:
            task = await self._ledger.get(task_id)
        except Exception:
            metrics.VIDEO_CALLBACKS.labels(result="unknown_task").inc()
            raise
        outcome = "duplicate"

        def decide(current: Task) -> Task | None:
            nonlocal outcome
            outcome = "duplicate"
            if current.upstream_request_id != request_id:
                if not _awaits(current, attempt):
                    outcome = "stale"  # a job this task does not track: an earlier attempt's, or a lost answer's
                    return None
                adopted = self._submitter.adopt(current, request_id)
                outcome = "adopted"
                new = self._applied(adopted, webhook) or adopted
                return dataclasses.replace(new, version=current.version + 1)  # one write: one version up
            if current.state.terminal:
                return None
            outcome = "applied"
            return self._applied(current, webhook)

        task, changed = await self._ledger.change(task_id, decide, known=task)
        metrics.VIDEO_CALLBACKS.labels(result=outcome if changed or outcome == "stale" else "duplicate").inc()
        if outcome == "stale" and request_id:
            self._reaper.cancel_orphan(task_id, request_id)
        return task

    def _applied(self, task: Task, webhook: dict[str, Any]) -> Task | None:
        """`task` (tracking the webhook's job) with the webhook's outcome."""
        if webhook["status"] == "OK":
            payload = webhook.get("payload")
            if not isinstance(payload, dict):
                # fal sends `"payload": null` (with `payload_error`) when it could not attach the output;
                # the output is still at the job's response URL: poll it now rather than end with nothing.
                return _poll_now(task, self._ledger.clock())
            return self._ledger.ended(task, TaskState.COMPLETED, result=payload, completed_by="callback")
        message = str(webhook.get("error") or "the upstream reported an error")
        return self._ledger.failed(task, "upstream_error", message, completed_by="callback")

    async def ready(self) -> bool:
        try:
            return await self._ledger.ping()
        except TaskStoreError:
            return False

    def _arguments(self, request: ImageGenerationRequest) -> dict[str, Any]:
        require_unicode(request.model_dump(exclude_none=True))
        for field in ("prompt", "negative_prompt"):
            text = getattr(request, field)
            if text is not None and len(text) > self._max_prompt_chars:
                raise InvalidRequestError(
                    f"{field} has {len(text)} characters; at most {self._max_prompt_chars} are accepted", param=field
                )
        if not request.prompt.strip():
            raise InvalidRequestError("prompt is empty", param="prompt")
        width, height = request.width, request.height
        if request.size is not None:
            if width is not None or height is not None:
                raise InvalidRequestError("give either size or width and height, not both", param="size")
            width, height = (int(side) for side in request.size.split("x"))
            for side in (width, height):
                if not MIN_SIDE <= side <= MAX_SIDE:
                    message = f"size {request.size}: each side must be {MIN_SIDE} to {MAX_SIDE} pixels"
                    raise InvalidRequestError(message, param="size")
        if (width is None) != (height is None):
            raise InvalidRequestError("width and height go together", param="width" if width is None else "height")
        return text_to_video_arguments(
            request.prompt,
            negative_prompt=request.negative_prompt,
            width=width,
            height=height,
            options=request.model_extra or {},
        )


def public_task(task: Task) -> TaskObject:
    """The client's view of a task (no upstream URLs, no bookkeeping)."""
    error = TaskErrorObject(code=task.error.code, message=task.error.message) if task.error else None
    return TaskObject(
        id=task.id,
        status=task.state.value,
        created_at=int(task.created_at),
        updated_at=int(task.updated_at),
        completed_at=int(task.ended_at) if task.ended_at is not None else None,
        expires_at=int(task.expires_at) if task.expires_at is not None else None,
        urls=result_urls(task.result) if task.result else [],
        result=task.result,
        error=error,
    )


def _reject(task_id: str, error: Exception) -> None:
    """Count and log a refused webhook, so that a misconfigured signing key or callback URL shows up in the
    logs and not only as tasks that finish late by polling. Only calls with the URL token get here (fal's,
    or someone who has the URL), so a line each cannot be used to fill the log. The reason is ours."""
    metrics.VIDEO_CALLBACKS.labels(result="rejected").inc()
    log.warning("webhook for task %s refused: %s", task_id, error)


def _visible(task: Task) -> dict[str, Any]:
    return public_task(task).model_dump(exclude={"updated_at"})  # poll bookkeeping is not a change to show


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def _awaits(task: Task, attempt: int | None) -> bool:
    """Whether `task` waits for the answer of submit `attempt` (None: a URL from before attempts were numbered),
    so that a webhook for that attempt names its job."""
    if task.state != TaskState.PENDING or task.upstream_request_id is not None:
        return False
    return attempt is None or (attempt == task.attempt and task.submitting_since is not None)


def _poll_now(task: Task, now: float) -> Task | None:
    """A submitted task, due for its next poll now; a task not yet recorded as submitted is left as it is
    (its submit records the job, and polling starts after the webhook's grace time)."""
    if task.state != TaskState.PROCESSING:
        return None
    return task.moved(TaskState.PROCESSING, now, poll_after=now)


def _webhook(body: bytes) -> dict[str, Any]:
    try:
        webhook = json.loads(body)
    except ValueError:
        raise InvalidRequestError("webhook body is not JSON") from None
    if not isinstance(webhook, dict) or webhook.get("status") not in ("OK", "ERROR"):
        raise InvalidRequestError('webhook body needs "status": "OK" or "ERROR"')
    return webhook
