"""Video generation as durable asynchronous tasks, around one `TaskLedger` (`ledger`): `service` accepts, reads,
watches and cancels them and takes the upstream's webhooks; `runner` is the background side, whose scanner hands
due tasks to the `submitter`, the `poller` and the `reaper` (`steps` runs one step per task at a time;
`lost_jobs` finds the job of a submit whose answer was lost)."""

from gateway.services.video.service import Task, VideoService, WebhookVerifier, public_task

__all__ = ["Task", "VideoService", "WebhookVerifier", "public_task"]
