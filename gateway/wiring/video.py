"""Video: the task store, the fal queue client and request history, the webhook verifier, the shared submit quota
and this replica's task runner, around the video service."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

from gateway.quota import QuotaConfig, build_limiter
from gateway.redis_client import RedisConnection
from gateway.services.video import VideoService
from gateway.services.video.ledger import TaskLedger
from gateway.services.video.runner import VideoTaskRunner
from gateway.services.video.steps import RunnerConfig
from gateway.settings import TaskStoreSettings, VideoSettings
from gateway.tasks.stores import build_task_store
from gateway.upstreams.fal import FalQueueClient
from gateway.upstreams.fal_history import FalRequestHistory
from gateway.upstreams.webhooks import FalWebhookVerifier, WebhookUrls
from gateway.wiring.shared import replica_name

log = logging.getLogger(__name__)

# The Redis keys of the submit quota keep their name from before 0.2 (`quota:{pika}:*`): see wiring.chat.
VIDEO_QUOTA_KEYS = "pika"


@asynccontextmanager
async def video_service(
    config: VideoSettings, tasks: TaskStoreSettings, public_url: str | None, redis: RedisConnection | None
) -> AsyncIterator[VideoService]:
    """Video tasks, with webhooks to `public_url` (None: polled from the start)."""
    owner = replica_name()
    async with AsyncExitStack() as stack:
        store = build_task_store(redis, tasks.sqlite_path)
        stack.push_async_callback(store.aclose)
        client = await stack.enter_async_context(
            FalQueueClient(
                config.base_url,
                config.api_key,
                config.model_path,
                connect_timeout_seconds=config.connect_timeout_seconds,
                read_timeout_seconds=config.read_timeout_seconds,
                user_agent=f"ai-gateway ({owner})",  # tells the upstream (and the tests) which replica calls
            )
        )
        history = None
        if config.platform_url:
            history = await stack.enter_async_context(
                FalRequestHistory(
                    config.platform_url,
                    config.api_key,
                    config.model_path,
                    timeout_seconds=config.platform_timeout_seconds,
                    user_agent=f"ai-gateway ({owner})",
                )
            )
        verifier = await stack.enter_async_context(
            FalWebhookVerifier(
                config.webhook_jwks_url,
                tolerance_seconds=config.webhook_tolerance_seconds,
                timeout_seconds=config.webhook_jwks_timeout_seconds,
            )
        )
        submits = QuotaConfig(
            requests_per_second=config.submits_per_second,
            max_concurrent=config.max_concurrent_submits,
            max_wait_seconds=config.read_timeout_seconds,
            lease_seconds=tasks.lease_seconds,
        )
        quota = build_limiter(submits, redis, name="video", key_name=VIDEO_QUOTA_KEYS)
        stack.push_async_callback(quota.aclose)
        if public_url is None:
            log.warning("GATEWAY_PUBLIC_URL is not set: video tasks get no webhooks and are polled from the start")
        webhook_urls = WebhookUrls(
            f"{public_url.rstrip('/')}/v1/callbacks/video" if public_url else None, config.api_key
        )
        runner_config = RunnerConfig(
            callback_grace_seconds=config.callback_grace_seconds,
            poll_initial_seconds=config.poll_initial_seconds,
            poll_max_seconds=config.poll_max_seconds,
            lease_seconds=tasks.lease_seconds,
            scan_interval_seconds=tasks.scan_interval_seconds,
            max_concurrent_submits=config.max_concurrent_submits,
            unknown_submit_wait_seconds=config.unknown_submit_wait_seconds if public_url or history else 0.0,
            lost_job_lookup_seconds=config.lost_job_lookup_seconds,
            submit_call_seconds=config.connect_timeout_seconds + config.read_timeout_seconds,
        )
        ledger = TaskLedger(store, retention_seconds=tasks.retention_seconds)
        runner = VideoTaskRunner(ledger, client, quota, webhook_urls, runner_config, owner=owner, history=history)
        await runner.start()  # also without a key: unfinished tasks still time out and expire
        stack.push_async_callback(runner.aclose)
        yield VideoService(
            ledger,
            runner.submitter,
            runner.reaper,
            verifier,
            webhook_urls,
            configured=client.configured,
            task_timeout_seconds=config.task_timeout_seconds,
            max_prompt_chars=config.max_prompt_chars,
        )
